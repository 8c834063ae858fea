"""Atomic outputs get the modes the umask gives any file, not the private modes of their temporary files; what a
writer killed midway staged is removed by the next write to the same place, and nothing else is."""

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tirl.core.io import atomic_dir, atomic_write_text


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize(
    "mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700), (0o002, 0o664, 0o775)]
)
def test_files_and_directories_follow_the_umask(umask, tmp_path, mask, file_mode, dir_mode):
    umask(mask)
    atomic_write_text(tmp_path / "a.json", "{}")
    with atomic_dir(tmp_path / "ckpt") as stage:
        (stage / "w.bin").write_bytes(b"w")
    assert _mode(tmp_path / "a.json") == file_mode
    assert _mode(tmp_path / "ckpt") == dir_mode and _mode(tmp_path / "ckpt" / "w.bin") == file_mode


@pytest.mark.parametrize("mask, file_mode", [(0o022, 0o644), (0o002, 0o664)], ids=["umask022", "umask002"])
def test_files_a_library_writes_private_in_a_staged_directory_follow_the_umask(
    umask, tmp_path, mask, file_mode
):
    """safetensors writes its files 0600 whatever the umask; a checkpoint's weights are shared like its config."""
    import torch
    from safetensors.torch import save_file

    umask(mask)
    with atomic_dir(tmp_path / "ckpt") as stage:
        save_file({"w": torch.zeros(2)}, stage / "model.safetensors")
        (stage / "run.sh").write_text("#!/bin/sh\n")
        os.chmod(stage / "run.sh", 0o700)
    assert _mode(tmp_path / "ckpt" / "model.safetensors") == file_mode
    assert _mode(tmp_path / "ckpt" / "run.sh") == file_mode | 0o111 & ~mask  # an executable stays executable


def test_a_staged_directory_that_cannot_be_renamed_into_place_is_removed(tmp_path):
    (tmp_path / "out").symlink_to(tmp_path / "gone")  # a directory cannot replace a (dangling) link
    with pytest.raises(OSError):
        with atomic_dir(tmp_path / "out") as stage:
            (stage / "w.bin").write_bytes(b"w" * 4096)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no .out.*.tmp left behind


def test_check_output_path_names_what_is_in_the_way(tmp_path):
    from tirl.core.io import OutputPathError, check_output_path

    (tmp_path / "f").write_text("")
    (tmp_path / "l").symlink_to(tmp_path / "gone")
    with pytest.raises(
        OutputPathError, match=f"--out {tmp_path}/f/a/b: {tmp_path}/f is a file, not a directory"
    ):
        check_output_path(tmp_path / "f" / "a" / "b")
    with pytest.raises(
        OutputPathError, match=f"--out {tmp_path}/l is a symbolic link to {tmp_path}/gone, which"
    ):
        check_output_path(tmp_path / "l")
    for ok in (
        tmp_path / "new" / "deeper",
        tmp_path / "f",
        tmp_path,
    ):  # a file itself is for the caller to judge
        assert check_output_path(ok) == ok


SRC = Path(__file__).resolve().parents[1] / "src"
# a writer killed (SIGKILL) just before its rename, and one that stays alive while staging
_KILLED_FILE = (
    "import os, signal, sys\nfrom tirl.core import io\n"
    "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
    "io.atomic_write_text(sys.argv[1], 'half')\n"
)
_KILLED_DIR = (
    "import os, signal, sys\nfrom tirl.core import io\n"
    "with io.atomic_dir(sys.argv[1]) as stage:\n"
    " (stage / 'model.safetensors').write_bytes(b'w' * 4096)\n"
    " os.kill(os.getpid(), signal.SIGKILL)\n"
)
_LIVE_DIR = (
    "import sys\nfrom tirl.core import io\n"
    "with io.atomic_dir(sys.argv[1]) as stage:\n"
    " print('staged', flush=True)\n"
    " sys.stdin.read()\n"
)


def _run(code: str, path: Path, **kw):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.Popen([sys.executable, "-c", code, str(path)], env=env, text=True, **kw)


def _staged(directory: Path, name: str) -> list[str]:
    return sorted(
        p.name for p in directory.iterdir() if p.name.startswith(f".{name}.") and p.name.endswith(".tmp")
    )


def test_what_a_killed_write_staged_is_cleared_by_the_next_data_prepare_and_nothing_else(tmp_path):
    from tirl.cli import main

    out = tmp_path / "x.jsonl"
    killed = _run(_KILLED_FILE, out)
    assert killed.wait(timeout=60) == -signal.SIGKILL
    (left,) = _staged(tmp_path, "x.jsonl")
    other_host = f".x.jsonl.tirl-000000-{killed.pid}.abcd1234.tmp"  # its pid says nothing about this host's
    mine = [".x.jsonl.abcd1234.tmp", ".x.jsonl.notes.tmp", other_host]
    for name in mine:  # not a name tirl's staging gives here: never touched
        (tmp_path / name).write_text("mine")
    assert main(["data", "prepare", "aime24", "--out", str(out)]) == 0
    assert not (tmp_path / left).exists()
    assert _staged(tmp_path, "x.jsonl") == sorted(mine)


def test_a_live_writers_staging_is_kept_and_a_killed_ones_removed(tmp_path):
    from tirl.core.io import remove_stale_staging

    assert _run(_KILLED_DIR, tmp_path / "exp").wait(timeout=60) == -signal.SIGKILL
    (killed,) = _staged(tmp_path, "exp")
    live = _run(_LIVE_DIR, tmp_path / "exp", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert live.stdout.readline().strip() == "staged"
        (alive,) = [n for n in _staged(tmp_path, "exp") if n != killed]
        assert remove_stale_staging(tmp_path, "exp") == [killed]
        assert _staged(tmp_path, "exp") == [alive]
    finally:
        live.kill()
        live.wait(timeout=30)


def test_a_set_aside_copy_whose_replacement_never_arrived_is_put_back(tmp_path):
    from tirl.core.io import remove_stale_staging

    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "config.json").write_text("old")
    killed = (  # between atomic_dir's two renames: the old copy set aside, the new one not yet in place
        "import os, signal, sys\nfrom tirl.core import io\nreal, calls = os.replace, []\n"
        "def replace(a, b):\n calls.append(a)\n if len(calls) == 2: os.kill(os.getpid(), signal.SIGKILL)\n real(a, b)\n"
        "os.replace = replace\n"
        "with io.atomic_dir(sys.argv[1]) as stage:\n (stage / 'config.json').write_text('new')\n"
    )
    assert _run(killed, tmp_path / "exp").wait(timeout=60) == -signal.SIGKILL
    (stage,) = _staged(tmp_path, "exp")
    (tmp_path / ".exp.old").mkdir()  # a user's own: not a name tirl gives
    assert remove_stale_staging(tmp_path, "exp") == [stage]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".exp.old", "exp"]
    assert (tmp_path / "exp" / "config.json").read_text() == "old"
