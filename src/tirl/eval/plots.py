"""PNG plots of an analysis report (matplotlib, Agg backend): one figure per question, per data source.

Reads only the report dict, so plots can be redrawn from a saved report.json.
"""

from __future__ import annotations

import re
from pathlib import Path

from tirl.io import atomic_write_bytes


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
            style = ["-", "--", ":", "-."][j % 4]
            ax.plot(b[xs_key], c["mean"], style, color=color, marker="o", ms=3, label=f"{label} T={tkey}")
            ax.fill_between(b[xs_key], c["lo"], c["hi"], color=color, alpha=0.15)
        if key == "pass@k" and "envelope" in m:
            e = m["envelope"]
            ax.plot(
                e["ks"], e["pass@k"]["mean"], color=color, lw=2.5, alpha=0.6, label=f"{label} best T per k"
            )
    if log:
        ax.set_xscale("log", base=2)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot_source(source: str, entry: dict, out_dir: Path) -> list[tuple[str, Path]]:
    """The figures of one data source: [(title, path)]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    slug, made = _slug(source), []

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    _curves(axes[0], entry, "pass@k", "ks", log=True)
    axes[0].set(title=f"{source}: pass@k (unbiased), 95% bootstrap bands", xlabel="k", ylabel="pass@k")
    ax = axes[1]
    for i, c in enumerate(entry["comparisons"]):
        if not c.get("num_problems"):
            continue
        d = c["diff"]
        ax.plot(
            c["ks"],
            d["mean"],
            marker="o",
            ms=3,
            color=f"C{i + 1}",
            label=f"{c['other']} - {c['base']} ({c['condition']})",
        )
        ax.fill_between(c["ks"], d["lo"], d["hi"], color=f"C{i + 1}", alpha=0.15)
        if c["crossover"]["k"] is not None:
            ax.axvline(c["crossover"]["k"], color=f"C{i + 1}", ls=":", lw=1)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set(title="paired difference of pass@k (crossover dotted)", xlabel="k", ylabel="difference")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    made.append(("pass@k curves and paired difference", _save(fig, out_dir / f"passk-{slug}.png")))
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    _curves(axes[0], entry, "maj@k", "maj_ks", log=True)
    axes[0].set(title=f"{source}: maj@k (verifier-equivalent answers)", xlabel="k", ylabel="maj@k")
    for i, (label, m) in enumerate(entry["models"].items()):
        for j, (tkey, b) in enumerate(sorted(m["temperatures"].items())):
            c = b["cover"]
            axes[1].plot(
                c["taus"],
                c["mean"],
                ["-", "--", ":", "-."][j % 4],
                marker="o",
                ms=3,
                color=f"C{i}",
                label=f"{label} T={tkey}",
            )
            axes[1].fill_between(c["taus"], c["lo"], c["hi"], color=f"C{i}", alpha=0.15)
    axes[1].set(
        title="Cover@tau: share of problems with success rate >= tau",
        xlabel="tau",
        ylabel="Cover@tau",
        ylim=(-0.02, 1.02),
    )
    axes[1].grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    made.append(("maj@k and Cover@tau", _save(fig, out_dir / f"majk-cover-{slug}.png")))
    plt.close(fig)

    bars = [
        (f"{label} T={tkey}", b["histogram"])
        for label, m in entry["models"].items()
        for tkey, b in sorted(m["temperatures"].items())
    ]
    if bars:
        fig, ax = plt.subplots(figsize=(11, 3.6))
        labels = bars[0][1]["labels"]
        width = 0.8 / len(bars)
        for i, (name, h) in enumerate(bars):
            if h["labels"] != labels:
                continue  # a different n: its histogram is in report.json, not on this axis
            ax.bar(
                [x + i * width for x in range(len(labels))],
                h["counts"],
                width=width,
                label=name,
                color=f"C{i}",
            )
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))], labels)
        ax.set(
            title=f"{source}: per-problem accuracy (correct samples / n)",
            xlabel="accuracy",
            ylabel="problems",
        )
        ax.legend(fontsize=7)
        made.append(("per-problem accuracy histogram", _save(fig, out_dir / f"hist-{slug}.png")))
        plt.close(fig)
    return made


def plot_report(report: dict, out_dir: str | Path) -> dict[str, list[tuple[str, Path]]]:
    """All figures, by data source."""
    return {src: plot_source(src, entry, Path(out_dir)) for src, entry in report["sources"].items()}
