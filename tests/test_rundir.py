"""Output directories: a mistyped --out is refused before anything is written, and two runs never share one."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tirl.cli import main
from tirl.core import rundir

SRC = Path(__file__).resolve().parents[1] / "src"


def test_out_is_new_empty_or_the_same_commands_earlier_run(tmp_path):
    rundir.check_out(tmp_path / "absent", "rl")
    (tmp_path / "empty").mkdir()
    rundir.check_out(tmp_path / "empty", "rl")
    with rundir.claim(tmp_path / "run", "rl"):
        (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    assert rundir.owner(tmp_path / "run") == "rl"
    rundir.check_out(tmp_path / "run", "rl")  # its own earlier run: resumed or redone
    with pytest.raises(rundir.RunDirError, match="is the output of tirl rl"):
        rundir.check_out(tmp_path / "run", "sft")


def test_a_foreign_directory_is_refused_naming_what_it_holds(tmp_path):
    (tmp_path / "keep.txt").write_text("k")
    with pytest.raises(rundir.RunDirError, match=r"not a tirl eval directory \(it holds keep.txt\)"):
        rundir.check_out(tmp_path, "eval")
    (tmp_path / "f").write_text("")
    with pytest.raises(rundir.RunDirError, match="is a file"):
        rundir.check_out(tmp_path / "f", "eval")


def test_eval_into_a_training_run_leaves_its_config_alone(tmp_path, capsys):
    run = tmp_path / "rl"
    with rundir.claim(run, "rl"):
        (run / "config.yaml").write_text("rl: {n: 8}\n")
    assert main(["eval", "model.path=/nowhere", "--out", str(run)]) == 2
    assert "is the output of tirl rl" in capsys.readouterr().err
    assert (run / "config.yaml").read_text() == "rl: {n: 8}\n"


def test_a_run_directory_in_use_is_refused_naming_the_holder(tmp_path):
    with rundir.claim(tmp_path, "rl"):
        with pytest.raises(rundir.RunDirError, match=f"in use by tirl rl \\(pid {os.getpid()} on "):
            with rundir.claim(tmp_path, "rl"):
                pass
    with rundir.claim(tmp_path, "rl"):  # released when the first run ended
        pass


def _holder(path: Path) -> subprocess.Popen:
    code = "import sys; from tirl.core.rundir import claim\nwith claim(sys.argv[1], 'rl'):\n print('held', flush=True); sys.stdin.read()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(SRC)},
    )  # fmt: skip
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_another_process_holds_the_lock_until_it_is_killed(tmp_path, capsys):
    proc = _holder(tmp_path)
    try:
        with pytest.raises(rundir.RunDirError, match=f"pid {proc.pid} on"):
            with rundir.claim(tmp_path, "rl"):
                pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert json.loads((tmp_path / rundir.LOCK).read_text())["pid"] == proc.pid  # left behind by the kill
    with rundir.claim(tmp_path, "rl"):  # stale: its holder is gone
        assert json.loads((tmp_path / rundir.LOCK).read_text())["pid"] == os.getpid()
    assert f"left by pid {proc.pid}" in capsys.readouterr().out


def test_non_zero_ranks_leave_checking_and_locking_to_rank_0(tmp_path, monkeypatch):
    (tmp_path / "x").write_text("")
    monkeypatch.setenv("RANK", "1")
    with rundir.claim(tmp_path, "rl"):
        assert not (tmp_path / rundir.LOCK).exists()


def test_version(capsys):
    import tirl

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"tirl {tirl.__version__}"


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "out_dir={out}"],
        ["sft", "model.path=/nowhere", "--out", "{out}"],
        ["rl", "model.path=/nowhere", "--out", "{out}"],
        ["eval", "model.path=/nowhere", "--out", "{out}"],
        ["analyze", "a", "b", "--out", "{out}"],
        ["model", "import", "x.gguf", "--out", "{out}"],
    ],
    ids=lambda a: a[0] if a[0] != "model" else "model-import",
)
def test_every_command_refuses_a_foreign_out_before_writing(tmp_path, capsys, argv):
    (tmp_path / "thesis.tex").write_text("t")
    assert main([a.format(out=tmp_path) for a in argv]) == 2
    assert "(it holds thesis.tex)" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["thesis.tex"]


def test_a_second_run_on_a_directory_in_use_names_the_first(tmp_path, capsys):
    proc = _holder(tmp_path)
    try:
        assert main(["rl", "model.path=/nowhere", "--out", str(tmp_path)]) == 2
        assert f"in use by tirl rl (pid {proc.pid} on" in capsys.readouterr().err
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def test_unmarked_demo_and_eval_directories_are_recognised_and_training_runs_get_a_hint(tmp_path):
    demo, ev, rl = tmp_path / "demo", tmp_path / "eval", tmp_path / "rl"
    for d, f in ((demo, "data/sft.jsonl"), (ev, "records.jsonl"), (rl, "metrics.jsonl")):
        (d / f).parent.mkdir(parents=True)
        (d / f).write_text("")
        (d / "config.yaml").write_text("")
    with rundir.claim(demo, "demo"):
        pass
    assert rundir.owner(demo) == "demo"
    rundir.check_out(ev, "eval")
    with pytest.raises(rundir.RunDirError, match="is the output of tirl demo"):
        rundir.check_out(demo, "eval")
    with pytest.raises(rundir.RunDirError, match=r"""mark it with `echo '\{"command": "rl"\}' >"""):
        rundir.check_out(rl, "rl")


OUT_COMMANDS = [
    ["demo", "out_dir={out}"],
    ["sft", "model.path=/nowhere", "--out", "{out}"],
    ["rl", "model.path=/nowhere", "--out", "{out}"],
    ["eval", "model.path=/nowhere", "--out", "{out}"],
    ["analyze", "a", "b", "--out", "{out}"],
    ["model", "import", "x.gguf", "--out", "{out}"],
    ["export", "/nowhere", "--out", "{out}"],
    ["data", "prepare", "aime24", "--out", "{out}"],
]


@pytest.mark.parametrize(
    "argv", OUT_COMMANDS, ids=lambda a: "-".join(a[:2]) if a[0] in ("model", "data") else a[0]
)
@pytest.mark.parametrize("kind", ["dangling-link", "parent-is-a-file", "parent-is-a-dangling-link"])
def test_every_command_names_an_out_it_cannot_write_through(tmp_path, capsys, argv, kind):
    if kind == "dangling-link":
        (tmp_path / "link.jsonl").symlink_to(tmp_path / "gone")
        out, said = (
            tmp_path / "link.jsonl",
            f"is a symbolic link to {tmp_path / 'gone'}, which does not exist",
        )
    elif kind == "parent-is-a-file":
        (tmp_path / "afile").write_text("a")
        out, said = tmp_path / "afile" / "sub" / "o.jsonl", f"{tmp_path / 'afile'} is a file, not a directory"
    else:
        (tmp_path / "dir").symlink_to(tmp_path / "gone")
        out, said = (
            tmp_path / "dir" / "o.jsonl",
            f"{tmp_path / 'dir'} is a symbolic link to {tmp_path / 'gone'}",
        )
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main([a.format(out=out) for a in argv]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, no temporary left


@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_a_lock_file_linked_to_a_users_file_is_refused_and_the_file_kept(tmp_path, capsys, link):
    precious = tmp_path / "precious.txt"
    precious.write_text("my thesis\n")
    out = tmp_path / "run"
    out.mkdir()
    if link == "symbolic":
        (out / rundir.LOCK).symlink_to(precious)
        said = f"{out / rundir.LOCK} is a symbolic link to {precious}: tirl writes its lock only into a file of its own"
    else:
        os.link(precious, out / rundir.LOCK)
        said = f"{out / rundir.LOCK} has 2 hard links: tirl writes its lock only into a file of its own"
    assert main(["rl", "model.path=/nowhere", "--out", str(out)]) == 2
    assert said in capsys.readouterr().err
    assert precious.read_text() == "my thesis\n"


def test_a_marker_that_is_a_symbolic_link_is_refused(tmp_path):
    theirs = tmp_path / "theirs.json"
    theirs.write_text('{"command": "rl"}\n')
    out = tmp_path / "run"
    out.mkdir()
    (out / rundir.MARKER).symlink_to(theirs)
    with pytest.raises(rundir.RunDirError, match=f"{out / rundir.MARKER} is a symbolic link to {theirs}"):
        rundir.check_out(out, "rl")
    assert theirs.read_text() == '{"command": "rl"}\n'


def test_what_a_killed_writer_staged_in_a_run_directory_is_cleared_by_the_next_run(tmp_path):
    code = (
        "import os, signal, sys\nfrom tirl.core import io, rundir\n"
        "with rundir.claim(sys.argv[1], 'eval'):\n"
        " os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # killed just before the rename\n"
        " io.atomic_write_text(os.path.join(sys.argv[1], 'records.jsonl'), 'half')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    assert subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env).returncode == -signal.SIGKILL
    (left,) = [p.name for p in tmp_path.iterdir() if p.name.startswith(".records.jsonl.")]
    with rundir.claim(tmp_path, "eval"):
        assert not (tmp_path / left).exists()
