"""tirl-node.sh run by hand, one "node" at a time, with a fake `$PY` that records its argv: the exact command line of
every role, the addresses each binds, the GPU share of each vLLM server, and when the servers stop (once every
train node has finished; at once, with its code, when a server dies first). The run directory holds a space, a
`'`, `: ` and ` #`, so the quoting of every value is exercised, the YAML-quoted token path included."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from launch_fakes import calls, env_of, fake_python, loopback_hosts

from tirl.launch.layout import Layout
from tirl.launch.slurm import render_node

HOSTS = loopback_hosts(4)  # 0, 1: train; 2: vLLM; 3: sandbox
OVERRIDES = ("rl.steps=3", "run.name=a b 'c' \"d\"")


@pytest.fixture
def setup(tmp_path: Path):
    run = tmp_path / "r un: it's #1"
    cfg = tmp_path / "my cfg.yaml"
    cfg.write_text("model: {path: /m}\n")
    log = tmp_path / "log"
    log.mkdir()
    py = fake_python(tmp_path)
    return run, cfg, log, py


def layout(run: Path, cfg: Path, py: Path, **changes) -> Layout:
    base = dict(
        stage="rl",
        run_dir=str(run),
        python=str(py),
        train_nodes=2,
        vllm_nodes=1,
        servers_per_node=2,
        model="/models/m x",
        config=str(cfg),
        overrides=OVERRIDES,
        vllm_args=("--max-model-len=64",),
    )
    return Layout(**(base | changes))


def node_env(log: Path, node: int, hosts: list[str] = HOSTS, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TIRL_", "CUDA_"))}
    return env | {
        "FAKE_LOG": str(log),
        "SLURM_NODEID": str(node),
        "SLURM_JOB_ID": "42",
        "TIRL_HOSTS": " ".join(hosts),
        "TIRL_VLLM_URLS": f"http://{hosts[2]}:8000,http://{hosts[2]}:8001" if len(hosts) > 2 else "",
        "TIRL_SANDBOX_URL": f"http://{hosts[-1]}:8080",
        "TIRL_RDZV_ENDPOINT": f"{hosts[0]}:29500",
        "TIRL_LAUNCH_POLL_S": "0.1",
        **extra,
    }


def script(tmp_path: Path, lay: Layout) -> Path:
    path = tmp_path / "tirl-node.sh"
    path.write_text(render_node(lay))
    return path


def run_node(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=30)


def expected_trainer(run: Path, cfg: Path, node: int) -> list[str]:
    return [
        "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
        "--rdzv_endpoint=127.0.0.1:29500", "--rdzv_id=42", f"--rdzv_conf=is_host={1 if node == 0 else 0}",
        "--max_restarts=0", f"--local_addr={HOSTS[node]}", "-m", "tirl", "rl", "--config", str(cfg),
        "--out", str(run), "--resume", "auto", "rollout.engine=vllm",
        "rollout.urls=[http://127.0.0.3:8000,http://127.0.0.3:8001]", f"rollout.vllm.sync_host={HOSTS[node]}",
        "sandbox.backend=remote", "sandbox.urls=[http://127.0.0.4:8080]",
        f'sandbox.auth_token_file="{run}/.launch/sandbox.token"', *OVERRIDES,
    ]  # fmt: skip


@pytest.mark.parametrize("node", [0, 1])
def test_train_node_waits_for_every_server_then_runs_torchrun(setup, tmp_path: Path, node: int) -> None:
    run, cfg, log, py = setup
    done = run / ".launch" / "job-42.0" / f"train-{node}.exit"
    result = run_node(script(tmp_path, layout(run, cfg, py)), node_env(log, node))
    assert result.returncode == 0, result.stderr
    wait, trainer = calls(log, node)
    assert wait == [
        "-m", "tirl.launch.wait", "--timeout", "1800", "http://127.0.0.3:8000", "http://127.0.0.3:8001",
        "--sandbox", "http://127.0.0.4:8080", "--sandbox-token-file", f"{run}/.launch/sandbox.token",
    ]  # fmt: skip
    assert trainer == expected_trainer(run, cfg, node)
    assert done.read_text().strip() == "0"  # the server nodes stop once every train node wrote one


def test_the_token_override_parses_as_the_path_itself(setup, tmp_path: Path) -> None:
    """tirl reads an override's value as YAML: the quoted path survives ": " and " #"."""
    from tirl.commands.run_config import TirlConfig
    from tirl.core.config import load_config

    run, cfg, log, py = setup
    run_node(script(tmp_path, layout(run, cfg, py)), node_env(log, 0))
    override = next(a for a in calls(log, 0)[1] if a.startswith("sandbox.auth_token_file="))
    assert load_config(TirlConfig, None, [override]).sandbox.auth_token_file == f"{run}/.launch/sandbox.token"


def test_a_failed_wait_ends_the_train_node_with_its_code(setup, tmp_path: Path) -> None:
    run, cfg, log, py = setup
    env = node_env(
        log, 0, FAKE_SERVERS="3", FAKE_WAIT_TRIES="2"
    )  # the fake wait gives up: no server ever starts
    result = run_node(script(tmp_path, layout(run, cfg, py)), env)
    assert result.returncode == 1
    assert len(calls(log, 0)) == 1  # torchrun never started
    assert (run / ".launch" / "job-42.0" / "train-0.exit").read_text().strip() == "1"


def start_node(path: Path, env: dict[str, str]) -> subprocess.Popen:
    """The node in a session of its own, so that `stop` ends its servers too, whatever the test's outcome."""
    return subprocess.Popen(
        ["bash", str(path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this test started (start_node)
    except ProcessLookupError:
        pass
    proc.wait()


def wait_for(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout  # a guard against a hang only
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def finish_training(run: Path) -> None:
    done = run / ".launch" / "job-42.0"
    done.mkdir(parents=True, exist_ok=True)
    for node in (0, 1):
        (done / f"train-{node}.exit").write_text("0\n")


def serve_until_trained(
    path: Path, env: dict[str, str], run: Path, log: Path, node: int, servers: int
) -> int:
    """Run a server node until its `servers` servers have started, then finish training; its exit code."""
    proc = start_node(path, env)
    try:
        wait_for(lambda: len(calls(log, node)) == servers)
        finish_training(run)
        return proc.wait(timeout=15)
    finally:
        stop(proc)


def test_vllm_node_serves_on_its_address_until_training_is_over(setup, tmp_path: Path) -> None:
    run, cfg, log, py = setup
    proc = start_node(script(tmp_path, layout(run, cfg, py)), node_env(log, 2))
    try:
        wait_for(lambda: len(calls(log, 2)) == 2)
        assert sorted(calls(log, 2)) == [
            ["-m", "tirl", "serve-vllm", "/models/m x", "--host", "127.0.0.3", "--port", str(port),
             "--vllm-arg=--max-model-len=64"]
            for port in (8000, 8001)
        ]  # fmt: skip
        time.sleep(0.3)
        assert proc.poll() is None  # still serving: training is not over
        finish_training(run)
        assert proc.wait(timeout=15) == 0
    finally:
        stop(proc)
    pids = [int(p.name.split(".")[1]) for p in log.glob("node2.*.argv")]
    for pid in pids:  # the servers were stopped and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_sandbox_node_serves_with_the_token_on_its_address(setup, tmp_path: Path) -> None:
    run, cfg, log, py = setup
    assert serve_until_trained(script(tmp_path, layout(run, cfg, py)), node_env(log, 3), run, log, 3, 1) == 0
    assert calls(log, 3) == [
        ["-m", "tirl", "sandbox", "serve", "--host", "127.0.0.4", "--port", "8080", "--auth-token-file",
         f"{run}/.launch/sandbox.token", "--config", str(cfg)]
    ]  # fmt: skip


def test_without_a_sandbox_node_the_first_vllm_node_runs_it(setup, tmp_path: Path) -> None:
    run, cfg, log, py = setup
    hosts = loopback_hosts(3)
    lay = layout(
        run, cfg, py, sandbox_node=False, servers_per_node=1, overrides=("sandbox.max_timeout_s=300",)
    )
    assert serve_until_trained(script(tmp_path, lay), node_env(log, 2, hosts), run, log, 2, 2) == 0
    assert sorted(calls(log, 2)) == [
        ["-m", "tirl", "sandbox", "serve", "--host", "127.0.0.3", "--port", "8080", "--auth-token-file",
         f"{run}/.launch/sandbox.token", "--config", str(cfg), "sandbox.max_timeout_s=300"],
        ["-m", "tirl", "serve-vllm", "/models/m x", "--host", "127.0.0.3", "--port", "8000",
         "--vllm-arg=--max-model-len=64"],
    ]  # fmt: skip


def test_a_server_that_dies_first_fails_its_node_with_its_code(setup, tmp_path: Path) -> None:
    run, cfg, log, py = setup
    result = run_node(script(tmp_path, layout(run, cfg, py)), node_env(log, 2, FAKE_SERVER_RC="3"))
    assert result.returncode == 3
    assert "exited with code 3 before training was over" in result.stderr


def test_each_vllm_server_gets_its_share_of_the_gpus(setup, tmp_path: Path) -> None:
    run, cfg, log, py = setup
    lay = layout(run, cfg, py, gpus_per_node=4)
    for visible, shares in ((None, ["0,1", "2,3"]), ("4,5,6,7", ["4,5", "6,7"])):
        for p in [*log.iterdir(), *(run / ".launch").rglob("*.exit")]:
            p.unlink()
        extra = {"CUDA_VISIBLE_DEVICES": visible} if visible else {}
        assert serve_until_trained(script(tmp_path, lay), node_env(log, 2, **extra), run, log, 2, 2) == 0
        got = {env_of(log, 2, str(port))["CUDA_VISIBLE_DEVICES"] for port in (8000, 8001)}
        assert got == set(shares)


def test_a_gpu_train_node_uses_every_gpu_it_was_given(setup, tmp_path: Path) -> None:
    run, cfg, log, py = setup
    result = run_node(script(tmp_path, layout(run, cfg, py, gpus_per_node=4)), node_env(log, 0))
    assert result.returncode == 0, result.stderr
    trainer = calls(log, 0)[1]
    assert "--nproc_per_node=4" in trainer and "model.device=cuda" in trainer
    assert trainer.index("model.device=cuda") < trainer.index(OVERRIDES[0])  # the user's overrides come last
    assert env_of(log, 0, "torch.distributed.run")["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_a_node_with_fewer_gpus_than_the_layout_stops(setup, tmp_path: Path) -> None:
    run, cfg, log, py = setup
    result = run_node(
        script(tmp_path, layout(run, cfg, py, gpus_per_node=4)), node_env(log, 2, CUDA_VISIBLE_DEVICES="0,1")
    )
    assert result.returncode == 1
    assert "has 2 GPU(s)" in result.stderr
    assert calls(log, 2) == []


def test_sft_nodes_run_torchrun_alone(setup, tmp_path: Path) -> None:
    run, cfg, log, py = setup
    lay = Layout(stage="sft", run_dir=str(run), python=str(py), train_nodes=2, overrides=("sft.epochs=1",))
    result = run_node(script(tmp_path, lay), node_env(log, 1, loopback_hosts(2)))
    assert result.returncode == 0, result.stderr
    assert calls(log, 1) == [
        ["-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
         "--rdzv_endpoint=127.0.0.1:29500", "--rdzv_id=42", "--rdzv_conf=is_host=0", "--max_restarts=0",
         "--local_addr=127.0.0.2", "-m", "tirl", "sft", "--out", str(run), "--resume", "auto", "sft.epochs=1"]
    ]  # fmt: skip


def test_a_node_index_beyond_the_layout_has_no_role(setup, tmp_path: Path) -> None:
    run, cfg, log, py = setup
    result = run_node(script(tmp_path, layout(run, cfg, py)), node_env(log, 4, loopback_hosts(5)))
    assert result.returncode == 1 and "no role" in result.stderr
