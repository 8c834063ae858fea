"""PNG plots of an analysis report (matplotlib, Agg backend): one figure per question, per data source.

Reads only the report dict, so plots can be redrawn from a saved report.json.
"""

from __future__ import annotations

import re
from pathlib import Path

from tirl.core.io import atomic_write_bytes


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-") or "source"


def _save(fig, path: Path) -> Path:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())
    return path


def _curves(ax, entry: dict, key: str, xs_key: str, *, log: bool) -> None:
    for i, (label, m) in enumerate(entry["models"].items()):
        color = f"C{i}"
        for j, (tkey, b) in enumerate(sorted(m["temperatures"].items())):
            c = b[key]
            if not b[xs_key]:  # maj@k of a counts-only run: skipped, nothing to draw
                continue
            style = ["-", "--", ":", "-."][j % 4]
            ax.plot(b[xs_key], c["mean"], style, color=color, marker="o", ms=3, label=f"{label} T={tkey}")
            ax.fill_between(b[xs_key], c["lo"], c["hi"], color=color, alpha=0.15)
        if key == "pass@k" and "envelope" in m:
            e = m["envelope"]
            ax.plot(
                e["ks"],
                e["pass@k"]["mean"],
                color=color,
                lw=2.5,
                alpha=0.6,
                label=f"{label} best T per k on test (upper bound)",
            )
    if log and ax.lines:  # a log axis without data cannot place its ticks
        _log_k_axis(ax)
    ax.set_ylim(-0.02, 1.02)


def _log_k_axis(ax) -> None:
    """Log-2 k axis labelled with plain numbers (1, 2, 4, ...) rather than powers."""
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(ax, title: str, xlabel: str, ylabel: str) -> None:
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # a single-run analysis has no comparison curve to label
        ax.legend(fontsize=7)


def plot_passk(source: str, entry: dict, path: Path) -> Path:
    """pass@k with bands per model and temperature (and envelope); paired differences with the crossover."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    _curves(axes[0], entry, "pass@k", "ks", log=True)
    _finish(axes[0], f"{source}: pass@k (unbiased), 95% bootstrap bands", "k", "pass@k")
    ax = axes[1]
    for i, c in enumerate(c for c in entry["comparisons"] if c.get("num_problems")):
        d, color = c["diff"], f"C{i + 1}"
        ax.plot(
            c["ks"],
            d["mean"],
            marker="o",
            ms=3,
            color=color,
            label=f"{c['other']} - {c['base']} ({c['condition']})",
        )
        ax.fill_between(c["ks"], d["lo"], d["hi"], color=color, alpha=0.15)
        if c["crossover"]["k"] is not None:
            ax.axvline(c["crossover"]["k"], color=color, ls=":", lw=1)
    ax.axhline(0, color="k", lw=0.8)
    _log_k_axis(ax)
    _finish(ax, "paired difference of pass@k (crossover dotted)", "k", "difference")
    _save(fig, path)
    plt.close(fig)
    return path


def plot_maj_cover(source: str, entry: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    _curves(axes[0], entry, "maj@k", "maj_ks", log=True)
    _finish(axes[0], f"{source}: maj@k (verifier-equivalent answers)", "k", "maj@k")
    for i, m in enumerate(entry["models"].values()):
        for j, (tkey, b) in enumerate(sorted(m["temperatures"].items())):
            c = b["cover"]
            style = ["-", "--", ":", "-."][j % 4]
            label = f"{list(entry['models'])[i]} T={tkey}"
            axes[1].plot(c["taus"], c["mean"], style, marker="o", ms=3, color=f"C{i}", label=label)
            axes[1].fill_between(c["taus"], c["lo"], c["hi"], color=f"C{i}", alpha=0.15)
    axes[1].set_ylim(-0.02, 1.02)
    _finish(axes[1], "Cover@tau: share of problems with success rate >= tau", "tau", "Cover@tau")
    _save(fig, path)
    plt.close(fig)
    return path


def plot_histograms(source: str, entry: dict, path: Path) -> Path:
    """Per-problem accuracy, one bar group per accuracy level: does RL push problems to 0 as well as to 1?"""
    plt = _pyplot()
    bars = [
        (f"{label} T={t}", b["histogram"])
        for label, m in entry["models"].items()
        for t, b in sorted(m["temperatures"].items())
    ]
    fig, ax = plt.subplots(figsize=(11, 3.6))
    labels = bars[0][1]["labels"]
    width = 0.8 / len(bars)
    for i, (name, h) in enumerate(bars):
        if h["labels"] == labels:  # a different n has other levels: its histogram is in report.json only
            ax.bar(
                [x + i * width for x in range(len(labels))],
                h["counts"],
                width=width,
                label=name,
                color=f"C{i}",
            )
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))], labels)
    _finish(ax, f"{source}: per-problem accuracy (correct samples / n)", "accuracy", "problems")
    _save(fig, path)
    plt.close(fig)
    return path


def plot_source(source: str, entry: dict, out_dir: Path, slug: str | None = None) -> list[tuple[str, Path]]:
    """The figures of one data source: [(title, path)]."""
    slug = slug or _slug(source)
    return [
        ("pass@k curves and paired difference", plot_passk(source, entry, out_dir / f"passk-{slug}.png")),
        ("maj@k and Cover@tau", plot_maj_cover(source, entry, out_dir / f"majk-cover-{slug}.png")),
        ("per-problem accuracy histogram", plot_histograms(source, entry, out_dir / f"hist-{slug}.png")),
    ]


def plot_report(report: dict, out_dir: str | Path) -> dict[str, list[tuple[str, Path]]]:
    """All figures, by data source (file names unique even when two sources slug alike, e.g. "a/b" and "a-b")."""
    out, used = {}, set()
    for src, entry in report["sources"].items():
        slug = base = _slug(src)
        for i in range(2, len(used) + 3):
            if slug not in used:
                break
            slug = f"{base}-{i}"
        used.add(slug)
        out[src] = plot_source(src, entry, Path(out_dir), slug)
    return out
