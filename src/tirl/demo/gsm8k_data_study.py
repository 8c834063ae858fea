"""`tirl demo --model smollm2 --task gsm8k --study --compare data`: the study's data question at equal size and on
the same problems. Do SFT rows the model sampled itself beat stitched ones, before and after RL?

On the directory of a GSM8K study that has chosen its SFT model and filtered its RL problems (`gsm8k_study`, steps
1-3), into OUT_DIR/compare-data/:
1. sample: the study's chosen SFT model samples `SAMPLE_N` answers per problem of the study's SFT problems (in their
   order) at the rollout temperature with the real sandbox; the verified-correct ones, one per problem, are kept
   until `ROWS` problems have one (`tirl data sample --keep-retokenized`: a correct sample whose ids are not the
   tokenizer's own split is kept as its text, which SFT re-tokenizes; the summary counts them);
2. the study's stitched rows (the chosen style) of the same problems: the two SFT sets differ in where their
   trajectories come from and nothing else;
3. SFT from the base on each with the study's SFT settings (`sft-stitched`, `sft-real`), each evaluated on the
   test problems at the first evaluation temperature;
4. RL from each with the study's RL settings (without its validation curve) on the study's RL problems
   (`rl-stitched`, `rl-real`), evaluated the same way;
5. `tirl analyze` over the two SFT models (`analysis-sft/`) and over the two RL models (`analysis-rl/`): pass@k
   with paired intervals over problems, solvable sets.
Why the study's SFT model samples: the base never calls the tool in this format, so the first model with correct
tool trajectories to give is one SFT taught; what its 2,000 stitched rows taught it is in the sampled rows too.
Each stage is reused when made from the same inputs; the training stages continue from their newest checkpoint and
the sampling from its last finished chunk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tirl.commands.run_config import TirlConfig
from tirl.core.config import save_config
from tirl.core.logging import console
from tirl.data import read_rows, write_rows
from tirl.demo.compare_data import sample_real_rows
from tirl.demo.gsm8k_study import with_keys
from tirl.demo.smollm2 import import_base, print_table
from tirl.demo.stages import Model, Rows, Stages, earlier_times, every_weight, files_fingerprint

ROWS = 400  # SFT rows per arm
SAMPLE_N = 8  # answers per problem: at this model's pass@8 (~30%), 400 rows take ~1,400 of the 2,000 problems
ARMS = ("stitched", "real")


def study_state(out: Path) -> tuple[str, Path]:
    """(the study's chosen SFT style, its RL problems file); a clear error when the study has not got that far."""
    try:
        chosen = json.loads((out / "report.json").read_text(encoding="utf-8"))["sft_choice"]["chosen"]
    except (OSError, ValueError, KeyError, TypeError):
        chosen = None
    rl = out / "data" / "rl.jsonl"
    if chosen is None or not rl.is_file() or not (out / f"sft-{chosen}" / "model").is_dir():
        raise ValueError(
            f"{out}: the data comparison starts from a GSM8K study that has chosen its SFT model and filtered its "
            "RL problems (report.json's sft_choice, data/rl.jsonl); run `tirl demo --model smollm2 --task gsm8k "
            "--study` first"
        )
    return chosen, rl


def matched_rows(stitched: list[dict[str, Any]], sampled: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stitched rows of the sampled rows' problems, in the sampled rows' order."""
    by_id = {r["problem_id"]: r for r in stitched}
    missing = [r["problem_id"] for r in sampled if r["problem_id"] not in by_id]
    if missing:
        raise ValueError(f"sampled rows of problems without a stitched row: {missing[:5]}")
    return [by_id[r["problem_id"]] for r in sampled]


def sft_rows(run: Stages, study: Path, chosen: str) -> tuple[dict[str, Rows], int]:
    """Steps 1-2 (module docstring): each arm's SFT rows, the stitched ones written beside the sampled ones in
    OUT/data/, and the number of problems the sampler was given."""
    from tirl.tasks.gsm8k import sample_pool

    cfg = run.cfg
    stitched = read_rows(study / "data" / f"sft-{chosen}.jsonl")
    ids = {r["problem_id"] for r in stitched}
    pool = [r for r in sample_pool(cfg.task, cfg.seed) if r["extra_info"]["id"] in ids]
    sampler = study / f"sft-{chosen}" / "model"
    run.models["sft"] = Model(sampler, files_fingerprint(sampler))
    sampled = run.timed(
        "sample", sample_real_rows, run, pool, ROWS, n=SAMPLE_N, max_problems=len(pool), keep_retokenized=True
    )
    if not sampled:
        raise RuntimeError("the study's SFT model got no problem of its SFT pool right: nothing to compare")
    arms = {"stitched": matched_rows(stitched, sampled), "real": sampled}
    write_rows(run.out / "data" / "sft-stitched.jsonl", arms["stitched"])
    return arms, len(pool)


def train_and_evaluate(run: Stages, arms: dict[str, Rows], test: Rows, rl: Rows) -> None:
    """Steps 3-4 (module docstring): each arm's SFT, then its RL, each evaluated on the test problems."""
    cfg = run.cfg
    full = every_weight(cfg)
    first_t = with_keys(cfg, eval={"temperatures": [cfg.eval.all_temperatures[0]]})
    for arm in ARMS:
        describe = f"[bold]sft-{arm}[/]: from base on {len(arms[arm])} {arm} rows, every weight"
        data = (f"sft {arm} rows", arms[arm])
        run.train(f"sft-{arm}", "sft", "base", data, full, describe, resumable=True)
    for arm in ARMS:
        run.evaluate(f"sft-{arm}", ("test rows", test), first_t)
    for arm in ARMS:
        describe = f"[bold]rl-{arm}[/]: GRPO-TCR from sft-{arm}, {cfg.rl.steps} steps on {len(rl)} rows"
        run.train(f"rl-{arm}", "rl", f"sft-{arm}", ("rl rows", rl), full, describe, resumable=True)
        run.evaluate(f"rl-{arm}", ("test rows", test), first_t)


def run_study_data_comparison(cfg: TirlConfig) -> dict[str, Any]:
    """The comparison (module docstring) on the study in `cfg.out_dir`; returns compare-data/report.json."""
    from tirl.commands.stages import setup_torch
    from tirl.eval.report import print_summary, run_analyze

    study = Path(cfg.out_dir)
    chosen, rl_path = study_state(study)
    setup_torch(cfg)
    out = study / "compare-data"
    save_config(cfg, out / "config.yaml")
    times = earlier_times(out / "report.json")
    report: dict[str, Any] = {"task": "gsm8k study: data at equal size", "summary": {}, "seconds": times}
    test, rl = read_rows(study / "data" / "test.jsonl"), read_rows(rl_path)
    run = Stages(cfg, out, report, times)
    import_base(run)
    arms, pool = sft_rows(run, study, chosen)
    report["rows"] = {"sft": len(arms["real"]), "rl": len(rl), "pool": pool, "sampler": chosen}
    train_and_evaluate(run, arms, test, rl)
    report["models"] = {k: str(m.path) for k, m in run.models.items()}
    print_table(report["summary"])
    for kind in ("sft", "rl"):
        labels = [f"{kind}-{a}" for a in ARMS]
        result = run.timed(
            f"analyze_{kind}", run_analyze, [out / f"eval-{m}" for m in labels], out / f"analysis-{kind}",
            labels=list(ARMS),
        )  # fmt: skip
        report[f"analysis_{kind}"] = f"analysis-{kind}/report.json"
        print_summary(result, out / f"analysis-{kind}")
    run.save()
    console.print(f"stage seconds: {times}")
    return report
