"""One prepared session on one GPU, in at most nine minutes: `python -m bench gpu` part by part (the 0.6B shape
with a profile, then the recipe's 4B shape), each phase a process with its own timeout, every result written
as it comes.

    python tests/gpu/device_session.py --out DIR                        # on the GPU machine (device time is short)
    python tests/gpu/device_session.py --device cpu --small --out DIR   # the dry run on a CPU (2-5 minutes)

Phases, most wanted first, so that a session cut short keeps what matters (`phases`). "took": on one H100 80GB,
2026-11-27 (docs/results/gpu/), before `--profile` (one more call per profiled row) and the 4B parts existed;
the timeouts (`GPU_TIMEOUTS`) allow for both:

| phase | what | took | timeout |
|---|---|---|---|
| env | versions, the GPU, and which of the offline wheels' modules import (`OFFLINE_WHEELS`, `BENCH_WHEELS`, docs/gpu.md) | 10 s | 15 s |
| bench-decode | `--parts decode --profile`: engine (eager, bf16, CUDA graphs; the graphs again with the earlier draw and with a compiled step), HF `generate` | 111 s (5 rows) | 180 s |
| bench-update | `--parts update --profile`: tirl's update, a plain HF one, tirl's with `model.compile_layers` | 35 s (2 variants) | 110 s |
| bench-decode-4b | `--parts decode-4b`: the Qwen3-4B shape's graph decode and HF `generate`, 2,048/16,384 contexts | - | 125 s |
| bench-update-4b | `--parts update-4b`: the 4B shape's update on 16 x 6,144-8,192 tokens, where `tirl plan` says it fits | - | 110 s |

Run only when named (`--phases`; all three ran in the first session): `graph-decode`, the CUDA-graph decode's GPU
tests (`tests/rollout/test_graph_decode.py -m gpu`), 22 s, 35 s; `gpu-check`, `make gpu-check`'s runner
(`tests/gpu/gpu_check.py`, the graph tests left out), ~155 s, 180 s; `bench-demo`, the tiny demo's stages on
CUDA (2 RL steps, 16 tests), ~145 s, 130 s. A part writes each row (each context, each variant) as it ends, so a
phase killed at its timeout keeps what it finished (the compiled rows come last for that reason).

DIR gets `session.json` (rewritten after each phase: its command, exit code, seconds, whether it timed out, the
tail of its output), each phase's whole output as `PHASE.log`, and the benchmark's JSON per part
(`gpu-decode.json`, ...). A phase past its timeout is killed with its process group and the next one runs; the
whole session stops starting phases at `--budget-s`; `--phases a,b` runs only those (a rerun of what failed). Exit
code 0 when every phase exited 0.

The dry run (`--device cpu --small`): the benchmark at its tiny shape on the CPU, and the GPU test phases only
collected (`pytest --collect-only`: they import and select), so the commands, paths and arguments are checked
before a GPU is spent on them; its timeouts are the CPU's. Deliberately not here: installing anything (the offline
wheels are installed beforehand, docs/gpu.md), vLLM (its checks skip where it is absent).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script: bench/ (standard library only at import)
from bench.common import tirl_env  # noqa: E402

BUDGET_S = 540  # nine minutes: one device command may run 600 s
# the offline wheels of docs/gpu.md (`pip download ...`) -> the module each provides
OFFLINE_WHEELS = {
    "tokenizers": "tokenizers", "math-verify": "math_verify", "numpy": "numpy", "pyyaml": "yaml", "rich": "rich",
    "pyarrow": "pyarrow", "fastapi": "fastapi", "uvicorn": "uvicorn", "httpx": "httpx", "matplotlib": "matplotlib",
    "pyseccomp": "pyseccomp", "pytest": "pytest", "setuptools": "setuptools",
}  # fmt: skip
ON_THE_MACHINE = ("torch", "transformers", "peft")  # the GPU machine's own, not among the wheels
# what the default phases (the benchmark) import beyond the machine's own: about 10 MB of wheels with their
# dependencies (docs/gpu.md); the others serve the phases run only when named
BENCH_WHEELS = ("math-verify", "pyyaml", "rich", "httpx")
GRAPH_TESTS = "tests/rollout/test_graph_decode.py"
# seconds each phase may take: on a GPU about 1.2x what it took on one H100 (the table above), on a CPU the dry
# run's (the demo takes minutes there); the default phases' sum stays within BUDGET_S
GPU_TIMEOUTS = {"env": 15, "bench-decode": 180, "bench-update": 110, "bench-decode-4b": 125, "bench-update-4b": 110,
                "graph-decode": 35, "gpu-check": 180, "bench-demo": 130}  # fmt: skip
CPU_TIMEOUTS = {"env": 20, "bench-decode": 90, "bench-update": 90, "bench-decode-4b": 90, "bench-update-4b": 90,
                "graph-decode": 60, "gpu-check": 90, "bench-demo": 220}  # fmt: skip


@dataclass(frozen=True)
class Phase:
    name: str
    command: tuple[str, ...]  # "{out}" stands for the output directory
    timeout_s: float


def phases(cpu: bool, extra: bool = False) -> list[Phase]:
    """The session's phases (module docstring); `cpu`: the dry run's versions of them; `extra`: the phases run only
    when named (`--phases`), after the default ones."""
    py = sys.executable
    bench = (py, "-m", "bench", "gpu", *(("--device", "cpu", "--small") if cpu else ()))
    collect = ("--collect-only",) if cpu else ()
    check = (
        (py, "-m", "pytest", "-q", "-m", "gpu", "tests", *collect) if cpu else (py, "tests/gpu/gpu_check.py")
    )

    def part(name: str, timeout_s: float, *flags: str) -> Phase:
        return Phase(
            f"bench-{name}", (*bench, "--parts", name, *flags, "--out", f"{{out}}/gpu-{name}.json"), timeout_s
        )

    s = CPU_TIMEOUTS if cpu else GPU_TIMEOUTS
    default = [
        Phase("env", (py, str(Path(__file__).relative_to(ROOT)), "--env", "{out}/env.json"), s["env"]),
        part("decode", s["bench-decode"], "--profile"),
        part("update", s["bench-update"], "--profile"),
        part("decode-4b", s["bench-decode-4b"]),
        part("update-4b", s["bench-update-4b"]),
    ]
    more = [
        Phase(
            "graph-decode",
            (py, "-m", "pytest", "-q", "-rs", "-m", "gpu", GRAPH_TESTS, *collect),
            s["graph-decode"],
        ),  # fmt: skip
        Phase("gpu-check", (*check, f"--ignore={GRAPH_TESTS}"), s["gpu-check"]),
        part("demo", s["bench-demo"]),
    ]
    return default + more if extra else default


def environment() -> dict:
    """Versions, the GPU, and the modules that do not import: `missing`, what the default phases need (the
    machine's own and `BENCH_WHEELS`); `missing_for_named_phases`, the other offline wheels'."""
    import platform

    out: dict = {"python": platform.python_version()}
    absent = [w for w, mod in OFFLINE_WHEELS.items() if importlib.util.find_spec(mod) is None]
    out["missing"] = [w for w in absent if w in BENCH_WHEELS]
    out["missing"] += [m for m in ON_THE_MACHINE if importlib.util.find_spec(m) is None]
    out["missing_for_named_phases"] = [w for w in absent if w not in BENCH_WHEELS]
    if importlib.util.find_spec("torch") is not None:
        import torch

        out |= {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": None}
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            out |= {"gpu": props.name, "gpu_memory_gib": props.total_memory / 2**30}
    if importlib.util.find_spec("transformers") is not None:
        import transformers

        out["transformers"] = transformers.__version__
    return out


def run_phase(phase: Phase, out: Path, limit_s: float) -> dict:
    """Run one phase to its end or its limit (then its whole process group is killed); its record."""
    argv = [a.replace("{out}", str(out)) for a in phase.command]
    env = tirl_env(ROOT)  # ROOT: bench/; what was on PYTHONPATH (offline wheels) stays
    t0 = time.perf_counter()
    with (out / f"{phase.name}.log").open("w") as log:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc, timed_out = proc.wait(timeout=limit_s), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the phase's own processes: it leads its session
            rc, timed_out = proc.wait(), True
    tail = (out / f"{phase.name}.log").read_text(errors="replace")[-3000:]
    return {**asdict(phase), "command": argv, "limit_s": limit_s, "rc": rc, "timed_out": timed_out,
            "seconds": round(time.perf_counter() - t0, 1), "tail": tail}  # fmt: skip


def session(plan: list[Phase], out: Path, budget_s: float) -> int:
    """Run `plan` within `budget_s`, rewriting out/session.json after each phase; 0 when every phase exited 0."""
    out.mkdir(parents=True, exist_ok=True)
    t0, done = time.perf_counter(), []
    for phase in plan:
        left = budget_s - (time.perf_counter() - t0)
        if left < 5:
            done.append({**asdict(phase), "rc": None, "skipped": f"the session's {budget_s:g} s were spent"})
        else:
            done.append(run_phase(phase, out, min(phase.timeout_s, left)))
        record = {"budget_s": budget_s, "phases": done}
        tmp = out / "session.json.tmp"
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(out / "session.json")
        print(f"{phase.name}: rc={done[-1]['rc']} {done[-1].get('seconds', 0)} s", flush=True)
    return 0 if all(p["rc"] == 0 for p in done) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="the directory the results go to")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--small", action="store_true", help="with --device cpu: the dry run")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S)
    ap.add_argument(
        "--phases", help="comma-separated: only these phases (a rerun of what failed), in their order"
    )
    ap.add_argument("--env", type=Path, help=argparse.SUPPRESS)  # the env phase itself
    a = ap.parse_args(argv)
    if a.env:
        info = environment()
        a.env.write_text(json.dumps(info, indent=2))
        print(json.dumps(info, indent=2))
        return 1 if info["missing"] else 0
    if a.out is None or (a.device == "cpu") != a.small:
        ap.error("give --out DIR; on a CPU the dry run is --device cpu --small")
    plan = phases(a.device == "cpu", extra=bool(a.phases))
    if a.phases:
        wanted, names = a.phases.split(","), [p.name for p in plan]
        if unknown := [w for w in wanted if w not in names]:
            ap.error(f"unknown phase(s) {', '.join(unknown)}; the phases are {', '.join(names)}")
        plan = [p for p in plan if p.name in wanted]
    return session(plan, a.out, a.budget_s)


if __name__ == "__main__":
    sys.exit(main())
