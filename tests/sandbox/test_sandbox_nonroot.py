"""Tenancy when tirl runs as an ordinary user: the snippet then keeps the worker's uid, so only the worker not being
dumpable (and, under `unshare`, the snippet holding no capability in its user namespace) keeps it from the worker's
/proc entries. Each probe is an attack that worked before: forging the next tenant's reply through /proc/1/fd/1,
reading its request through /proc/1/fd/0 or the worker's environment, writing into the worker's memory so that
later runs (its forks) find the bytes. The probes run in a child process that switches to uid 65534 for good
(tests/sandbox/nonroot_probes.py), under an outer timeout and process cap.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tirl.sandbox.isolation import unprivileged_uid_can_run

PROBES = Path(__file__).with_name("nonroot_probes.py")
PYTHONS = (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3")
UID = 65534
# how the kernel says no: EACCES (not dumpable), ENOENT (hidden, where the worker could remount /proc with hidepid)
REFUSED = (errno.EACCES, errno.EPERM, errno.ENOENT)


def python_for_uid() -> str | None:
    """An interpreter uid 65534 can run and import the standard library with."""
    for python in PYTHONS:
        if os.path.exists(python) and not unprivileged_uid_can_run(python, str(PROBES), UID):
            return python
    return None


def capped() -> None:
    """The probes' outer caps: processes for the uid they switch to, and address space."""
    resource.setrlimit(resource.RLIMIT_NPROC, (512, 512))
    resource.setrlimit(resource.RLIMIT_AS, (16 * 2**30, 16 * 2**30))


def run_probes(mode: str) -> dict:
    if os.geteuid() != 0:
        pytest.skip("switching to another uid needs root")
    if shutil.which("bwrap" if mode == "bwrap" else "unshare") is None:
        pytest.skip(f"{mode} is not installed")
    python = python_for_uid()
    if python is None:
        pytest.skip(f"no interpreter here that uid {UID} can run")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, str(PROBES), mode, python],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        preexec_fn=capped,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    shutil.rmtree(out.pop("worker_dir"), ignore_errors=True)
    assert out["uid"] == UID
    return out


@pytest.fixture(scope="module", params=["bwrap", "unshare"])
def probes(request: pytest.FixtureRequest) -> dict:
    return run_probes(request.param)


def test_a_snippet_cannot_open_the_workers_proc_entries(probes: dict) -> None:
    """mem, environ, fd/0 (the next request) and fd/1 (the replies) of the zygote and of the runner: refused."""
    for key in ("open", "open_in_runner"):
        assert probes[key], probes
        opened = {path: e for path, e in probes[key].items() if e not in REFUSED}
        assert not opened, (key, opened)


def test_a_snippet_cannot_forge_the_next_tenants_reply(probes: dict) -> None:
    assert probes["forge"] in [f"refused {e}" for e in REFUSED], probes
    assert probes["victim"] == "42\n", probes


def test_a_snippet_cannot_write_into_the_workers_memory(probes: dict) -> None:
    assert probes["persist"] in [f"refused {e}" for e in REFUSED], probes
    assert probes["found"] == ["False", "False"], probes


def test_every_run_gets_the_same_directory_name(probes: dict) -> None:
    """A run counter in the name would tell a tenant how many runs the worker served before it."""
    first, second = probes["rundirs"]
    assert first == second, probes
