"""Atomic outputs get the modes the umask gives any file, not the private modes of their temporary files."""

import os
import stat

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
