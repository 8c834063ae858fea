"""The curves of an RL run, read from its `metrics.jsonl`: validation pass@1, training reward, entropy and the
share of groups with a signal, against the step; written as `curves.json` and drawn as `curves.png` beside it.

One x axis for both kinds of point, "RL steps done": the training metrics of step s (0-based, as logged) come from
rollouts of the policy after s updates, and a validation after k steps (`val/after_step`; 0 before the first)
evaluated the policy after k updates. Reads only the metrics file, so the curves can be redrawn for any run,
resumed ones included (the logger keeps each step once). Not here: smoothing, or any number the file lacks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tirl.core.io import atomic_write_json
from tirl.eval.plots import _finish, _pyplot, _save

# the training series, in the order they are drawn: metric name -> axis label
TRAIN_SERIES = {
    "reward/mean": "training reward (mean)",
    "reward/accuracy": "training accuracy",
    "rollout/entropy": "entropy per sampled token (nats)",
    "adv/signal_share": "groups with a signal (rewards not all equal)",
}
_PASS1 = re.compile(r"^val/(.+)/pass@1$")


def run_curves(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The series of a run's metric rows: `train` (step and each of TRAIN_SERIES, None where a row lacks it) and
    `validation` (after_step and pass@1 per data source)."""
    train: dict[str, list] = {"step": [], **{k: [] for k in TRAIN_SERIES}}
    after: list[int] = []
    pass1: dict[str, list] = {}
    for row in rows:
        if "reward/mean" in row:
            train["step"].append(row["step"])
            for k in TRAIN_SERIES:
                train[k].append(row.get(k))
        sources = {m.group(1): v for k, v in row.items() if (m := _PASS1.match(k))}
        if sources:
            after.append(
                int(row.get("val/after_step", row["step"] + 1))
            )  # older runs: logged beside step k-1
            for src in sorted(set(pass1) | set(sources)):
                pass1.setdefault(src, [None] * (len(after) - 1)).append(sources.get(src))
    return {"train": train, "validation": {"after_step": after, "pass@1": pass1}}


def plot_curves(curves: dict[str, Any], path: Path) -> Path:
    """Four panels against RL steps done: validation pass@1 per source, reward and accuracy, entropy, signal share."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
    val, train = curves["validation"], curves["train"]
    ax = axes[0][0]
    for src, ys in val["pass@1"].items():
        _line(ax, val["after_step"], ys, src)
    ax.set_ylim(-0.02, 1.02)
    _finish(ax, "validation pass@1", "RL steps done", "pass@1")
    for ax, keys in ((axes[0][1], ("reward/mean", "reward/accuracy")), (axes[1][0], ("rollout/entropy",))):
        for k in keys:
            _line(ax, train["step"], train[k], k)
        _finish(ax, " and ".join(TRAIN_SERIES[k] for k in keys), "RL steps done", "")
    _line(axes[1][1], train["step"], train["adv/signal_share"], "adv/signal_share")
    axes[1][1].set_ylim(-0.02, 1.02)
    _finish(axes[1][1], TRAIN_SERIES["adv/signal_share"], "RL steps done", "share of groups")
    for ax in axes.flat:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
    _save(fig, path)
    plt.close(fig)
    return path


def _line(ax: Any, xs: list, ys: list, label: str) -> None:
    points = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
    if points:
        ax.plot(*zip(*points, strict=True), marker="o", ms=3, label=label)


def _rows(path: Path) -> list[dict[str, Any]]:
    """The file's rows; a torn line (a run killed mid-write) is skipped, as the logger's resume drops it."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def write_curves(run_dir: str | Path) -> tuple[Path, Path] | None:
    """`curves.json` and `curves.png` beside the run's `metrics.jsonl`; None when the run logged no JSONL."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return None
    curves = run_curves(_rows(metrics))
    atomic_write_json(run_dir / "curves.json", curves)
    return run_dir / "curves.json", plot_curves(curves, run_dir / "curves.png")
