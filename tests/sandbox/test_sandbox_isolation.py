"""Isolation modes: tirl refuses to run weaker than asked, `none` warns loudly, `unshare` isolates pid/net/tmp."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tirl.core.config import ConfigError, from_dict
from tirl.sandbox import LocalSandbox, SandboxConfig, SandboxUnavailable
from tirl.sandbox.isolation import _v2_delegates, _v2_parent, worker_command


def test_missing_bwrap_refuses_instead_of_falling_back(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap, no unshare on PATH
    with pytest.raises(SandboxUnavailable, match="bwrap is not installed"):
        LocalSandbox(SandboxConfig(isolation="bwrap"))


def test_required_cgroups_refused_when_not_writable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tirl.sandbox.local.cgroup_support", lambda: ("", "none here (test)"))
    with pytest.raises(SandboxUnavailable, match="cgroups 'required'"):
        LocalSandbox(SandboxConfig(cgroups="required"))


def test_bwrap_command_mounts_only_the_system_and_interpreter_and_cuts_network() -> None:
    cmd = worker_command(SandboxConfig(), sys.executable, "{}")
    joined = " ".join(cmd)
    assert "--unshare-net" in cmd and "--unshare-pid" in cmd and "--clearenv" in cmd
    assert "--ro-bind / /" not in joined and "--tmpfs /tmp" in joined and "--remount-ro /" in joined
    binds = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--ro-bind"]
    assert "/usr" in binds and "/etc/passwd" not in binds and "/etc" not in binds
    assert not [b for b in binds if b in ("/home", "/var", "/work", "/root", "/srv", "/opt", "/mnt")]
    assert sys.base_prefix in binds or sys.base_prefix.startswith("/usr/")


def test_none_mode_warns_loudly_and_still_runs() -> None:
    with pytest.warns(RuntimeWarning, match="WITHOUT namespaces"):
        sb = LocalSandbox(SandboxConfig(isolation="none", max_workers=1))
    with sb:
        r = sb.run("print(6 * 7)")
        leftover = sb.run("import os, subprocess\np = subprocess.Popen(['sleep', '30'])\nprint(p.pid)")
    assert r.stdout == "42\n"
    pid = int(leftover.stdout)
    assert (
        not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] == "Z"
    )


# as root with an interpreter under /root, unshare runs snippets as root and says so (test_sandbox_tenancy.py)
AS_ROOT_WARNING = "ignore:tirl sandbox. isolation 'unshare' as root:RuntimeWarning"


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
@pytest.mark.filterwarnings(AS_ROOT_WARNING)
def test_unshare_mode_isolates_pids_network_and_tmp() -> None:
    with LocalSandbox(SandboxConfig(isolation="unshare", max_workers=1)) as sb:
        r = sb.run(
            "import os, socket\nprint(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
            "open('/tmp/left-behind', 'w').write('x')\n"
            "try:\n    socket.create_connection(('127.0.0.1', 22), timeout=1)\nexcept OSError as e:\n"
            "    print(type(e).__name__)\n"
        )
        after = sb.run("import os\nprint(os.path.exists('/tmp/left-behind'))")
    lines = r.stdout.splitlines()
    assert r.status == "ok" and len(eval(lines[0])) <= 2 and lines[1] == "OSError"
    assert after.stdout == "False\n" and not os.path.exists("/tmp/left-behind")


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bwrap")
def test_bwrap_snippet_writes_tmp_and_the_file_is_wiped() -> None:
    """/tmp is 01777 as on a host (SandboxFusion clients write there), even as root where the snippet has its
    own uid; what it wrote is gone before the next run."""
    with LocalSandbox(SandboxConfig(isolation="bwrap", max_workers=1)) as sb:
        r = sb.run(
            "import os\nopen('/tmp/scratch', 'w').write('x')\nprint(oct(os.stat('/tmp').st_mode & 0o7777))"
        )
        after = sb.run("import os\nprint(os.listdir('/tmp'))")
    assert r.status == "ok", r.stderr
    assert r.stdout == "0o1777\n"
    assert "scratch" not in after.stdout


@pytest.mark.parametrize(
    "isolation",
    [
        pytest.param("bwrap", marks=pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bwrap")),
        pytest.param(
            "unshare", marks=pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare")
        ),
    ],
)
@pytest.mark.filterwarnings(AS_ROOT_WARNING)
def test_interpreter_under_tmp_stays_visible(isolation: str, tmp_path) -> None:
    """A virtualenv (or checkout) under /tmp, as CI clones often are, is bound back over the private /tmp."""
    if not str(tmp_path).startswith("/tmp/"):
        pytest.skip(f"tmp_path {tmp_path} is not under /tmp")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = str(venv / "bin" / "python")
    cfg = SandboxConfig(isolation=isolation, python=python, preload=("math",), max_workers=1)
    with LocalSandbox(cfg) as sb:
        # the snippet may write /tmp (01777); the file must not survive the run
        r = sb.run("import sys\nprint(sys.prefix)\nopen('/tmp/scratch', 'w')")
        after = sb.run("import os\nprint(os.path.exists('/tmp/scratch'))")
    assert r.status == "ok", r.stderr
    assert r.stdout == f"{venv}\n"  # the venv itself ran, not the interpreter it points to
    assert after.stdout == "False\n"  # /tmp is still the worker's own, wiped after each run


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"isolation": "docker"}, "isolation"),
        ({"backend": "cloud"}, "backend"),
        ({"max_processes": 0}, "max_processes"),
        ({"max_runs_per_worker": 0}, "max_runs_per_worker"),
        ({"retries": -1}, "retries"),
    ],
)
def test_config_errors_name_the_key(data: dict, match: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=match):
        from_dict(SandboxConfig, data)


def test_cli_serve_refuses_weaker_isolation(monkeypatch: pytest.MonkeyPatch, tmp_path, capsys) -> None:
    from tirl.cli import main

    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["sandbox", "serve", "--port", "1"]) == 2
    assert "bwrap is not installed" in capsys.readouterr().err


def test_cli_serve_rejects_a_bad_port_clearly(capsys) -> None:
    from tirl.cli import main

    assert main(["sandbox", "serve", "--port", "99999"]) == 2
    assert "--port must be 0-65535, got 99999" in capsys.readouterr().err


def _v2_reason() -> str:
    """'' where per-worker cgroups can use the unified hierarchy here, else why not (the skip reason)."""
    try:
        return _v2_delegates(_v2_parent())
    except OSError as e:
        return str(e)


@pytest.mark.skipif(bool(_v2_reason()), reason=f"no usable cgroup v2 memory/pids here: {_v2_reason()}")
def test_cgroup_v2_contains_fork_and_memory_bombs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forced onto the unified hierarchy: pids.max stops a fork bomb, memory.max meets a multi-process memory bomb,
    the pool answers the next run, and the worker cgroups are gone after close."""
    monkeypatch.setattr("tirl.sandbox.local.cgroup_support", lambda: ("v2", ""))
    cfg = SandboxConfig(cgroups="required", max_workers=1, preload_heavy=(), memory_mb=128, max_processes=16)
    with LocalSandbox(cfg) as sb:
        (worker,) = list(sb._all)
        (d,) = worker.cgroup.dirs
        assert worker.cgroup.version == "v2" and (d / "pids.max").read_text().strip() == "24"
        bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
        assert sb.run(bomb, timeout_s=2).status == "timeout"
        # 8 x 120 MB: each within its own rlimit, together over memory.max (128 + 512 MB); exit code = kills seen
        hog = (
            "import os, time\nfor _ in range(8):\n    if os.fork() == 0:\n        x = bytearray(120 * 2**20)\n"
            "        x[::4096] = b'x' * len(x[::4096])\n        time.sleep(2)\n        os._exit(0)\n"
            "killed = sum(os.wait()[1] != 0 for _ in range(8))\nraise SystemExit(killed)\n"
        )
        r = sb.run(hog, timeout_s=10)
        assert r.exit_code != 0 and r.status in ("memory_exceeded", "runtime_error"), r
        assert sb.run("print(6 * 7)").stdout == "42\n"
    assert not d.exists()
