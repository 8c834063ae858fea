"""ServerPause and the watchdog on a real process group (a shell and its child, standing in for vLLM's server and
engine core)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tirl.rollout.engines.vllm.idle import ServerPause, end_watchdog, launch


def state(pid: int) -> str:
    """The process's state letter from /proc (T = stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def wait_state(pid: int, want: str, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while (got := state(pid)) != want and time.monotonic() < deadline:
        time.sleep(0.02)
    return got


@pytest.fixture
def group():
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    time.sleep(0.2)
    yield proc
    import os
    import signal

    os.killpg(proc.pid, signal.SIGCONT)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_stopped_after_the_last_user_and_continued_before_the_next(group):
    pause = ServerPause(group.pid, enabled=True)
    with pause.awake():
        with pause.awake():  # nested (the trainer's rollout inside an outer context)
            pass
        assert wait_state(group.pid, "S") == "S"  # still a user: running
    assert wait_state(group.pid, "T") == "T" and pause.stopped and pause.pauses == 1
    pause.thaw()  # a request, a sync, close()
    assert wait_state(group.pid, "S") == "S" and not pause.stopped
    with pause.awake():
        assert wait_state(group.pid, "S") == "S"
    assert wait_state(group.pid, "T") == "T" and pause.pauses == 2


def test_disabled_never_stops(group):
    pause = ServerPause(group.pid, enabled=False)
    with pause.awake():
        pass
    assert wait_state(group.pid, "S") == "S" and pause.pauses == 0


def test_users_in_several_threads(group):
    pause = ServerPause(group.pid, enabled=True)
    inside = threading.Barrier(3)
    leave = threading.Event()

    def user():
        with pause.awake():
            inside.wait()
            leave.wait()

    threads = [threading.Thread(target=user) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait()
    assert wait_state(group.pid, "S") == "S"
    leave.set()
    for t in threads:
        t.join()
    assert wait_state(group.pid, "T") == "T" and pause.pauses == 1


def test_a_gone_process_is_not_an_error():
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    pause = ServerPause(proc.pid, enabled=True)
    with pause.awake():
        pass
    pause.thaw()


def members(pgid: int) -> list[int]:
    """The live (not zombie) processes of group `pgid`."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    out.append(int(d.name))
    return out


# a trainer: starts the stand-in server as VLLMEngine does, pauses it after its "rollouts", then waits to be killed
TRAINER = """
import subprocess, time
from tirl.rollout.engines.vllm.idle import ServerPause, launch
proc, dog = launch(["sh", "-c", "sleep 600 & wait"], stdin=subprocess.DEVNULL)
pause = ServerPause(proc.pid, enabled=True)
with pause.awake():
    time.sleep(0.2)
print(proc.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_killed_trainer_leaves_no_stopped_server_behind():
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, text=True)
    assert_cleaned_up_after_kill(trainer)


def assert_cleaned_up_after_kill(trainer: subprocess.Popen) -> None:
    """`trainer` prints its paused server's pid; after its kill -9 the server's whole group is gone within 10 s."""
    pgid = 0
    try:
        pgid = int(trainer.stdout.readline())
        assert wait_state(pgid, "T") == "T"
        assert len(members(pgid)) == 2  # the shell and its sleep, both stopped
        trainer.kill()  # kill -9 of the trainer while its server is paused
        trainer.wait()
        deadline = time.monotonic() + 10
        while members(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert members(pgid) == []
    finally:
        trainer.kill()
        trainer.wait()
        if pgid:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, sig)


# the same through VLLMEngine, with a stand-in for vLLM: a shell that forks an "engine core" and serves /v1/models
FAKE_VLLM = """#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = --port ] && port=$2; shift; done
sleep 600 &
exec {python} -m http.server "$port" --bind 127.0.0.1 --directory {root}
"""
ENGINE_TRAINER = """
import sys, time
from tirl.rollout.engines.vllm.command import VLLMEngineConfig
from tirl.rollout.engines.vllm.engine import VLLMEngine
engine = VLLMEngine(VLLMEngineConfig(model=sys.argv[1], python=sys.argv[2], work_dir=sys.argv[3]))
with engine.awake():
    pass
print(engine._ipc, flush=True)
print(engine._proc.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_killed_trainer_leaves_no_paused_vllm_engine_behind(tmp_path):
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "models").write_text("{}")
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    fake = tmp_path / "python"
    fake.write_text(FAKE_VLLM.format(python=sys.executable, root=tmp_path))
    fake.chmod(0o755)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # a CPU server: the one that is paused
    args = [str(tmp_path), str(fake), str(tmp_path / "w")]
    trainer = subprocess.Popen([sys.executable, "-c", ENGINE_TRAINER, *args], stdout=subprocess.PIPE, text=True,
                               env=env)  # fmt: skip
    ipc = Path(trainer.stdout.readline().strip())  # the server's private socket directory
    assert ipc.is_dir()
    assert_cleaned_up_after_kill(trainer)
    deadline = time.monotonic() + 10
    while ipc.exists() and time.monotonic() < deadline:  # the watchdog removes it after the group
        time.sleep(0.05)
    assert not ipc.exists()


def test_an_ended_watchdog_leaves_the_server_to_its_owner():
    proc, dog = launch(["sh", "-c", "sleep 60 & wait"])
    try:
        time.sleep(0.2)
        end_watchdog(dog)  # close(): the trainer stops the server itself, then ends the watchdog
        assert dog.returncode == -signal.SIGKILL
        time.sleep(0.3)
        assert proc.poll() is None and wait_state(proc.pid, "S") == "S"
    finally:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        proc.wait()
