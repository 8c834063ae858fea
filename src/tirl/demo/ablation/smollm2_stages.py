"""The stages of a comparison on SmolLM2-135M-Instruct (`Study.stages = "smollm2"`: the `lora` and `data` presets,
which `tirl demo --model smollm2 --compare lora|data` runs): a seed's start is `tirl demo --model smollm2`'s own,
the base model imported, the task's demo data, SFT on every weight (`tirl.demo.smollm2.train_stage`, so the demo's
`sft/model` is reused when made from the same inputs); RL and evaluation are the tiny demo's (`pipeline`: they read
only a start's rows and model). An arm with `sft_data: sampled` trains SFT from the base model on the trajectories
the shared SFT model samples and gets right (`tirl.demo.compare_data.sample_real_rows`, GSM8K only).

Not here: the demo's own stages (base evaluation, its analysis and report: `tirl.demo.smollm2`).
"""

from __future__ import annotations

from pathlib import Path

from tirl.commands.run_config import TirlConfig
from tirl.demo import smollm2, tiny
from tirl.demo.ablation.pipeline import Start, evaluate, sft_sources, train_rl
from tirl.demo.compare_data import sample_real_rows
from tirl.demo.reuse import every_weight, files_fingerprint

__all__ = ["data_start", "evaluate", "prepare_start", "sft_sources", "train_rl"]
SFT_DATA = ("sampled",)


def prepare_start(cfg: TirlConfig, out: Path) -> Start:
    """The base model (imported from its GGUF when missing), the task's demo data in out/data and SFT into
    out/sft/model, reused when made from the same inputs."""
    base = smollm2.ensure_smollm2(Path(cfg.model.path))
    rows = tiny.demo_rows(cfg, out)
    run = smollm2.Run(cfg, out, rows, {"models": {}, "summary": {}}, {})
    run.models["base"], run.prints["base"] = base, files_fingerprint(base)
    describe = f"[bold]SFT[/] on {len(rows['sft_rows'])} tool trajectories, every weight"
    path = smollm2.train_stage(
        run, "sft", "sft", "base", ("sft rows", rows["sft_rows"]), every_weight(cfg), describe
    )
    return Start({**rows, "run": run}, path, run.prints["sft"])


def data_start(cfg: TirlConfig, out: Path, source: str, shared: Start) -> Start:
    """SFT from the base model on `source` rows into `out`/model: `sampled`, the shared SFT model's own correct
    trajectories on the task's sample pool (as many as it has SFT rows, or fewer), written to its data/."""
    from tirl.tasks.gsm8k import sample_pool

    if source not in SFT_DATA:
        raise ValueError(f"SFT data {source!r}; valid: {', '.join(SFT_DATA)}")
    if cfg.task.name != "gsm8k":
        raise ValueError(f"SFT data 'sampled' needs the gsm8k task (its sample pool), not {cfg.task.name!r}")
    run: smollm2.Run = shared.prep["run"]
    if out.parent != run.out:
        raise ValueError(f"{out}: an arm's own SFT model lies in the directory of the seed's shared one")
    want = len(run.rows["sft_rows"])
    real = smollm2.timed(run.times, "sample", sample_real_rows, run, sample_pool(cfg.task, cfg.seed), want)
    if not real:
        raise RuntimeError("no correct sampled trajectory: nothing to train SFT on")
    describe = f"[bold]{out.name}[/]: from base on {len(real)} sampled rows, every weight"
    data = (f"{out.name} rows", real)
    path = smollm2.train_stage(run, out.name, "sft", "base", data, every_weight(cfg), describe)
    return Start(shared.prep, path, run.prints[out.name])
