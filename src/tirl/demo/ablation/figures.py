"""The PNGs of a comparison, drawn from its summary alone (so they can be redrawn from report.json): each arm's
pass@k curve and its training curves, the mean over seeds as a line and [min, max] over seeds as a band.

Uses `tirl.eval.plots`' figure helpers (the Agg backend, atomic saves, the log-2 k axis); not here: the numbers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tirl.eval.plots import _finish, _log_k_axis, _pyplot, _save


def _band(ax: Any, xs: list, curve: dict[str, list], label: str, color: str) -> None:
    ax.plot(xs, curve["mean"], marker="o", ms=3, color=color, label=label)
    ax.fill_between(xs, curve["min"], curve["max"], color=color, alpha=0.15)


def plot_passk(arms: dict[str, Any], path: Path) -> Path:
    """pass@k per arm at the first evaluation temperature: mean over seeds, band [min, max]."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, (name, a) in enumerate(arms.items()):
        _band(ax, a["pass@k"]["ks"], a["pass@k"], f"{name} ({len(a['seeds'])} seeds)", f"C{i}")
    _log_k_axis(ax)
    ax.set_ylim(-0.02, 1.02)
    _finish(ax, "held-out pass@k per arm: mean over seeds, band min-max", "k", "pass@k")
    _save(fig, path)
    plt.close(fig)
    return path


def plot_training(arms: dict[str, Any], path: Path) -> Path | None:
    """One panel per training series any arm logged (reward, entropy, clip fractions, length, tool calls, ...)."""
    series = sorted({s for a in arms.values() for s in a["training"]})
    if not series:
        return None
    plt = _pyplot()
    cols = min(3, len(series))
    rows = math.ceil(len(series) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
    for ax, name in zip(axes.flat, series, strict=False):
        for i, (arm, a) in enumerate(arms.items()):
            if name in a["training"]:
                band = a["training"][name]
                _band(ax, band["step"], band, arm, f"C{i}")
        _finish(ax, name, "RL step", "")
    for ax in list(axes.flat)[len(series) :]:
        ax.set_visible(False)
    fig.suptitle("training curves per arm: mean over seeds, band min-max")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path


def plot_all(summary: dict[str, Any], out: Path) -> dict[str, str]:
    """Both figures into `out`; returns {name: file name}."""
    arms = summary["arms"]
    if not arms:
        return {}
    figures = {"pass@k": plot_passk(arms, out / "passk.png").name}
    training = plot_training(arms, out / "training.png")
    if training is not None:
        figures["training"] = training.name
    return figures
