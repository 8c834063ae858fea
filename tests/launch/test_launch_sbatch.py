"""tirl.sbatch run as Slurm would run it, with fake `scontrol` and `srun` on PATH (launch_fakes.py): four "nodes"
on loopback addresses, each running tirl-node.sh with a fake `$PY`. Checked: every node ran its role with the
right addresses and the job's one key, the token file is made private, the job ends once training is over, and
the time-limit notice (USR1) sends SIGTERM to the step and requeues the job."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from launch_fakes import calls, env_of, fake_python, fake_slurm, kill_sessions, loopback_hosts

from tirl.launch.layout import Layout
from tirl.launch.slurm import SlurmOptions, write

HOSTS = loopback_hosts(4)


@pytest.fixture
def job(tmp_path: Path):
    run = tmp_path / "run dir's"
    log = tmp_path / "log"
    log.mkdir()
    lay = Layout(stage="rl", run_dir=str(run), python=str(fake_python(tmp_path)), train_nodes=2, vllm_nodes=1,
                 servers_per_node=2, model="/models/m", overrides=("rl.steps=3",))  # fmt: skip
    sbatch, _ = write(lay, SlurmOptions(), tmp_path / "out")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TIRL_", "CUDA_"))}
    env |= {
        "PATH": f"{fake_slurm(tmp_path / 'bin')}:{env['PATH']}",
        "FAKE_LOG": str(log),
        "FAKE_HOSTS": " ".join(HOSTS),
        "FAKE_SERVERS": "3",  # the fake wait returns once 2 vLLM servers and the sandbox have started
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "node[1-4]",
        "TIRL_LAUNCH_POLL_S": "0.1",
    }
    yield run, log, sbatch, env
    kill_sessions(log)


def test_every_node_runs_its_role_with_the_right_addresses(job) -> None:
    run, log, sbatch, env = job
    result = subprocess.run(["bash", str(sbatch)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    srun = (log / "srun.argv").read_text().splitlines()
    assert srun == ["--kill-on-bad-exit=1", "--nodes=4", "--ntasks=4", "--ntasks-per-node=1", "bash",
                    str(sbatch.parent / "tirl-node.sh")]  # fmt: skip
    for node in (0, 1):
        wait, trainer = calls(log, node)
        assert wait[4:6] == ["http://127.0.0.3:8000", "http://127.0.0.3:8001"]
        assert wait[6:8] == ["--sandbox", "http://127.0.0.4:8080"]
        assert "--rdzv_endpoint=127.0.0.1:29500" in trainer and "--rdzv_id=77" in trainer
        assert f"--rdzv_conf=is_host={int(node == 0)}" in trainer
        assert f"rollout.vllm.sync_host={HOSTS[node]}" in trainer
        assert "rollout.urls=[http://127.0.0.3:8000,http://127.0.0.3:8001]" in trainer
    served = sorted((a[2], a[a.index("--host") + 1], a[a.index("--port") + 1]) for a in calls(log, 2))
    assert served == [("serve-vllm", "127.0.0.3", "8000"), ("serve-vllm", "127.0.0.3", "8001")]
    (sandbox,) = calls(log, 3)
    assert sandbox[:8] == ["-m", "tirl", "sandbox", "serve", "--host", "127.0.0.4", "--port", "8080"]
    keys = {env_of(log, n, a)["TIRL_VLLM_API_KEY"] for n, a in ((0, "torch.distributed.run"), (2, "8000"))}
    assert len(keys) == 1 and len(keys.pop()) >= 32  # one key for the job, made by the script
    token = run / ".launch" / "sandbox.token"
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text().strip()) >= 32


def test_a_key_in_the_environment_is_kept(job) -> None:
    _, log, sbatch, env = job
    result = subprocess.run(["bash", str(sbatch)], env=env | {"TIRL_VLLM_API_KEY": "k" * 40}, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert env_of(log, 2, "8001")["TIRL_VLLM_API_KEY"] == "k" * 40


def test_a_job_with_the_wrong_node_count_stops_before_srun(job) -> None:
    _, log, sbatch, env = job
    result = subprocess.run(["bash", str(sbatch)], env=env | {"FAKE_HOSTS": "127.0.0.1 127.0.0.2"},
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 1
    assert "the job has 2 nodes" in result.stderr and "rendered for 4" in result.stderr
    assert not (log / "srun.argv").exists()


def test_the_time_limit_notice_stops_the_step_and_requeues(job) -> None:
    run, log, sbatch, env = job
    proc = subprocess.Popen(["bash", str(sbatch)], env=env | {"FAKE_TRAIN_S": "300"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30  # a guard against a hang only
        while not all(len(calls(log, n)) == 2 for n in (0, 1)):  # both trainers are running
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        assert proc.wait(timeout=30) == 0
    finally:
        try:
            os.killpg(
                proc.pid, signal.SIGKILL
            )  # the group this test started; the nodes' sessions: the fixture
        except ProcessLookupError:
            pass
        proc.wait()
    assert (log / "srun.signals").read_text().split() == ["TERM"]
    assert (log / "scontrol.log").read_text().split() == ["requeue", "77"]
    for node in (0, 1):  # each train node saw its trainer stopped by the signal
        assert (run / ".launch" / "job-77.0" / f"train-{node}.exit").read_text().strip() == "143"
