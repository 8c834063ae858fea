"""`tirl compare`'s arguments and what they become: the base config (the demo's, or --config, with the preset's
overrides and then the user's), the study (a preset's arms, then --arms FILE's, then each --arm), and the output
directory. The cli registers the parser and calls `main_compare`; the parser is built without importing torch (every
`tirl` command builds it), the rest imports what it needs when run.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from tirl.demo.ablation.arms import STAGE_SETS, STARTS, Study, parse_arm, read_arms_file

if TYPE_CHECKING:
    from tirl.commands.run_config import TirlConfig


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=None,
        help="base YAML config (default: the preset's, else the demo's configs/demo.yaml)",
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides of the base config, for every arm")
    p.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE,...",
        help="an arm: its name and the overrides it applies to the base config (repeat for each arm; NAME alone is "
        "the base config)",
    )
    p.add_argument(
        "--arms", default=None, metavar="FILE", help="arms from YAML: arms: {NAME: {key: value}}, baseline"
    )
    p.add_argument(
        "--preset",
        default=None,
        help="a named comparison (--list-presets: the files of tirl/configs/compare/), or a preset file (.yaml)",
    )
    p.add_argument("--list-presets", action="store_true", help="print the presets and exit")
    p.add_argument(
        "--seeds", type=int, default=None, help="seeds seed, seed+1, ... (default: the preset's, else 1)"
    )
    p.add_argument("--baseline", default="", help="the arm every other is compared with (default: the first)")
    p.add_argument(
        "--start",
        choices=STARTS,
        default="sft",
        help="sft: each seed's SFT model is trained once and shared by the arms with the base's SFT settings (an arm "
        "that changes them trains its own); init: every arm trains its own SFT from the built model",
    )
    p.add_argument(
        "--only",
        default="",
        metavar="NAME,NAME",
        help="run only these arms of the preset (or the file), e.g. the baseline and one other",
    )
    p.add_argument(
        "--stages",
        choices=STAGE_SETS,
        default=None,
        help="whose demo stages run the arms: tiny (the demo's ~1M-parameter model) or smollm2 (SmolLM2-135M-Instruct "
        "with vLLM, base config configs/demo-smollm2.yaml unless --config); default: the preset's, else tiny",
    )
    p.add_argument("--out", default=None, help="output directory (default: runs/compare-<preset, or arms>)")


def build_study(args: argparse.Namespace, default_config: Path) -> tuple[TirlConfig, Study]:
    """The base config and the study the arguments describe."""
    from tirl.commands.run_config import TirlConfig
    from tirl.core.config import ConfigError, load_config
    from tirl.demo.ablation.presets import get_preset

    preset = get_preset(args.preset) if args.preset else None
    arms = list(preset.study.arms) if preset else []
    baseline = preset.study.baseline if preset else ""
    if args.arms:
        more, file_baseline = read_arms_file(args.arms)
        arms += more
        baseline = baseline or file_baseline
    arms += [parse_arm(a) for a in args.arm]
    expect = dict(preset.study.expect) if preset else {}
    if args.only:
        only = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(only) - {a.name for a in arms})
        if unknown:
            raise ConfigError(f"--only {args.only!r}: no arm {unknown}; arms: {[a.name for a in arms]}")
        arms = [a for a in arms if a.name in only]
        expect = {a: s for a, s in expect.items() if a in only}
        if baseline and baseline not in only:
            baseline = ""
    # `task=NAME` is short for `task.name=NAME`, as in `tirl demo`
    own = [f"task.name={o[5:]}" if o.startswith("task=") else o for o in args.overrides]
    base_overrides = [*(preset.base_overrides if preset else ()), *own]
    stages = args.stages or (preset.study.stages if preset else "tiny")
    if preset and preset.config:
        packaged = default_config.parent / preset.config
    elif stages == "smollm2":
        packaged = default_config.parent / "demo-smollm2.yaml"  # the demo's arms on SmolLM2's own config
    else:
        packaged = default_config
    base = load_config(TirlConfig, args.config or packaged, base_overrides)
    study = Study(
        preset.study.name if preset else "arms",
        tuple(arms),
        baseline=args.baseline or baseline,
        seeds=args.seeds if args.seeds is not None else preset.study.seeds if preset else 1,
        start=args.start,
        expect=expect,
        evaluate_start=preset.study.evaluate_start if preset else False,
        summary=preset.study.summary if preset else "",
        train=preset.study.train if preset else "rl",
        stages=stages,
    )
    return base, study


def main_compare(args: argparse.Namespace, default_config: Path) -> int:
    """`tirl compare`; returns the exit code (1 when an arm failed: the report says which and why)."""
    from tirl.core.logging import console
    from tirl.core.rundir import claim
    from tirl.demo.ablation.presets import describe_presets
    from tirl.demo.ablation.report import run_comparison
    from tirl.demo.ablation.runner import Layout
    from tirl.train.signals import StopRequested

    if args.list_presets:
        for line in describe_presets():
            console.print(line, markup=False, soft_wrap=True)
        return 0
    base, study = build_study(args, default_config)
    out = Path(args.out or f"runs/compare-{study.name}")
    args.out = str(out)  # what an OSError without a file name is said to be about
    try:
        with claim(out, "compare"):
            report = run_comparison(base, study, Layout(out))
    except StopRequested as e:
        console.print(f"tirl compare: {e}; run the same command again to resume")
        return 130
    return 1 if report["failed"] else 0
