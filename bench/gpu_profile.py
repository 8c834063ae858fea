"""Where a profiled call's time goes by tirl's own regions (`tirl.core.regions`): the per-region table of
`python -m bench gpu --profile`, beside its top ops.

A top-ops list names kernels; the regions say which part of the loop launched them: for a decode step the
sampling, the model's step (a graph replay or the eager forward) and the host's booking of the sampled ids; for
an update the forward, the backward and the optimizer. Per region: calls and host milliseconds per step (the
region's wall time on the host, its children included) and the device milliseconds of the kernels it launched
(0 on a CPU). A decode step whose host milliseconds exceed its device milliseconds is bound by the host.
"""

from __future__ import annotations

from typing import Any

from bench.common import stopwatch

TOP_OPS = 12  # the ops with the most own time a profile lists


def region_table(prof: Any, steps: int) -> dict[str, dict[str, float]]:
    """{region: {calls_per_step, host_ms_per_step, device_ms_per_step}} of a finished `torch.profiler.profile`,
    for every region that ran. Only the host-side events are read: on CUDA each region also has a device-side
    annotation spanning its kernels, which would count them twice."""
    from torch.autograd import DeviceType

    from tirl.core.regions import REGIONS

    table: dict[str, dict[str, float]] = {}
    for e in prof.events():
        if e.name not in REGIONS or e.device_type != DeviceType.CPU:
            continue
        row = table.setdefault(
            e.name, {"calls_per_step": 0.0, "host_ms_per_step": 0.0, "device_ms_per_step": 0.0}
        )
        row["calls_per_step"] += 1 / steps
        row["host_ms_per_step"] += e.cpu_time_total / 1e3 / steps
        row["device_ms_per_step"] += e.device_time_total / 1e3 / steps  # its kernels, children's included
    return {name: table[name] for name in REGIONS if name in table}


def where_time_goes(run: Any, device: str, steps: int) -> dict:
    """`run()` under `torch.profiler`: wall and device-busy ms per step (the device's kernels' own times summed;
    0 on a CPU), the `TOP_OPS` ops with the most own time (device time on CUDA, host time on a CPU) and tirl's
    regions (`region_table`); where the profiler fails, the error in their place."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    try:
        with profile(activities=activities) as prof, stopwatch() as t:
            run()
            if cuda:
                torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - a profiler that fails must not cost the timed figures beside it
        return {"error": f"{type(e).__name__}: {e}"[:2000]}
    ops = prof.key_averages()
    own = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    top = sorted(ops, key=own, reverse=True)[:TOP_OPS]
    return {
        "steps": steps, "wall_ms_per_step": t.s * 1e3 / steps,
        "device_busy_ms_per_step": sum(e.self_device_time_total for e in ops) / 1e3 / steps,
        "regions": region_table(prof, steps),
        "top_ops": [{"op": e.key, "calls": e.count, "self_device_ms": e.self_device_time_total / 1e3,
                     "self_host_ms": e.self_cpu_time_total / 1e3} for e in top],
    }  # fmt: skip
