"""Named comparisons: `tirl compare --preset NAME` (`--list-presets` prints them), each a YAML file of
`tirl/configs/compare/` a user can read, copy and run as `tirl compare --preset FILE`.

The algorithm presets (`clip-higher`, `loss-agg`, `tool-reward`, `kl`, `entropy-bonus`, and `algorithm`, all five in
one study) test the reference paper's claims about exploration on the demo's tiny model: each pits the plain setting
against the paper's choice, with everything else as the demo config has it, and `expect` says which way the paper
says it goes. The SmolLM2 presets (`lora`, `data`, `data-rl`) run SmolLM2-135M-Instruct's stages and are what `tirl
demo --model smollm2 --compare lora|data` runs. The objective presets (`passk`, `pkpo`, and any registered advantage
estimator that takes pass@k's k) are made here, from the estimator registry: what `tirl demo --compare OBJECTIVE`
runs, GRPO-TCR against that objective from one SFT checkpoint, the SFT model evaluated beside them at T = 0.6 and 1.0.

A preset file: `summary`, `arms` (an `--arms` file's `NAME: {dotted.key: value}`, the baseline first), and optionally
`notes` and `sft_data` (per arm), `expect` (arm: +1 or -1), `seeds`, `evaluate_start`, `train`, `stages`, `config`
(its base config, a file of `tirl/configs/`) and `overrides` (dotted overrides of the base config, before the
user's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tirl.algorithms import ADVANTAGE_ESTIMATORS
from tirl.core.config import ConfigError
from tirl.core.yamlread import read_yaml_file
from tirl.demo.ablation.arms import Arm, Study, arms_of

PRESETS = Path(__file__).resolve().parents[2] / "configs" / "compare"
OBJECTIVE_TEMPERATURES = (0.6, 1.0)  # `tirl demo --compare`'s default --temperatures
STUDY_KEYS = ("summary", "seeds", "evaluate_start", "train", "stages", "expect")
KEYS = ("arms", "notes", "sft_data", "config", "overrides", *STUDY_KEYS)


@dataclass(frozen=True)
class Preset:
    """A study by name, with the base overrides it needs (applied before the user's own) and its packaged base
    config (a file of `tirl/configs/`; empty: the demo's)."""

    study: Study
    base_overrides: tuple[str, ...] = field(default_factory=tuple)
    config: str = ""


def _per_arm(data: Mapping[str, Any], key: str, names: list[str], where: str) -> dict[str, str]:
    values = data.get(key) or {}
    if not isinstance(values, Mapping) or set(values) - set(names):
        raise ConfigError(f"{where}: {key} maps arms of the preset to text, got {values!r}")
    return {str(k): str(v) for k, v in values.items()}


def read_preset(path: str | Path, name: str = "") -> Preset:
    """The preset a YAML file describes (module docstring), named `name` (default: the file's stem)."""
    path = Path(path)
    where = f"--preset {path}"
    data = read_yaml_file(path, "--preset")
    if not isinstance(data, Mapping) or not isinstance(data.get("arms"), Mapping):
        raise ConfigError(f"{where}: expected a mapping with 'arms: {{NAME: {{key: value}}, ...}}'")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; valid: {', '.join(KEYS)}")
    arms = arms_of(data["arms"], where)
    names = [a.name for a in arms]
    notes, sft_data = _per_arm(data, "notes", names, where), _per_arm(data, "sft_data", names, where)
    arms = [Arm(a.name, a.overrides, notes.get(a.name, ""), sft_data.get(a.name, "")) for a in arms]
    overrides = data.get("overrides") or []
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"{where}: overrides is a list of dotted key=value, got {overrides!r}")
    study = {k: data[k] for k in STUDY_KEYS if data.get(k) is not None}
    try:
        made = Study(name or path.stem, tuple(arms), **study)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None
    return Preset(made, tuple(overrides), str(data.get("config") or ""))


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


def packaged() -> dict[str, Preset]:
    """The presets of `tirl/configs/compare/`, by name."""
    return {p.stem: read_preset(p) for p in sorted(PRESETS.glob("*.yaml"), key=lambda p: p.stem)}


def preset_names() -> list[str]:
    """Every preset: the packaged ones on the tiny demo's stages, the objectives, then the SmolLM2 ones."""
    files = packaged()
    tiny = [n for n, p in files.items() if p.study.stages == "tiny"]
    return [*tiny, *objectives(), *(n for n in files if n not in tiny)]


def get_preset(name: str) -> Preset:
    """The preset called `name`, or the one in file `name` (a path ending in .yaml); an unknown name lists the
    valid ones."""
    if name.endswith((".yaml", ".yml")):
        return read_preset(name)
    if (PRESETS / f"{name}.yaml").is_file():
        return read_preset(PRESETS / f"{name}.yaml")
    if name in objectives():
        return objective_preset(name)
    raise ConfigError(
        f"unknown preset {name!r}; valid: {', '.join(preset_names())}, or a preset file (.yaml)"
    )


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
