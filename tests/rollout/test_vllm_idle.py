"""ServerPause on a real process group (a shell and its child, standing in for vLLM's server and engine core)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from tirl.rollout.vllm_idle import ServerPause


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
