"""The prepared GPU session (`device_session.py`) on a CPU: its phases fit one device command, a phase past its
timeout is killed with its children while the next still runs and finds the record written, the env phase checks
the offline wheels docs/gpu.md lists, and (slow) the dry run runs every phase."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import device_session as ds
import pytest
from bench.gpu import PARTS

ROOT = Path(__file__).resolve().parents[2]


def test_the_phases_fit_one_device_command():
    for cpu in (False, True):
        plan, every = ds.phases(cpu), ds.phases(cpu, extra=True)
        assert sum(p.timeout_s for p in plan) <= ds.BUDGET_S <= 540  # nine minutes of a 10-minute command
        assert every[: len(plan)] == plan and len({p.name for p in every}) == len(every)
        benched = {p.command[p.command.index("--parts") + 1] for p in every if "--parts" in p.command}
        assert benched == set(PARTS)
        assert {"bench-decode-4b", "bench-update-4b"} <= {
            p.name for p in plan
        }  # the recipe's shape by default


def test_a_phase_past_its_timeout_is_killed_and_the_next_still_runs(tmp_path):
    py = sys.executable
    child = tmp_path / "child.pid"
    slow = "import subprocess, sys, time; p = subprocess.Popen(['sleep', '60']); " \
           "open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(60)"  # fmt: skip
    reads = "import json, sys; r = json.load(open(sys.argv[1])); sys.exit(0 if r['phases'][0]['timed_out'] else 5)"
    plan = [
        ds.Phase("slow", (py, "-c", slow, str(child)), 2),
        ds.Phase("reads", (py, "-c", reads, "{out}/session.json"), 30),
    ]
    assert ds.session(plan, tmp_path / "out", budget_s=60) == 1
    record = json.loads((tmp_path / "out" / "session.json").read_text())
    first, second = record["phases"]
    assert first["timed_out"] and first["rc"] != 0 and 2 <= first["seconds"] < 30
    assert second["rc"] == 0 and not second["timed_out"]  # it read the record the first phase left
    pid, deadline = int(child.read_text()), time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)  # the phase's own child went with it


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_spent_budget_skips_the_remaining_phases(tmp_path):
    plan = [ds.Phase("one", (sys.executable, "-c", "pass"), 10)] * 2
    assert ds.session(plan, tmp_path, budget_s=4) == 1
    assert all("spent" in p["skipped"] for p in json.loads((tmp_path / "session.json").read_text())["phases"])


def test_the_env_phase_checks_the_offline_wheels_of_the_docs():
    block = (ROOT / "docs" / "gpu.md").read_text().split("pip download", 1)[1].split("```", 1)[0]
    assert set(re.findall(r'"([a-z-]+)[><=]', block)) == set(ds.OFFLINE_WHEELS)
    bench = (ROOT / "docs" / "gpu.md").read_text().split("-d wheels-bench", 1)[1].split("\n", 1)[0]
    assert set(re.findall(r'"([a-z-]+)[><=]', bench)) == set(ds.BENCH_WHEELS) < set(ds.OFFLINE_WHEELS)
    info = ds.environment()
    assert info["torch"] and info["transformers"] and isinstance(info["missing"], list)
    assert not set(info["missing"]) & set(info["missing_for_named_phases"])


@pytest.mark.slow
def test_the_dry_run_runs_every_phase(tmp_path):
    cmd = [
        sys.executable,
        "tests/gpu/device_session.py",
        "--device",
        "cpu",
        "--small",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    record = json.loads((tmp_path / "session.json").read_text())
    assert [p["name"] for p in record["phases"]] == [p.name for p in ds.phases(cpu=True)]
    missing = json.loads((tmp_path / "env.json").read_text())[
        "missing"
    ]  # a module missing here fails env only
    failed = {p["name"]: p["tail"][-1500:] for p in record["phases"] if p["rc"] != 0 and p["name"] != "env"}
    assert not failed and proc.returncode == (1 if missing else 0), failed
    assert (
        json.loads((tmp_path / "gpu-update.json").read_text())["update"]["variants"]["tirl"]["tokens_per_s"]
        > 0
    )


def test_phases_picks_some_and_refuses_an_unknown_name(tmp_path, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(ds, "session", lambda plan, out, budget: ran.append([p.name for p in plan]) or 0)
    assert ds.main(["--out", str(tmp_path), "--phases", "bench-demo,gpu-check"]) == 0
    assert ran == [["gpu-check", "bench-demo"]]  # the session's own order
    with pytest.raises(SystemExit):
        ds.main(["--out", str(tmp_path), "--phases", "gpu-chek"])
    assert "unknown phase(s) gpu-chek" in capsys.readouterr().err


def test_a_phase_keeps_what_was_on_the_python_path(tmp_path, monkeypatch):
    """Offline wheels installed with `pip --target DIR` reach tirl through PYTHONPATH=DIR: a phase adds tirl's
    source and keeps DIR (else every `python -m tirl` in it fails on a missing math_verify)."""
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    code = "import os; print(os.environ['PYTHONPATH'])"
    record = ds.run_phase(ds.Phase("path", (sys.executable, "-c", code), 30), tmp_path, 30)
    assert record["rc"] == 0
    assert record["tail"].strip().split(":") == [str(ROOT / "src"), str(ROOT), "/tmp/site"]
