"""Named comparisons: `tirl compare --preset NAME` (`--list-presets` prints them).

The algorithm presets test the reference paper's claims about exploration on the demo's tiny model: each pits the
plain setting (the baseline, first) against the paper's choice, with everything else as the demo config has it, and
`expect` says which way the paper says it goes. The demo config already uses the paper's choices (clip 0.2/0.28,
token-mean, the tool-call term, no KL, no entropy bonus), so in each preset one arm is the demo as it is and both
arms spell their setting out. The entropy bonus has no claim: the recipe keeps entropy up with clip-higher alone
(docs/architecture.md) and leaves `rl.entropy_coef` at 0, so the preset only measures what a small bonus does.

The objective presets (`passk`, `pkpo`, and any registered advantage estimator that takes pass@k's k) are what
`tirl demo --compare OBJECTIVE` runs: GRPO-TCR against that objective from one SFT checkpoint, the SFT model
evaluated beside them at T = 0.6 and 1.0.

The SmolLM2 presets run SmolLM2-135M-Instruct's stages (`Study.stages`, its packaged config unless --config names
another) and are what `tirl demo --model smollm2 --compare lora|data` runs: `lora`, RL with a LoRA adapter against
RL on every weight from one SFT checkpoint; `data`, SFT on trajectories the stitched-SFT model sampled itself and got
right against SFT on the stitched ones (an arm that changes the SFT rows: `Arm.sft_data`), the SFT models compared
(`Study.train = "sft"`), on GSM8K; `data-rl`, the same arms after RL with the same settings from each arm's SFT
model (the paper compares the models after RL). `--compare data` runs both, the second reusing the first's SFT.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tirl.algorithms import ADVANTAGE_ESTIMATORS
from tirl.core.config import ConfigError
from tirl.demo.ablation.arms import Arm, Study

PAPER_SEEDS = 5  # the study: 5 seeds of the demo per preset
OBJECTIVE_TEMPERATURES = (0.6, 1.0)  # `tirl demo --compare`'s default --temperatures
LORA_RANK = 16
LORA_LR = 1e-4  # docs/configuration.md, "Memory options and LoRA": about 10x the full-parameter rate


# the data comparison's arms: SFT on stitched trajectories, or on the ones the stitched-SFT model sampled and got right
DATA_ARMS = (
    Arm("stitched", (), "SFT on stitched trajectories from the human solutions"),
    Arm("real", (), "SFT on the stitched-SFT model's own correct trajectories", sft_data="sampled"),
)


@dataclass(frozen=True)
class Preset:
    """A study by name, with the base overrides it needs (applied before the user's own) and its packaged base
    config (a file of `tirl/configs/`; empty: the demo's)."""

    study: Study
    base_overrides: tuple[str, ...] = field(default_factory=tuple)
    config: str = ""


def _paper(name: str, summary: str, plain: Arm, chosen: Arm, sign: int = 1, claim: bool = True) -> Preset:
    study = Study(
        name,
        (plain, chosen),
        seeds=PAPER_SEEDS,
        expect={chosen.name: sign} if claim else {},
        summary=summary,
    )
    return Preset(study)


ALGORITHM_PRESETS = {
    p.study.name: p
    for p in (
        _paper(
            "clip-higher",
            "clip-higher (eps 0.2/0.28) against symmetric clipping (0.2/0.2): the paper's exploration lever",
            Arm("symmetric", ("rl.loss.clip_low=0.2", "rl.loss.clip_high=0.2"), "clip 0.2/0.2"),
            Arm("clip-higher", ("rl.loss.clip_low=0.2", "rl.loss.clip_high=0.28"), "clip 0.2/0.28"),
        ),
        _paper(
            "loss-agg",
            "token-mean against sequence-mean loss aggregation (every token weighs the same vs every sequence)",
            Arm("seq-mean", ("rl.loss.agg=seq-mean-token-mean",), "seq-mean-token-mean"),
            Arm("token-mean", ("rl.loss.agg=token-mean",), "token-mean"),
        ),
        _paper(
            "tool-reward",
            "the recipe's tool-call reward term on wrong answers, off against on",
            Arm("no-tool-term", ("reward.tool_call_bonus=false",), "reward.tool_call_bonus off"),
            Arm("tool-term", ("reward.tool_call_bonus=true",), "reward.tool_call_bonus on"),
        ),
        _paper(
            "kl",
            "a small KL penalty to the SFT model (k3, 0.001) against none",
            Arm("small-kl", ("rl.kl.coef=0.001", "rl.kl.estimator=k3"), "KL k3, coefficient 0.001"),
            Arm("no-kl", ("rl.kl.coef=0.0",), "no KL"),
        ),
        _paper(
            "entropy-bonus",
            "an entropy bonus (0.001) against none; no claim: the recipe has none",
            Arm("no-bonus", ("rl.entropy_coef=0.0",), "no entropy bonus"),
            Arm("bonus", ("rl.entropy_coef=0.001",), "entropy bonus 0.001"),
            claim=False,
        ),
    )
}


def _algorithm_study() -> Preset:
    """The five algorithm claims in one study: the recipe as the demo has it (the baseline) against each plain
    setting, one setting changed per arm. Each seed's SFT model and the recipe's RL run are shared by all five
    comparisons (6 RL runs a seed where the five presets take 10), and `expect` says the recipe should win each
    one the paper makes a claim about."""
    recipe = Arm(
        "recipe",
        ("rl.loss.clip_low=0.2", "rl.loss.clip_high=0.28", "rl.loss.agg=token-mean", "reward.tool_call_bonus=true",
         "rl.kl.coef=0.0", "rl.entropy_coef=0.0"),
        "the demo's RL as it is: clip 0.2/0.28, token-mean, the tool-call term, no KL, no entropy bonus",
    )  # fmt: skip
    arms = (
        recipe,
        Arm("symmetric", ("rl.loss.clip_high=0.2",), "clip 0.2/0.2"),
        Arm("seq-mean", ("rl.loss.agg=seq-mean-token-mean",), "seq-mean-token-mean"),
        Arm("no-tool-term", ("reward.tool_call_bonus=false",), "reward.tool_call_bonus off"),
        Arm("small-kl", ("rl.kl.coef=0.001", "rl.kl.estimator=k3"), "KL k3, coefficient 0.001"),
        Arm("bonus", ("rl.entropy_coef=0.001",), "entropy bonus 0.001 (no claim)"),
    )
    claims = {
        "symmetric": -1,
        "seq-mean": -1,
        "no-tool-term": -1,
        "small-kl": -1,
    }  # the paper: the recipe wins
    return Preset(
        Study(
            "algorithm",
            arms,
            seeds=PAPER_SEEDS,
            expect=claims,
            summary="the five algorithm presets in one study: the recipe against symmetric clipping, sequence-mean "
            "aggregation, no tool-call term, a small KL and an entropy bonus, one setting each",
        )
    )


ALGORITHM_PRESETS["algorithm"] = _algorithm_study()


def objectives() -> list[str]:
    """The advantage estimators that take pass@k's k (rl.advantage.k): what `--compare` and the objective presets take."""
    return sorted(name for name, est in ADVANTAGE_ESTIMATORS.items() if "k" in est.hyperparameters)


def objective_preset(objective: str) -> Preset:
    """GRPO-TCR (`grpo`, the demo's RL, the baseline) against `objective`, the SFT model evaluated beside them."""
    if objective not in objectives():
        raise ConfigError(f"unknown comparison objective {objective!r}; valid: {objectives()}")
    temps = ",".join(f"{t:g}" for t in OBJECTIVE_TEMPERATURES)
    study = Study(
        objective,
        (
            Arm("grpo", (), "GRPO-TCR"),
            Arm(objective, (f"rl.advantage.name={objective}",), f"{objective} advantage"),
        ),
        evaluate_start=True,
        summary=f"GRPO-TCR against the {objective} objective from one SFT checkpoint, SFT evaluated beside them",
    )
    return Preset(study, (f"eval.temperatures=[{temps}]",))


SMOLLM2_PRESETS = {
    "lora": Preset(
        Study(
            "lora",
            (
                Arm("full", ("model.lora.rank=0",), "RL on every weight"),
                Arm(
                    "lora",
                    (f"model.lora.rank={LORA_RANK}", f"rl.optim.lr={LORA_LR:g}"),
                    "RL with a LoRA adapter",
                ),
            ),
            stages="smollm2",
            summary=f"RL with a rank-{LORA_RANK} LoRA adapter (lr {LORA_LR:g}) against RL on every weight, from one "
            "SFT checkpoint of SmolLM2-135M-Instruct",
        ),
        config="demo-smollm2.yaml",
    ),
    "data": Preset(
        Study(
            "data",
            DATA_ARMS,
            expect={"real": 1},
            train="sft",
            stages="smollm2",
            summary="SFT of SmolLM2-135M-Instruct on real sampled trajectories against stitched ones, on GSM8K",
        ),
        config="demo-smollm2-gsm8k.yaml",
    ),
    "data-rl": Preset(
        Study(
            "data-rl",
            DATA_ARMS,
            expect={"real": 1},
            stages="smollm2",
            summary="the data comparison after RL: GRPO-TCR with the same settings from each arm's SFT model (the "
            "real-trajectory one and the stitched one), the RL models compared, on GSM8K",
        ),
        config="demo-smollm2-gsm8k.yaml",
    ),
}


def preset_names() -> list[str]:
    return [*ALGORITHM_PRESETS, *objectives(), *SMOLLM2_PRESETS]


def get_preset(name: str) -> Preset:
    """The preset called `name`; an unknown name lists the valid ones."""
    if name in ALGORITHM_PRESETS:
        return ALGORITHM_PRESETS[name]
    if name in SMOLLM2_PRESETS:
        return SMOLLM2_PRESETS[name]
    if name in objectives():
        return objective_preset(name)
    raise ConfigError(f"unknown preset {name!r}; valid: {', '.join(preset_names())}")


def describe_presets() -> list[str]:
    """One line per preset: name, seeds, arms with their overrides, the baseline first."""
    lines = []
    for name in preset_names():
        p = get_preset(name)
        arms = "; ".join(
            f"{a.name}: {' '.join(a.overrides) or '(base config)'}{f' (SFT data: {a.sft_data})' * bool(a.sft_data)}"
            for a in p.study.arms
        )
        where = f"; config {p.config}" if p.config else ""
        lines.append(
            f"{name} ({p.study.seeds} seed{'s' * (p.study.seeds > 1)}{where}): {p.study.summary}. Arms: {arms}"
        )
    return lines
