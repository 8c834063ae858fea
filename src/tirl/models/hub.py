"""`model.path` as a Hugging Face Hub id: `org/name` or `org/name@revision` (a branch, a tag or a commit) resolved
into the Hub's cache, and the commit it resolved to.

A string that names an existing local path is always that path, exactly as before (a directory `Qwen/Qwen3-4B`
in the working directory wins over the Hub repository of that name). Anything else shaped like `org/name[@rev]`
is fetched with `huggingface_hub.snapshot_download`, only the files a model needs (`MODEL_FILES`: config,
generation config, tokenizer files, chat template, safetensors weights and their index; no `.bin`, `.gguf`, ONNX,
or files in sub-folders), into the standard cache (`tirl.core.hub`); with `HF_HUB_OFFLINE=1` the cache alone
answers. The result is the snapshot directory (`snapshots/<commit>/`), which every loader, `tirl export`,
`tirl plan` and the vLLM server use as a plain model directory, and the commit, which the stages record in the
run's identity and its `config.yaml` (`org/name@<commit>`), so a resumed or repeated run loads the same weights.
A snapshot file that is not a regular file once its links are followed (a link to /dev/zero) is refused before
any loader reads it.

Not here: loading the directory (`tirl.models.loading`), datasets (`tirl.data.hub`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tirl.core.hub import COMMIT, cache_dir, commit_of, hub_call, parse_id, regular_size

MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)
TOP_LEVEL_ONLY = ("*/*",)  # fnmatch's * crosses '/': without this, onnx/model.safetensors would match too


@dataclass(frozen=True)
class ResolvedModel:
    """Where `given` (a `model.path`) lives on disk; `repo_id` and `commit` are set for a Hub id only."""

    given: str
    path: Path
    repo_id: str = ""
    commit: str = ""

    @property
    def from_hub(self) -> bool:
        return bool(self.repo_id)

    @property
    def label(self) -> str:
        """What a run records as its model: `org/name@<commit>` for a Hub id (it resolves to the same snapshot
        every time, offline too), the path as given for a local directory."""
        return f"{self.repo_id}@{self.commit}" if self.repo_id else self.given


def is_hub_id(path: str | Path) -> bool:
    """True for a string shaped `org/name[@revision]` that names no existing local path."""
    return not Path(path).exists() and parse_id(str(path)) is not None


def resolve_model(path: str | Path, *, files: tuple[str, ...] = MODEL_FILES) -> ResolvedModel:
    """`path` itself when it exists locally (or is no Hub id: the loaders then say what is wrong with it), else the
    cached snapshot of the Hub id, fetched first where allowed; a `HubError` names the id and how to fetch it.

    `files`: the patterns to fetch (`tirl plan` asks for config.json alone)."""
    text = str(path)
    parsed = None if Path(text).exists() else parse_id(text)
    if parsed is None:
        return ResolvedModel(text, Path(text))
    repo_id, revision = parsed
    from huggingface_hub import snapshot_download

    folder = hub_call(
        snapshot_download, repo_id, revision, what=f"model.path {text!r} (no such local directory)",
        allow_patterns=list(files), ignore_patterns=list(TOP_LEVEL_ONLY),
    )  # fmt: skip
    commit = commit_of(folder)
    if not COMMIT.fullmatch(commit):
        raise ValueError(
            f"model.path {text!r}: the cache returned {folder}, not a snapshots/<commit>/ directory"
        )
    for entry in Path(folder).iterdir():  # a file linked to a device (/dev/zero) would hang a loader
        if not entry.is_dir() or entry.is_symlink():
            regular_size(entry, f"model.path {text!r}")
    return ResolvedModel(text, Path(folder), repo_id, commit)


def cached_file(path: str | Path, filename: str) -> Path | None:
    """`filename` of the Hub id `path` if the cache holds it, without any network call (for readers of a finished
    run's records, such as the trajectory viewer); None otherwise."""
    parsed = None if Path(path).exists() else parse_id(str(path))
    if parsed is None:
        return None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(parsed[0], filename, cache_dir=str(cache_dir()), revision=parsed[1])
    return Path(found) if isinstance(found, str) else None
