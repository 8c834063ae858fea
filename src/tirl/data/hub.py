"""The reference recipe's data from the Hugging Face Hub: Open-AgentRL's SFT and RL files and its evaluation sets,
each fetched by name at a pinned revision and converted into tirl's SFT or RL rows (`tirl data prepare NAME`).

`HUB_SETS` is the table: a name, its dataset repository, the file in it, the revision, and the conversion. A file
is fetched with `huggingface_hub.hf_hub_download(repo_type="dataset")` into the Hub's cache (`tirl.core.hub`:
`HF_HUB_OFFLINE=1` reads the cache alone; a repository neither cached nor reachable is a `HubError` naming the
`hf download` command that fetches it), read with the readers of this package (every row validated: file, row
and column named), and written as rows the readers take back unchanged. `record` is the small JSON written beside
the output (`FILE.source.json`): repository, revision asked for, commit fetched, the fetched file's sha256 and
size, rows written, and the output's own sha256. A cached file that is not a regular file once its links are
followed (a link to a device such as /dev/zero) is refused before it is read.

The conversions keep the recipe's content and put it in one parquet shape whatever the source's nested types:
- SFT (`messages`, `tools`): tool-call arguments as the JSON strings of OpenAI's form and `tools` as a JSON string
  (the readers decode both), so no two rows need the same nested struct type;
- RL (the 30K file): `data_source`, `prompt`, `ability`, and `reward_model` / `extra_info` as JSON strings (as the
  recipe's LiveCodeBench file stores them), ground truths keeping their type; the prompts stay as in the file,
  since the recipe rewrites them when it reads them (`rl.prompt_rewrite: verl`, `tirl.data.recipe_prompts`);
- evaluation sets: the recipe's prompt wording (or `plain`) around each problem, as the benchmarks' tasks
  (`tirl.data.benchmarks`), ground truths normalized the same way (an AIME answer that is not an integer from 0
  to 999 is refused, naming its row).

Revisions: the SFT-3K and 30K repositories are pinned to the commits a published citation of their cards names
(not re-read here: the revisions are this module's assumption until a run with network confirms the file at
them); Open-AgentRL-Eval has no known commit and follows `main` (the commit fetched is recorded all the same).

Deliberately not here: the benchmarks tirl ships or reads from the user's file (`tirl.tasks.benchmarks`), model
repositories (`tirl.models.hub`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tirl.core.hub import commit_of, hub_call, regular_size
from tirl.data.benchmarks import aime_answer, benchmark_row, choice_prompt, math_prompt, prepare_livecodebench
from tirl.data.readers import iter_records, iter_rows
from tirl.data.schema import RowError

RECORD_SUFFIX = ".source.json"


@dataclass(frozen=True)
class HubFile:
    """One file of a dataset repository, and how its rows become tirl's (`convert(path, wording)`)."""

    repo_id: str
    filename: str
    revision: str
    kind: str  # "sft" or "rl": what the output holds
    convert: Callable[[Path, str], list[dict[str, Any]]]
    about: str


def _sft_row(row: dict[str, Any]) -> dict[str, Any]:
    messages = []
    for m in row["messages"]:
        if "tool_calls" in m:
            calls = [
                {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]
            m = {**m, "tool_calls": calls}
        messages.append(m)
    out: dict[str, Any] = {"messages": messages}
    if row.get("tools") is not None:
        out["tools"] = json.dumps(row["tools"], ensure_ascii=False)
    return out


def sft_rows(path: Path, wording: str) -> list[dict[str, Any]]:
    """Open-AgentRL-SFT-3K: `messages` and `tools` (verl's multi-turn SFT columns), validated row by row."""
    return [_sft_row(r) for r in iter_rows(path, kind="sft")]


def rl_rows(path: Path, wording: str) -> list[dict[str, Any]]:
    """Open-AgentRL-30K: verl's RL columns, validated row by row; prompts as in the file (module docstring)."""
    return [
        {
            "data_source": r["data_source"],
            "prompt": r["prompt"],
            "ability": r["ability"],
            "reward_model": json.dumps(r["reward_model"], ensure_ascii=False),
            "extra_info": json.dumps(r["extra_info"], ensure_ascii=False),
        }
        for r in iter_rows(path, kind="rl")
    ]


def _records(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, Any]]]:
    """The file's rows as dicts, each checked for `columns` (the first missing one names its row)."""
    out = []
    for n, rec in iter_records(path):
        if isinstance(rec, RowError):
            raise rec
        for c in columns:
            if rec.get(c) is None:
                raise RowError(str(path), n, c, f"missing (row has: {', '.join(sorted(rec))})")
        out.append((n, rec))
    if not out:
        raise ValueError(f"{path}: the file has no rows")
    return out


def _aime(source: str, problem: str, answer: str) -> Callable[[Path, str], list[dict[str, Any]]]:
    """An Open-AgentRL-Eval AIME file (`Problem`/`Answer` in 2024's, `problem`/`answer` in 2025's)."""

    def convert(path: Path, wording: str) -> list[dict[str, Any]]:
        rows = []
        for n, r in _records(path, (problem, answer)):
            try:
                truth = aime_answer(r[answer])
            except ValueError as e:  # kept, it would grade every answer wrong
                raise RowError(str(path), n, answer, str(e)) from None
            info = {"id": f"{source}-{n - 1}", "raw_answer": str(r[answer])}
            rows.append(benchmark_row(source, math_prompt(str(r[problem]), wording), "math", truth, info))
        return rows

    return convert


def gpqa_rows(path: Path, wording: str) -> list[dict[str, Any]]:
    """Open-AgentRL-Eval's GPQA-Diamond: `problem` (question and lettered options), `solution` (the letter),
    `domain`; the options are as the file orders them (the GPQA CSV route shuffles them itself)."""
    rows = []
    for n, r in _records(path, ("problem", "solution")):
        domain = str(r.get("domain") or "science").strip()
        info = {"id": f"gpqa_diamond-{n - 1}", "domain": domain}
        prompt = choice_prompt(str(r["problem"]), domain, wording)
        rows.append(benchmark_row("gpqa_diamond", prompt, domain, str(r["solution"]).strip(), info))
    return rows


def lcb_rows(path: Path, wording: str) -> list[dict[str, Any]]:
    """Open-AgentRL-Eval's LiveCodeBench v6 (2025-02 to 2025-05), read as the user's copy is
    (`tirl.data.benchmarks.prepare_livecodebench`)."""
    return prepare_livecodebench(wording, path)


SFT_3K_COMMIT = "29f7c779329730068f425ef9995f50440ff9a3f2"
RL_30K_COMMIT = "660eca7324319cd69a57738228a5e8e336f3bb40"
EVAL_REPO, EVAL_REVISION = "Gen-Verse/Open-AgentRL-Eval", "main"  # no commit known: see the module docstring

HUB_SETS: dict[str, HubFile] = {
    "open-agentrl-sft-3k": HubFile(
        "Gen-Verse/Open-AgentRL-SFT-3K", "full_sft_3k_shuffled_v4.parquet", SFT_3K_COMMIT, "sft", sft_rows,
        "the recipe's 3K SFT trajectories (sft.data)",
    ),
    "open-agentrl-30k": HubFile(
        "Gen-Verse/Open-AgentRL-30K", "Open-AgentRL-30K.parquet", RL_30K_COMMIT, "rl", rl_rows,
        "the recipe's 30K RL problems (rl.data)",
    ),
    "open-agentrl-aime24": HubFile(
        EVAL_REPO, "aime2024/aime_2024_problems.parquet", EVAL_REVISION, "rl", _aime("aime2024", "Problem", "Answer"),
        "the recipe's AIME 2024 (30 problems)",
    ),
    "open-agentrl-aime25": HubFile(
        EVAL_REPO, "aime2025/aime_2025_problems.parquet", EVAL_REVISION, "rl", _aime("aime2025", "problem", "answer"),
        "the recipe's AIME 2025 (30 problems)",
    ),
    "open-agentrl-gpqa": HubFile(
        EVAL_REPO, "gpqa-diamond/gpqa_diamond.parquet", EVAL_REVISION, "rl", gpqa_rows,
        "the recipe's GPQA-Diamond (198 problems)",
    ),
    "open-agentrl-lcb-v6": HubFile(
        EVAL_REPO, "livecodebench-v6/lcb_v6_2502_2505.parquet", EVAL_REVISION, "rl", lcb_rows,
        "the recipe's LiveCodeBench v6, 2025-02 to 2025-05 (175 problems)",
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Fetched:
    """A file fetched into the Hub cache: where, at which commit, and its sha256."""

    path: Path
    commit: str
    sha256: str
    size: int


def sha256_of(path: Path, size: int | None = None) -> str:
    """The sha256 of the file at `path`: of its first `size` bytes where given (the size it was found with, so that
    a file that grows while it is read is not read without end)."""
    h = hashlib.sha256()
    left = -1 if size is None else size
    with open(path, "rb") as f:
        while left and (chunk := f.read(1 << 20 if left < 0 else min(1 << 20, left))):
            h.update(chunk)
            left = left - len(chunk) if left > 0 else left
    return h.hexdigest()


def fetch(name: str, revision: str | None = None) -> Fetched:
    """Set `name`'s file in the Hub cache (downloaded where allowed), at `revision` (default: the pinned one)."""
    from huggingface_hub import hf_hub_download

    spec = HUB_SETS[name]
    rev = revision or spec.revision
    local = hub_call(
        hf_hub_download, spec.repo_id, rev, repo_type="dataset", what=f"tirl data prepare {name}",
        files=spec.filename, filename=spec.filename,
    )  # fmt: skip
    path = Path(local)
    size = regular_size(path, f"tirl data prepare {name}")  # a link to /dev/zero would hash without end
    return Fetched(path, commit_of(path), sha256_of(path, size), size)


def prepare_hub(
    name: str, *, wording: str = "recipe", revision: str | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(rows, record) of the Hub set `name`: its file fetched and converted; the record is what `write_record`
    writes beside the output (the output's own hash is added there)."""
    if name not in HUB_SETS:
        raise ValueError(f"unknown Hub dataset {name!r}; valid: {', '.join(HUB_SETS)}")
    spec = HUB_SETS[name]
    got = fetch(name, revision)
    rows = spec.convert(got.path, wording)
    record = {
        "name": name, "repo_id": spec.repo_id, "repo_type": "dataset", "file": spec.filename,
        "revision": revision or spec.revision, "commit": got.commit, "sha256": got.sha256, "bytes": got.size,
        "rows": len(rows), "kind": spec.kind,
    }  # fmt: skip
    if spec.kind == "rl" and spec.convert is not rl_rows:
        record["wording"] = wording
    return rows, record


def record_path(out: str | Path) -> Path:
    return Path(f"{out}{RECORD_SUFFIX}")


def write_record(out: str | Path, record: dict[str, Any]) -> Path:
    """`record` with the output's sha256, as `OUT.source.json` beside the output `out`."""
    from tirl.core.io import atomic_write_json

    return atomic_write_json(
        record_path(out), {**record, "output": Path(out).name, "output_sha256": sha256_of(Path(out))}
    )
