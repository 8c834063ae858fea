"""The agent program's processes: one run per episode, or long-lived workers that take episodes as JSON lines.

Either way a process runs in its own process group, which is killed when its episode times out (or, for a
worker, when the loop closes), so nothing the program started outlives it. A worker that dies or stops answering
is replaced by a fresh one for the next episode.
"""

from __future__ import annotations

import collections
import json
import math
import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

STDERR_SHOWN = 400  # characters of a failed program's stderr kept in its episode


@dataclass(frozen=True)
class Finished:
    """How a program's episode ended: "ok", "crashed" or "timeout", why, and the answer (and score) it gave."""

    status: str
    detail: str = ""
    answer: str | None = None
    score: float | None = None


def score_of(value: Any) -> float | None:
    """A reported score: a finite number, else None."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def answer_of(line: str) -> tuple[str | None, float | None]:
    """An answer line: plain text, or a JSON object's `answer` and `score`."""
    text = line.strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text or None, None
    if isinstance(data, dict) and ("answer" in data or "score" in data):
        answer = data.get("answer")
        return (None if answer is None else str(answer)), score_of(data.get("score"))
    return text or None, None


def kill_group(proc: subprocess.Popen) -> None:
    """The program and anything it started, gone (it may have left children after exiting)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _popen(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        bufsize=1,
    )


def run_once(argv: list[str], env: dict[str, str], stdin: str, timeout_s: float) -> Finished:
    """One process for one episode: `stdin` in, its last non-empty stdout line as the answer."""
    try:
        proc = _popen(argv, env)
    except OSError as e:
        return Finished("crashed", f"agent.program.command did not start: {e}")
    try:
        stdout, stderr = proc.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Finished("timeout", f"the program ran past agent.program.timeout_s={timeout_s:g}")
    finally:
        kill_group(proc)
    if proc.returncode:
        return Finished("crashed", f"exit code {proc.returncode}: {stderr.strip()[-STDERR_SHOWN:]}")
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    answer, score = answer_of(lines[-1]) if lines else (None, None)
    return Finished("ok", answer=answer, score=score)


class Worker:
    """A long-lived program: one JSON line per episode on its stdin, one `{"episode": ID, "answer": ...}` line back
    on its stdout (other stdout lines are ignored, so it may log there)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv, self.env = argv, env
        self.proc: subprocess.Popen | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: collections.deque[str] = collections.deque(maxlen=50)

    def _start(self) -> None:
        self.proc = _popen(self.argv, self.env)
        self.lines = queue.Queue()
        self.stderr = collections.deque(maxlen=50)
        out, err = self.proc.stdout, self.proc.stderr
        threading.Thread(target=self._pump, args=(out, self.lines.put), daemon=True).start()
        threading.Thread(
            target=self._pump, args=(err, lambda ln: ln and self.stderr.append(ln)), daemon=True
        ).start()

    @staticmethod
    def _pump(stream: Any, put: Any) -> None:
        for line in stream:
            put(line)
        put(None)

    def _stop(self, finished: Finished) -> Finished:
        if self.proc is not None:
            kill_group(self.proc)
            self.proc = None
        return finished

    def ask(self, request: dict[str, Any], timeout_s: float) -> Finished:
        """The worker's answer to one episode (`request["episode"]` names it), within `timeout_s`."""
        if self.proc is None or self.proc.poll() is not None:
            try:
                self._start()
            except OSError as e:
                return Finished("crashed", f"agent.program.command did not start: {e}")
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return self._stop(Finished("crashed", "the worker closed its stdin"))
        end = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                return self._stop(
                    Finished("timeout", f"the worker ran past agent.program.timeout_s={timeout_s:g}")
                )
            if line is None:
                code = self.proc.wait()
                tail = "".join(self.stderr).strip()[-STDERR_SHOWN:]
                return self._stop(Finished("crashed", f"the worker exited with code {code}: {tail}"))
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict) and data.get("episode") == request["episode"]:
                answer = data.get("answer")
                answer = None if answer is None else str(answer)
                return Finished("ok", answer=answer, score=score_of(data.get("score")))

    def close(self) -> None:
        self._stop(Finished("ok"))
