"""Named spans of a decode step and of an update, for `torch.profiler` (`python -m bench gpu --profile`).

A profile lists kernels and ops; it does not say which part of tirl's loop launched them. `region("tirl/decode/
sample")` wraps that part in a `record_function`, so the profile also gives each part's host time and the device
time of the kernels it launched (`REGIONS`). Without a running profiler a region is nothing at all: no op is
recorded and no number changes, so the loops carry them always.
"""

from __future__ import annotations

import contextlib

import torch
from torch.autograd import profiler as _profiler

# Every region tirl marks, in loop order: what a profile's per-region table is keyed by.
REGIONS = (
    "tirl/decode/prefill",  # the prompts' pass (and kept prefixes') before the first token
    "tirl/decode/sample",  # log-softmax, truncation, the draw (and the graph decode queueing its ids to the host)
    "tirl/decode/step",  # one decode step of the model: a graph replay, or the eager forward
    "tirl/decode/host",  # waiting for the sampled ids and booking them (stop rules, kept prefixes)
    "tirl/update/forward",  # a micro-batch's log-probs and loss
    "tirl/update/backward",  # its backward
    "tirl/update/optimizer",  # gradient clipping and the optimizer's step
)
_NOTHING = contextlib.nullcontext()


def _profiling() -> bool:
    enabled = getattr(
        _profiler, "_is_profiler_enabled", None
    )  # a private flag: asked of the C++ side if gone
    return bool(enabled) if enabled is not None else torch._C._autograd._profiler_enabled()


def region(name: str) -> contextlib.AbstractContextManager[object]:
    """A `record_function(name)` while a profiler runs, else a no-op; `name` is one of `REGIONS`."""
    if name not in REGIONS:
        raise ValueError(f"unknown profiling region {name!r}; the regions are {', '.join(REGIONS)}")
    return torch.profiler.record_function(name) if _profiling() else _NOTHING
