"""Atomic outputs get the modes the umask gives any file, not the private modes of their temporary files."""

import os
import stat

import pytest

from tirl.io import atomic_dir, atomic_write_text


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
