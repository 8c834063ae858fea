"""The tenancy probes of test_sandbox_nonroot.py, run as an ordinary user: started as root, this script imports
what it needs, switches to uid/gid 65534 for good and only then starts a sandbox, as `tirl` started by that user
would. The worker runs a copy of the worker's code in a world-readable folder and an interpreter that uid can run
(the checkout or the test's interpreter may sit under /root). Prints one JSON object: each probe's findings.

Usage: python nonroot_probes.py ISOLATION PYTHON
"""

from __future__ import annotations

import ctypes  # noqa: F401  (imported before the uid switch: the stdlib may be unreadable after it)
import json
import os
import selectors  # noqa: F401
import shutil
import signal  # noqa: F401
import subprocess  # noqa: F401
import sys
import tempfile

from tirl.sandbox import isolation, local
from tirl.sandbox.local import LocalSandbox, SandboxConfig
from tirl.sandbox.worker import wire

UID = 65534

# Opens the zygote's (pid 1) and the parent's /proc entries the way the attacks did; prints {path: "ok"|errno}.
OPEN_PROC = """
import json, os
found = {}
for pid in sorted({1, os.getppid()}):
    for name, mode in (("mem", os.O_RDWR), ("environ", os.O_RDONLY), ("fd/0", os.O_RDONLY | os.O_NONBLOCK),
                       ("fd/1", os.O_WRONLY)):
        path = f"/proc/{pid}/{name}"
        try:
            os.close(os.open(path, mode))
            found[path] = "ok"
        except OSError as e:
            found[path] = e.errno
print(json.dumps(found))
"""

# The forgery: a fake reply to the next request and a fake ready byte, written into the zygote's stdout.
FORGE = f"""
import os, struct
text = b"FORGED\\n"
try:
    fd = os.open("/proc/1/fd/1", os.O_WRONLY)
except OSError as e:
    print("refused", e.errno)
else:
    os.write(fd, b"R" + struct.pack({wire.RESP.format!r}, 0, 0, 0.0, len(text), 0, 0) + text + b"R")
    print("written")
"""

# Writes a marker into the zygote's memory (the top of its heap) where /proc/1/mem opens for writing.
PERSIST = """
import os
marker = bytes(b ^ 0x55 for b in bytes.fromhex(MARK))
try:
    fd = os.open("/proc/1/mem", os.O_RDWR)
except OSError as e:
    print("refused", e.errno)
else:
    for line in open("/proc/1/maps"):
        if line.rstrip().endswith("[heap]"):
            hi = int(line.split()[0].split("-")[1], 16)
            os.pwrite(fd, marker, hi - 64)
    print("written")
"""

# Whether this run's memory (a fork of the zygote) holds the marker.
FIND = """
import ctypes
marker = bytes(b ^ 0x55 for b in bytes.fromhex(MARK))
found = False
for line in open("/proc/self/maps"):
    parts = line.split()
    if len(parts) > 5 and parts[5] == "[heap]":
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        found = marker in ctypes.string_at(hi - 64, 64)
print(found)
"""


def public_worker_dir() -> str:
    """A copy of the worker's code that UID can read (the checkout may be under /root)."""
    d = tempfile.mkdtemp(prefix="tirl-nonroot-worker-")
    os.chmod(d, 0o755)
    dst = os.path.join(d, "worker")
    shutil.copytree(os.path.dirname(isolation.ZYGOTE), dst, ignore=shutil.ignore_patterns("__pycache__"))
    for root, dirs, files in os.walk(dst):
        for name in dirs + files:
            os.chmod(os.path.join(root, name), 0o755)
    return dst


def main() -> None:
    mode, python = sys.argv[1], sys.argv[2]
    worker = public_worker_dir()
    zygote = os.path.join(worker, "zygote.py")
    isolation.ZYGOTE = local.ZYGOTE = type(isolation.ZYGOTE)(zygote)
    bpf = local.compile_filter()
    local.compile_filter = lambda: bpf  # libseccomp's bindings load lazily, from a folder UID may not read
    os.setgroups([])
    os.setresgid(UID, UID, UID)
    os.setresuid(UID, UID, UID)
    os.environ["HOME"] = "/tmp"
    os.chdir("/tmp")
    cfg = SandboxConfig(
        isolation=mode, max_workers=1, preload_heavy=(), python=python, import_site=False, timeout_s=10.0
    )
    out: dict = {"uid": os.getuid()}
    mark = os.urandom(12).hex()
    with LocalSandbox(cfg) as sb:
        out["open"] = json.loads(sb.run(OPEN_PROC).stdout or "{}")
        out["open_in_runner"] = json.loads(sb.run(OPEN_PROC, files={"a.txt": "YQ=="}).stdout or "{}")
        out["forge"] = sb.run(FORGE).stdout.strip()
        out["victim"] = sb.run("print(6*7)").stdout
        out["persist"] = sb.run(f"MARK = {mark!r}\n" + PERSIST).stdout.strip()
        out["found"] = [sb.run(f"MARK = {mark!r}\n" + FIND).stdout.strip() for _ in range(2)]
        out["rundirs"] = [sb.run("import os; print(os.getcwd())").stdout.strip() for _ in range(2)]
    out["worker_dir"] = os.path.dirname(worker)  # root's: the test removes it
    print(json.dumps(out))


if __name__ == "__main__":
    main()
