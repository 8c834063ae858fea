"""A real `tirl sandbox serve` on 127.0.0.1 for the SandboxFusion compatibility tests (no outer cgroup: the
snippets there are ordinary ones; the hostile tests have their own guarded server)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FusionServer:
    """`tirl sandbox serve` in a subprocess under `timeout -s KILL`, ready when /health answers."""

    def __init__(self, *args: str, token: str | None = None) -> None:
        """`token`: given to the server as $TIRL_SANDBOX_TOKEN and sent by `post` (never inherited when None)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "tirl.cli", "sandbox", "serve", "--port", str(self.port), *args]
        env = {k: v for k, v in os.environ.items() if k != "TIRL_SANDBOX_TOKEN"}
        env["PYTHONPATH"] = str(REPO / "src")
        if token is not None:
            env["TIRL_SANDBOX_TOKEN"] = token
        self.proc = subprocess.Popen(
            ["timeout", "-s", "KILL", "300", *cmd], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        self.http = httpx.Client(base_url=self.url, timeout=60, headers=headers)
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if self.http.get("/health").status_code == 200:
                    return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"sandbox server did not start: {self.logs()}")
            time.sleep(0.1)

    @property
    def server_pid(self) -> int:
        """The pid of `tirl sandbox serve` itself: signal it, not its `timeout` wrapper (which signals the group)."""
        return int(Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()[0])

    def post(self, body: dict) -> dict:
        r = self.http.post("/run_code", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    def logs(self) -> str:
        """The server's stderr so far (after close: all of it)."""
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read().decode("utf-8", "replace")

    def close(self) -> None:
        self.http.close()
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
