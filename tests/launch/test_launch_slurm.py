"""`tirl launch slurm` from the command line: the two files (0755, `bash -n`, shellcheck when installed), the
`#SBATCH` header, the run directory it prepares (a `tirl rl --out` there is still accepted), the model taken from
the config, and every bad argument refused with exit 2 and a message naming it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tirl.cli import main
from tirl.core.rundir import check_out


def launch(*argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `tirl launch slurm ARGV`, in this process."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["launch", "slurm", *argv])
        except SystemExit as e:  # argparse's own errors
            code = int(e.code or 0)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def paths(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "out", tmp_path / "run's dir"


def rendered(out: Path) -> tuple[str, str]:
    return (out / "tirl.sbatch").read_text(), (out / "tirl-node.sh").read_text()


def test_writes_two_executable_scripts_that_parse(paths) -> None:
    out, run = paths
    code, stdout, err = launch("--out", str(out), "--run-dir", str(run), "--model", "m", "--train-nodes", "2")
    assert code == 0, err
    assert "sbatch " in stdout and "node 0: train, node 1: train, node 2: vllm, node 3: sandbox" in stdout
    for name in ("tirl.sbatch", "tirl-node.sh"):
        assert (out / name).stat().st_mode & 0o777 == 0o755
        assert subprocess.run(["bash", "-n", str(out / name)], capture_output=True).returncode == 0


@pytest.mark.skipif(
    shutil.which("shellcheck") is None, reason="shellcheck is not installed (apt-get install shellcheck)"
)
@pytest.mark.parametrize(
    "extra",
    [[], ["--no-sandbox-node", "--gpus-per-node", "8", "--servers-per-node", "4"], ["--stage", "sft"]],
    ids=["rl", "rl-gpus-shared-node", "sft"],
)
def test_shellcheck_finds_nothing(paths, extra: list[str]) -> None:
    out, run = paths
    assert launch("--out", str(out), "--run-dir", str(run), "--model", "m x", *extra)[0] == 0
    result = subprocess.run(["shellcheck", str(out / "tirl.sbatch"), str(out / "tirl-node.sh")], capture_output=True,
                            text=True)  # fmt: skip
    assert result.returncode == 0, result.stdout


def test_the_header_asks_for_the_layout(paths) -> None:
    out, run = paths
    argv = ["--out", str(out), "--run-dir", str(run), "--model", "m", "--train-nodes", "2", "--vllm-nodes", "3",
            "--gpus-per-node", "8", "--partition", "gpu", "--account", "proj", "--time", "2-00:00:00"]  # fmt: skip
    assert launch(*argv)[0] == 0
    header = [line for line in rendered(out)[0].splitlines() if line.startswith("#SBATCH")]
    assert header == [
        "#SBATCH --job-name=tirl", "#SBATCH --nodes=6", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu", "#SBATCH --account=proj", "#SBATCH --time=2-00:00:00", "#SBATCH --requeue",
        "#SBATCH --open-mode=append", f'#SBATCH "--output={run}/slurm-%j.out"', "#SBATCH --signal=B:USR1@300",
    ]  # fmt: skip


def test_cpu_only_and_without_a_sandbox_node(paths) -> None:
    out, run = paths
    assert launch("--out", str(out), "--run-dir", str(run), "--model", "m", "--no-sandbox-node")[0] == 0
    sbatch, node = rendered(out)
    assert "#SBATCH --nodes=2" in sbatch and "--gpus-per-node" not in sbatch
    assert "SANDBOX_NODE=1" in sbatch  # the vLLM node's address
    assert "CUDA_VISIBLE_DEVICES" not in node
    assert re.search(r"^elif \(\( NODE_ID == 1 \)\); then vllm_sandbox$", node, re.M)


def test_the_run_directory_is_prepared_and_still_takes_the_run(paths) -> None:
    out, run = paths
    assert launch("--out", str(out), "--run-dir", str(run), "--model", "m")[0] == 0
    assert (run / ".launch").stat().st_mode & 0o777 == 0o700
    (run / "slurm-12.out").write_text("log\n")  # what Slurm writes there before tirl starts
    check_out(run, "rl")  # tirl rl --out RUN accepts it: marked as an rl run
    with pytest.raises(Exception, match="tirl rl"):
        check_out(run, "sft")


def test_a_foreign_run_directory_is_refused(paths) -> None:
    out, run = paths
    run.mkdir()
    (run / "notes.txt").write_text("mine\n")
    code, _, err = launch("--out", str(out), "--run-dir", str(run), "--model", "m")
    assert code == 2 and "notes.txt" in err
    assert not out.exists()


def test_the_model_defaults_to_model_path_of_the_config_or_overrides(paths, tmp_path: Path) -> None:
    out, run = paths
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("model:\n  path: /models/from-config\n")
    assert launch("--out", str(out), "--run-dir", str(run), "--config", str(cfg))[0] == 0
    assert "serve-vllm /models/from-config " in rendered(out)[1]
    assert (
        launch("--out", str(out), "--run-dir", str(run), "--config", str(cfg), "--", "model.path=/o")[0] == 0
    )
    assert "serve-vllm /o " in rendered(out)[1]


BAD = [
    (["--train-nodes", "0"], "--train-nodes must be >= 1, got 0"),
    (["--vllm-nodes", "0"], "--vllm-nodes must be >= 1 for --stage rl"),
    (["--stage", "sft", "--vllm-nodes", "1"], "--vllm-nodes 1 with --stage sft"),
    (["--stage", "sft", "--sandbox-node"], "--sandbox-node with --stage sft"),
    (["--vllm-port", "0"], "--vllm-port must be a port, 1-65535, got 0"),
    (["--sandbox-port", "70000"], "--sandbox-port must be a port, 1-65535, got 70000"),
    (
        ["--servers-per-node", "2", "--sandbox-port", "8001"],
        "--sandbox-port 8001 collides with the vLLM servers' ports (8000-8001)",
    ),
    (["--rdzv-port", "8000"], "--rdzv-port 8000 collides with the vLLM servers' ports (8000)"),
    (["--rdzv-port", "8080"], "--sandbox-port and --rdzv-port are both 8080"),
    (["--vllm-port", "65535", "--servers-per-node", "2"], "runs past port 65535"),
    (["--gpus-per-node", "3", "--servers-per-node", "2"], "--gpus-per-node 3 does not split evenly"),
    (["--gpus-per-node", "-1"], "--gpus-per-node must be >= 0"),
    (["--time", "forever"], "--time 'forever' is not a Slurm time limit"),
    (["--partition", "a b"], "--partition 'a b' is not a Slurm name"),
    (["--name", "Big_Name"], "--name 'Big_Name' must be 1-30 lower-case letters"),
    (["--config", "/nonexistent/cfg.yaml"], "--config /nonexistent/cfg.yaml: no such file"),
    (["--", "rl.steps"], "override 'rl.steps' must have the form dotted.key=value"),
    (
        ["--", "rollout.urls=[http://x:1]"],
        "override 'rollout.urls=[http://x:1]': the launch sets rollout.urls",
    ),
    (["--", "rl.note=a\nb"], "holds a control character"),
    (["--notice-s", "1"], "--notice-s must be 10-86400 seconds"),
]


@pytest.mark.parametrize("extra, message", BAD, ids=[m.split()[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_a_bad_argument_exits_2_naming_it(paths, extra: list[str], message: str) -> None:
    out, run = paths
    code, _, err = launch("--out", str(out), "--run-dir", str(run), "--model", "m", *extra)
    assert code == 2
    assert message in err
    assert not out.exists()


@pytest.mark.parametrize(
    "run_dir, message",
    [("runs/x", "must be an absolute path"), ("/", "must be an absolute path below /"),
     ('/tmp/a"b', 'holds a " or a \\')],
)  # fmt: skip
def test_a_bad_run_directory_exits_2(tmp_path: Path, run_dir: str, message: str) -> None:
    code, _, err = launch("--out", str(tmp_path / "out"), "--run-dir", run_dir, "--model", "m")
    assert code == 2 and message in err


def test_rl_needs_a_model(paths) -> None:
    out, run = paths
    code, _, err = launch("--out", str(out), "--run-dir", str(run))
    assert code == 2 and "--model is required for --stage rl" in err
