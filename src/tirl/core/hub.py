"""The Hugging Face Hub as tirl uses it: its cache, offline mode, `org/name@revision` ids, and one error that says
what to do when a repository is neither cached nor reachable.

Models (`tirl.models.hub`) and datasets (`tirl.data.hub`) are fetched with `huggingface_hub` into its standard
cache (`HF_HUB_CACHE`, by default `~/.cache/huggingface/hub`, laid out as `models--org--name/` or
`datasets--org--name/` with `refs/<branch>` holding a commit, `snapshots/<commit>/` the files and `blobs/` their
contents), so what `hf download` or transformers fetched is found, and what tirl fetched is found by them.
`HF_HUB_OFFLINE=1` uses the cache alone. Both variables are read when a fetch is made, not when huggingface_hub
was first imported, so a test (or a caller) that sets them later is obeyed.

Deliberately not here: which files a model or a dataset needs (their own modules) and credentials
(`huggingface_hub` reads `HF_TOKEN` or the login of `hf auth login` itself).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tirl.core.errors import TirlError

T = TypeVar("T")
# the Hub's own rule for a repository id (huggingface_hub.utils.validate_repo_id): org/name, each part letters,
# digits, '-', '_', '.', not starting or ending with '-' or '.', no '--' or '..'
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_REPO_ID = re.compile(rf"{_PART}/{_PART}")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")
COMMIT = re.compile(r"[0-9a-f]{40}")
_TRUE = ("1", "on", "yes", "true")


class HubError(TirlError):
    """A Hub repository that is neither in the cache nor fetchable; the message names it and how to fetch it."""


def cache_dir() -> Path:
    """The Hub cache: `HF_HUB_CACHE` as set now, else huggingface_hub's own default (HF_HOME/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def offline() -> bool:
    """`HF_HUB_OFFLINE` as set now (huggingface_hub reads it once, at import)."""
    value = os.environ.get("HF_HUB_OFFLINE")
    if value is not None:
        return value.strip().lower() in _TRUE
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def parse_id(text: str) -> tuple[str, str | None] | None:
    """("org/name", revision or None) for `org/name` or `org/name@revision`; None for anything else (a path)."""
    repo, _, revision = text.partition("@")
    if not _REPO_ID.fullmatch(repo) or "--" in repo or ".." in repo:
        return None
    if "@" in text and not _REVISION.fullmatch(revision):
        return None
    return repo, revision or None


def commit_of(path: str | Path) -> str:
    """The commit of a file or directory inside a cached snapshot (`.../snapshots/<commit>/...`)."""
    parts = Path(path).parts
    if "snapshots" not in parts or parts.index("snapshots") + 1 >= len(parts):
        raise HubError(f"{path} is not inside a Hugging Face cache snapshot (snapshots/<commit>/)")
    return parts[parts.index("snapshots") + 1]


def regular_size(path: str | Path, what: str) -> int:
    """The size of the cached file `path`, which must be a regular file once its links are followed: a cache entry
    linked to a device (/dev/zero), a FIFO or a directory would make the next reader wait or read without end."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise HubError(
            f"{what}: the cached file {path} is not a regular file (it resolves to {os.path.realpath(path)}, a "
            f"device, FIFO or directory): remove it from the cache ({cache_dir()}) and fetch it again"
        )
    return st.st_size


def fetch_command(repo_id: str, revision: str | None, repo_type: str = "model", files: str = "") -> str:
    """The `hf download` command (huggingface_hub's CLI) that puts the repository into the cache."""
    kind = "" if repo_type == "model" else f" --repo-type {repo_type}"
    rev = f" --revision {revision}" if revision else ""
    return f"hf download {repo_id}{f' {files}' if files else ''}{kind}{rev}"


def _is(error: BaseException, *names: str) -> bool:
    """isinstance against huggingface_hub's error classes by name (older releases lack the newer ones)."""
    from huggingface_hub import errors

    return any(isinstance(error, cls) for n in names if isinstance(cls := getattr(errors, n, None), type))


def _why(error: BaseException, revision: str | None, repo_type: str) -> str:
    if _is(error, "RevisionNotFoundError"):
        return f"the Hub has no revision {revision!r} of it"
    if _is(error, "GatedRepoError"):
        return "it is gated: accept its terms on huggingface.co and log in (`hf auth login`, or HF_TOKEN)"
    if _is(error, "RepositoryNotFoundError"):
        return (
            f"the Hub has no {repo_type} repository of that name (or it is private: log in with "
            "`hf auth login`, or set HF_TOKEN)"
        )
    if _is(error, "RemoteEntryNotFoundError", "EntryNotFoundError") and not _is(
        error, "LocalEntryNotFoundError"
    ):
        return "the repository has no such file at that revision"
    if offline():
        return f"HF_HUB_OFFLINE is set and the cache ({cache_dir()}) does not hold it"
    if _is(error, "IncompleteSnapshotError"):
        return f"its cached copy is incomplete and the Hub could not be reached ({error})"
    cause = error.__cause__ or error  # huggingface_hub wraps the connection error it met
    return f"it is not in the cache ({cache_dir()}) and the Hub could not be reached ({type(cause).__name__}: {cause})"


def hub_call(
    fn: Callable[..., T],
    repo_id: str,
    revision: str | None,
    *,
    repo_type: str = "model",
    what: str,
    files: str = "",
    **kw: Any,
) -> T:
    """`fn(repo_id, revision=..., cache_dir=..., local_files_only=...)` (a huggingface_hub download function), its
    failures turned into a `HubError` naming `what` (e.g. "model.path 'org/name'") and the command that fetches
    the repository (`files`: the ones to name in it, default all)."""
    from huggingface_hub import errors

    try:
        return fn(
            repo_id,
            revision=revision,
            repo_type=repo_type,
            cache_dir=str(cache_dir()),
            local_files_only=offline(),
            **kw,
        )
    except (errors.HfHubHTTPError, errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled, OSError) as e:
        if isinstance(e, PermissionError | IsADirectoryError) or getattr(e, "errno", None) == 28:
            raise  # the file system's own errors: the CLI names the file (tirl.cli.OS_ERRORS)
        at = f" at revision {revision}" if revision else ""
        raise HubError(
            f"{what}: cannot get {repo_type} {repo_id}{at} from the Hugging Face Hub: {_why(e, revision, repo_type)}. "
            f"Fetch it on a machine with network into this cache with `{fetch_command(repo_id, revision, repo_type, files)}` "
            "(or run this once with network, HF_HUB_OFFLINE unset), or point to a local copy"
        ) from e
