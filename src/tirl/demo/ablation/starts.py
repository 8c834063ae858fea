"""How a comparison's arms start: a seed's data and SFT model (shared by the arms of a seed, or an arm's own), made
the tiny demo's way (`TinyStarts`) or SmolLM2's (`SmolLM2Starts`, the `lora` and `data` presets), each stage reused
when made from the same inputs (`tirl.demo.stages`).

The records and names are the demos' own (the tiny demo's `sft/model`, SmolLM2's `sft/model` from the imported
base), so a comparison reuses the checkpoints `tirl demo` left (`tirl demo --compare`). What an arm does from its
start (RL, evaluation) reads only a `Start`'s rows and model and is the same for both (`runner`). Not here: which
arm shares which start, or what happens when a stage fails (`runner`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tirl.commands.run_config import TirlConfig
from tirl.demo import smollm2, tiny
from tirl.demo.compare_data import sample_real_rows
from tirl.demo.stages import DemoRows, Model, Stages, config_inputs, every_weight

# the config sections an SFT model of the demos is made from, data included: arms that agree on them share it
SFT_SOURCES = ("model", "chat", "seed", "task", "sandbox", "sft")


@dataclass(frozen=True)
class Start:
    """A seed's data and SFT model: what the arms starting from it train RL from and are evaluated on; `run`, the
    stages that made it (its directory and models)."""

    data: DemoRows
    sft: Model
    run: Stages


def sft_sources(cfg: TirlConfig) -> dict[str, str]:
    """What decides an SFT model (and its data): two configs that agree here make the same one. The demos' SFT
    trains every weight whatever `model.lora` says, so LoRA is left out."""
    return config_inputs(every_weight(cfg), SFT_SOURCES)


class TinyStarts:
    """The tiny demo's start: its data, the model built from scratch and SFT (`tirl.demo.tiny`)."""

    def start(self, cfg: TirlConfig, out: Path) -> Start:
        """Data, the initial model and SFT into `out` (out/data, out/sft/model, ...), SFT reused when made from
        the same inputs."""
        run = Stages(cfg, out)
        data, init = tiny.prepare(cfg, out)
        return Start(data, tiny.train_sft(run, data, init), run)

    def data_start(self, cfg: TirlConfig, out: Path, source: str, shared: Start) -> Start:
        """An arm's start on other SFT rows (`Arm.sft_data`): the tiny demo has no other source of them."""
        raise ValueError(
            f"SFT data {source!r}: the tiny demo's stages have none (the smollm2 stages have 'sampled')"
        )


class SmolLM2Starts(TinyStarts):
    """`tirl demo --model smollm2`'s start: the base model imported, the task's demo data, SFT on every weight
    (`tirl.demo.smollm2.start`). An arm with `sft_data: sampled` trains SFT from the base model on the
    trajectories the shared SFT model samples and gets right (`tirl.demo.compare_data.sample_real_rows`, GSM8K
    only)."""

    SFT_DATA = ("sampled",)

    def start(self, cfg: TirlConfig, out: Path) -> Start:
        run = Stages(cfg, out)
        data = smollm2.start(run)
        return Start(data, run.models["sft"], run)

    def data_start(self, cfg: TirlConfig, out: Path, source: str, shared: Start) -> Start:
        """SFT from the base model on `source` rows into `out`/model: `sampled`, the shared SFT model's own correct
        trajectories on the task's sample pool (as many as it has SFT rows, or fewer), written to its data/."""
        from tirl.tasks.gsm8k import sample_pool

        if source not in self.SFT_DATA:
            raise ValueError(f"SFT data {source!r}; valid: {', '.join(self.SFT_DATA)}")
        if cfg.task.name != "gsm8k":
            raise ValueError(
                f"SFT data 'sampled' needs the gsm8k task (its sample pool), not {cfg.task.name!r}"
            )
        run = shared.run
        if out.parent != run.out:
            raise ValueError(f"{out}: an arm's own SFT model lies in the directory of the seed's shared one")
        real = sample_real_rows(run, sample_pool(cfg.task, cfg.seed), len(shared.data.sft_rows))
        if not real:
            raise RuntimeError("no correct sampled trajectory: nothing to train SFT on")
        describe = f"[bold]{out.name}[/]: from base on {len(real)} sampled rows, every weight"
        data = (f"{out.name} rows", real)
        return Start(shared.data, run.train(out.name, "sft", "base", data, every_weight(cfg), describe), run)


STAGE_SETS = {"tiny": TinyStarts, "smollm2": SmolLM2Starts}
