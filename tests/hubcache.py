"""A Hugging Face Hub cache built by a test, in the Hub's own layout, so that the Hub code paths run offline.

`put_repo` writes `models--org--name/` (or `datasets--org--name/`) under a cache directory as `huggingface_hub`
does: each file's bytes once in `blobs/<sha256>`, `snapshots/<commit>/<path>` a relative symlink to its blob, and
`refs/<branch>` holding the commit. `offline_cache` points `HF_HUB_CACHE` at a fresh one with `HF_HUB_OFFLINE=1`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest


def put_repo(
    cache: Path,
    repo_id: str,
    commit: str,
    files: dict[str, bytes | Path],
    *,
    repo_type: str = "model",
    ref: str | None = "main",
) -> Path:
    """The snapshot directory of `repo_id` at `commit` holding `files` (path in the repo -> bytes or a file)."""
    assert len(commit) == 40, "a commit is 40 hex digits"
    root = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        data = content.read_bytes() if isinstance(content, Path) else content
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref:
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / ref).write_text(commit)
    return snapshot


def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty cache as the Hub cache, with downloads off."""
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache
