"""`tirl demo --model smollm2 --task gsm8k --study`: the GSM8K study, sized to answer its questions rather than
to finish in minutes (`configs/study-smollm2-gsm8k.yaml`, docs/gsm8k.md, "The study"; hours on 2 cores).

Stages, each reused when made from the same inputs (`tirl.demo.stages`); the training stages save checkpoints and
continue from the newest one when a run stopped midway (`Stages.train(resumable=True)`):
1. data (`study_rows`): the held-out test problems; of the train split (all within `task.levels`, disjoint, fixed
   by the split seed: `task.split_seed`, or `seed` when it is -1) the RL candidates (`task.num_rl`), a validation
   slice (`task.num_val`) and, of the others, the first `task.num_sft` that stitch in both styles (code: one call,
   no prose; text: the solution's sentences around one call per step), so the two SFT sets cover the same problems;
2. SFT from the base on each style's rows, each evaluated on the validation slice (`VAL_N` samples): the
   style with the higher pass@1 is the start (a tie: code). Chosen on train problems, never on test ones;
3. filter: the chosen SFT model samples `FILTER_K` answers per RL candidate at the rollout temperature, and the
   problems it solves sometimes (0 < rate < 1) are RL's (`tirl data filter`'s band and rows);
4. RL from the chosen SFT on them, validated on the validation slice every `rl.steps / VAL_POINTS` steps
   (`curves.png`, `curves.json` beside its metrics);
5. base, SFT and RL on the test problems at every `eval.temperatures` (the base at the first only), `tirl analyze`
   over the three and over RL against SFT;
6. transfer: SFT and RL on MATH500's level-1 and level-2 problems (`TRANSFER_N` samples), `tirl analyze` over
   the two (`analysis-math500/`: pass@1..TRANSFER_N with paired intervals).
`report.json` holds every summary, the style chosen and why, the filter's counts, RL's curves and each stage's
seconds.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tirl.commands.run_config import TirlConfig
from tirl.core.config import save_config, to_dict
from tirl.core.logging import console
from tirl.data import read_rows, write_rows
from tirl.demo.smollm2 import import_base, print_table
from tirl.demo.stages import (
    SAMPLE_KEYS,
    Rows,
    Stage,
    Stages,
    config_inputs,
    digest,
    earlier_times,
    every_weight,
    rows_input,
)

FILTER_K = 4  # answers per RL candidate: rates 0, 1/4, 1/2, 3/4, 1
VAL_N = 4  # samples per validation problem (SFT choice and RL's curve)
VAL_POINTS = 10  # validations during RL (every rl.steps / 10 steps), besides the one before the first step
TRANSFER_N = 8
TRANSFER_LEVELS = (1, 2)
STYLES = ("code", "text")


def data_inputs(cfg: TirlConfig) -> dict[str, str]:
    """The data stage's inputs: the task's options but `task.split_seed`, the seed that fixes the splits as
    `config seed`, and `agent.*` (the cut of the tool outputs). A config that leaves `task.split_seed` at -1 records
    what it recorded before the key existed, and a seed trained on another seed's split (`seed=1
    task.split_seed=0`) has that seed's data inputs."""
    from tirl.tasks.gsm8k import split_seed

    task = {k: v for k, v in to_dict(cfg.task).items() if k != "split_seed"}
    return {
        "config task": digest(task),
        "config seed": digest(split_seed(cfg.task, cfg.seed)),
        **config_inputs(cfg, ("agent",)),
    }


@dataclass(frozen=True)
class StudyRows:
    """The study's splits (module docstring, step 1): the held-out test problems, the validation slice, the RL
    candidates, and per style its stitched SFT rows (the same problems in both)."""

    test: Rows
    val: Rows
    rl_candidates: Rows
    sft: dict[str, Rows]

    def files(self) -> dict[str, Rows]:
        """Each split by its file's name in OUT/data/ (`NAME.jsonl`)."""
        sft = {f"sft-{style}": self.sft[style] for style in STYLES}
        return {"test": self.test, "val": self.val, "rl-candidates": self.rl_candidates, **sft}

    @classmethod
    def read(cls, data: Path) -> StudyRows:
        def rows(name: str) -> Rows:
            return read_rows(data / f"{name}.jsonl")

        return cls(rows("test"), rows("val"), rows("rl-candidates"), {s: rows(f"sft-{s}") for s in STYLES})


def study_rows(cfg: TirlConfig, out: Path) -> StudyRows:
    """The study's splits (module docstring), written to OUT/data/; reused when already written for the same
    task options and split seed (the stitched rows come from the sandbox and are identical on a rerun)."""
    from tirl.sandbox import build_sandbox
    from tirl.tasks.gsm8k import WORDING, gsm8k_id, gsm8k_records, gsm8k_rows, study_splits
    from tirl.tasks.gsm8k.stitch import StitchConfig, stitch_rows

    data = out / "data"
    stage = Stage("data", data / "sft-code.jsonl", data_inputs(cfg))
    names = ("test", "val", "rl-candidates", *(f"sft-{s}" for s in STYLES))
    if stage.reusable(all((data / f"{n}.jsonl").is_file() for n in names)):
        return StudyRows.read(data)
    val, pool = study_splits(cfg.task, cfg.seed)
    records = gsm8k_records("train")
    test, candidates = gsm8k_rows("test", cfg.task, cfg.seed), gsm8k_rows("train", cfg.task, cfg.seed)
    want = cfg.task.num_sft
    take = pool[: want + want // 4 + 16]  # stitching keeps ~94% of these problems: a margin
    stitched = {}
    with build_sandbox(cfg.sandbox) as sandbox:
        for style in STYLES:
            config = StitchConfig(
                wording=WORDING, max_tool_response_chars=cfg.agent.max_tool_response_chars, style=style
            )
            got, report = stitch_rows(
                [records[i] for i in take], [gsm8k_id("train", i) for i in take], sandbox, config
            )
            console.print(f"stitched ({style}): {report.kept} kept, dropped {dict(report.dropped)}")
            stitched[style] = {r["problem_id"]: r for r in got}
    both = [pid for pid in stitched["code"] if pid in stitched["text"]][:want]
    if len(both) < want:
        raise ValueError(f"gsm8k study: {len(both)} problems stitch in both styles, task.num_sft = {want}")
    rows = StudyRows(test, val, candidates, {s: [stitched[s][pid] for pid in both] for s in STYLES})
    for name, part in rows.files().items():
        write_rows(data / f"{name}.jsonl", part)
    stage.record()
    return rows


def with_keys(cfg: TirlConfig, **sections: dict[str, Any]) -> TirlConfig:
    """`cfg` with some keys of some sections replaced (`with_keys(cfg, eval={"n": 4})`)."""
    return dataclasses.replace(
        cfg, **{k: dataclasses.replace(getattr(cfg, k), **v) for k, v in sections.items()}
    )


def pass_at_1(summary: dict[str, Any]) -> float:
    return next(s["pass@1"] for s in summary.values() if isinstance(s, dict) and "pass@1" in s)


def choose_sft(run: Stages, full: TirlConfig, rows: StudyRows) -> str:
    """Both styles' SFT, each on the validation slice; the label of the better (module docstring, step 2), which
    becomes `run.models["sft"]`."""
    val_cfg = with_keys(full, eval={"n": VAL_N, "temperatures": [full.eval.all_temperatures[0]]})
    scores = {}
    for style in STYLES:
        sft = rows.sft[style]
        describe = f"[bold]SFT[/] ({style} style) on {len(sft)} stitched trajectories, every weight"
        run.train(f"sft-{style}", "sft", "base", (f"sft {style} rows", sft), full, describe, resumable=True)
        summary = run.evaluate(f"sft-{style}", ("val rows", rows.val), val_cfg, name=f"val-sft-{style}")
        scores[style] = pass_at_1(summary)
    best = max(STYLES, key=lambda s: (scores[s], s == "code"))
    run.report["sft_choice"] = {"validation_pass@1": scores, "chosen": best, "samples": VAL_N}
    console.print(f"SFT on the validation slice (pass@1): {scores}; RL starts from the {best} style")
    run.models["sft"] = run.models[f"sft-{best}"]
    run.save()
    return best


def filter_rl_rows(run: Stages, candidates: Rows) -> Rows:
    """The RL candidates the chosen SFT model solves sometimes (module docstring, step 3), with their rates."""
    from tirl.commands.stages import eval_reward, inference_agent
    from tirl.core.io import atomic_write_json
    from tirl.eval.pass_rate_filter import Band, filtered_rows
    from tirl.rollout.sampling import SamplingParams

    cfg, path, sft = run.cfg, run.out / "data" / "rl.jsonl", run.models["sft"]
    inputs = {
        **config_inputs(cfg, SAMPLE_KEYS),
        "model sft": sft.fingerprint,
        **rows_input("rl candidates", candidates),
    }
    stage = Stage("filter", path, {**inputs, "k": str(FILTER_K)})
    if stage.reusable(path.is_file()):
        return read_rows(path)
    params = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p)
    console.print(
        f"[bold]filter[/]: {FILTER_K} answers per RL candidate ({len(candidates)}), kept 0 < rate < 1"
    )
    with inference_agent(cfg, sft.path, run.out / "filter") as agent:
        rows, stats = filtered_rows(
            agent, candidates, Band(), FILTER_K, params=params, reward=eval_reward(cfg), seed=cfg.seed,
            batch_problems=cfg.eval.batch_problems,
        )  # fmt: skip
    atomic_write_json(path.with_name("rl.summary.json"), dataclasses.asdict(stats))
    if not rows:
        raise ValueError(
            f"the GSM8K study: the SFT model solves none of the {stats.problems} RL candidates sometimes "
            f"({stats.never} never, {stats.always} always, {FILTER_K} samples each): nothing for RL to learn from"
        )
    write_rows(path, rows)
    stage.record()
    return rows


def rl_curves(rl_dir: Path) -> dict[str, Any] | None:
    """RL's curves (validation pass@1, training reward, entropy, signal share; `rl/curves.json`) for report.json,
    so the report alone holds the run's learning curve; None when the run wrote none."""
    try:
        return json.loads((rl_dir / "curves.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def transfer_rows() -> list[dict[str, Any]]:
    from tirl.tasks.benchmarks import prepare_math500

    return [r for r in prepare_math500("plain") if r["extra_info"]["level"] in TRANSFER_LEVELS]


def run_gsm8k_study(cfg: TirlConfig) -> dict[str, Any]:
    """The whole study (module docstring); returns the report written to OUT_DIR/report.json."""
    from tirl.commands.stages import setup_torch

    if cfg.task.name != "gsm8k" or cfg.task.num_val < 1:
        raise ValueError(
            "the GSM8K study needs task gsm8k with task.num_val >= 1 (configs/study-smollm2-gsm8k.yaml)"
        )
    setup_torch(cfg)
    out = Path(cfg.out_dir)
    save_config(cfg, out / "config.yaml")
    times = earlier_times(out / "report.json")
    report: dict[str, Any] = {"task": "gsm8k study", "models": {}, "summary": {}, "seconds": times}
    run = Stages(cfg, out, report, times)
    import_base(run)
    rows = run.timed("data", study_rows, cfg, out)
    report["rows"] = {k: len(v) for k, v in rows.files().items()}
    full = every_weight(cfg)
    choose_sft(run, full, rows)
    rl_rows = run.timed("filter", filter_rl_rows, run, rows.rl_candidates)
    report["rows"]["rl"] = len(rl_rows)
    write_rows(out / "data" / "val-rl.jsonl", rows.val)
    rl_cfg = with_keys(
        full,
        rl={
            "validation": dataclasses.replace(
                cfg.rl.validation,
                data=[str(out / "data" / "val-rl.jsonl")],
                every=max(1, cfg.rl.steps // VAL_POINTS),
            )
        },
        eval={"n": VAL_N, "temperatures": [cfg.eval.all_temperatures[0]], "max_problems": 0},
    )
    describe = f"[bold]RL[/]: GRPO-TCR, {cfg.rl.steps} steps of {cfg.rl.prompts_per_step} x {cfg.rl.n} on {len(rl_rows)} problems"
    run.train("rl", "rl", "sft", ("rl rows", rl_rows), rl_cfg, describe, resumable=True)
    report["rl_curves"] = rl_curves(out / "rl")
    test = ("test rows", rows.test)
    first_t = with_keys(cfg, eval={"temperatures": [cfg.eval.all_temperatures[0]]})
    run.evaluate("base", test, first_t)
    for label in ("sft", "rl"):
        run.evaluate(label, test, cfg)
        transfer = with_keys(first_t, eval={"n": TRANSFER_N})
        run.evaluate(label, ("math500 level 1-2", transfer_rows()), transfer, name=f"math500-{label}")
    report["models"] = {k: str(m.path) for k, m in run.models.items()}
    print_table({k: v for k, v in report["summary"].items() if not k.startswith("val-")})
    run.timed("analyze", analyze_study, run)
    return report


ANALYSES = {  # folder: (its evaluations, its labels)
    "analysis": (["eval-base", "eval-sft", "eval-rl"], ["base", "sft", "rl"]),
    "analysis-vs-sft": (["eval-sft", "eval-rl"], ["sft", "rl"]),
    "analysis-math500": (["eval-math500-sft", "eval-math500-rl"], ["sft", "rl"]),
}


def analyze_study(run: Stages) -> None:
    """Step 5's and 6's `tirl analyze`: base, SFT and RL together, RL against SFT, and the transfer; each
    folder's report.json named in the study's."""
    from tirl.eval.report import print_summary, run_analyze

    results = {}
    for folder, (evals, labels) in ANALYSES.items():
        results[folder] = run_analyze([run.out / e for e in evals], run.out / folder, labels=labels)
        run.report[folder.replace("-", "_")] = f"{folder}/report.json"
    run.save()
    for folder, result in results.items():
        print_summary(result, run.out / folder)
