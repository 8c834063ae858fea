"""What a comparison is: arms (a name and the dotted overrides that make it differ from the base config), which
arm is the baseline, how many seeds, and where the arms start from. Also the two ways to write arms down: `--arm
NAME:key=value,key=value` on the command line and a small YAML file.

Deliberately not here: running anything. An arm's overrides are only checked when its config is built
(`arm_config`), so a bad one fails that arm alone, with the override's own error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tirl.core.config import ConfigError, apply_overrides, from_dict, to_dict
from tirl.core.yamlread import read_yaml_file

if TYPE_CHECKING:
    from tirl.commands.run_config import TirlConfig

STARTS = ("sft", "init")  # sft: arms share each seed's SFT model; init: every arm trains its own SFT
TRAINS = ("rl", "sft")  # what an arm trains up to, and whose model is evaluated and compared
STAGE_SETS = ("tiny", "smollm2")  # which demo's stages run the arms (`tirl.demo.ablation.starts.STAGE_SETS`)
START_LABEL = "sft"  # the label of the shared SFT model's evaluation (Study.evaluate_start)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# an arm's name is part of directory names (`eval-NAME`, `sft-NAME`, `rl-NAME`), which tirl stages as
# `.eval-NAME.tirl-HOST-PID.XXXXXXXX.tmp`: 39 bytes around it, within a file system's 255 for one name
MAX_NAME_CHARS = 100
MAX_SEEDS = 1000
_NEXT_KEY = re.compile(
    r",(?=\s*[A-Za-z_][\w.]*=)"
)  # a comma that starts the next key=value (not one in [0.6,1])


@dataclass(frozen=True)
class Arm:
    """One arm: its name (a directory name too) and the dotted overrides it applies to the base config.

    `sft_data`: an arm that changes the SFT rows rather than a config key names the rows it trains SFT on instead
    of the base's (`sampled`, of the SmolLM2 stages: the trajectories the seed's shared SFT model samples and gets
    right); it trains its own SFT model, from the base model."""

    name: str
    overrides: tuple[str, ...] = ()
    note: str = ""  # what the arm stands for, shown in the report
    sft_data: str = ""

    def __post_init__(self) -> None:
        if len(self.name) > MAX_NAME_CHARS:
            raise ConfigError(
                f"arm name {self.name[:20]!r}... has {len(self.name)} characters: at most {MAX_NAME_CHARS} (it names "
                "the arm's directories)"
            )
        if not _NAME.match(self.name) or self.name == START_LABEL:
            raise ConfigError(
                f"arm name {self.name!r}: letters, digits, '.', '_' and '-', not starting with a punctuation mark, "
                f"and not {START_LABEL!r} (the shared SFT model's label)"
            )


@dataclass(frozen=True)
class Study:
    """A comparison: `arms` against `baseline` (an arm's name), over `seeds` seeds from the base config's seed.

    `expect`: the claim being tested, per arm: +1 if the arm should beat the baseline's pass@1, -1 if it should lose
    (an arm without one is reported without a verdict on a claim). `evaluate_start`: the shared SFT model is
    evaluated too and analysed with the arms (as the pass@k comparison needs). `train`: rl (each arm trains RL
    from its SFT model, and the RL model is compared) or sft (the arms' SFT models are compared; no RL).
    `stages`: the demo whose stages run (tiny, or smollm2: SmolLM2-135M-Instruct with vLLM)."""

    name: str
    arms: tuple[Arm, ...]
    baseline: str = ""  # empty: the first arm
    seeds: int = 1
    start: str = "sft"
    expect: Mapping[str, int] = field(default_factory=dict)
    evaluate_start: bool = False
    summary: str = ""
    train: str = "rl"
    stages: str = "tiny"

    def __post_init__(self) -> None:
        names = [a.name for a in self.arms]
        if not names:
            raise ConfigError(
                "a comparison needs arms: give --preset, --arm NAME:key=value,... or --arms FILE"
            )
        if len(set(names)) != len(names):
            raise ConfigError(f"arm names must be unique, got {names}")
        if self.baseline and self.baseline not in names:
            raise ConfigError(f"--baseline {self.baseline!r} is not an arm; arms: {names}")
        if not 1 <= self.seeds <= MAX_SEEDS:  # each seed trains every arm: more is a typo, not a study
            raise ConfigError(f"--seeds must be 1-{MAX_SEEDS}, got {self.seeds}")
        if self.start not in STARTS:
            raise ConfigError(f"--start {self.start!r}; valid: {', '.join(STARTS)}")
        if self.train not in TRAINS or self.stages not in STAGE_SETS:
            raise ConfigError(
                f"train {self.train!r}, stages {self.stages!r}; valid: {', '.join(TRAINS)} and {', '.join(STAGE_SETS)}"
            )
        bad = {a: s for a, s in self.expect.items() if a not in names or s not in (1, -1)}
        if bad:
            raise ConfigError(f"expect: arms of the study with +1 or -1, got {bad}")

    @property
    def baseline_arm(self) -> str:
        return self.baseline or self.arms[0].name


def parse_arm(text: str) -> Arm:
    """`NAME:key=value,key=value` (or `NAME` alone: the base config as it is) -> an Arm."""
    name, sep, rest = text.partition(":")
    overrides = tuple(o.strip() for o in _NEXT_KEY.split(rest) if o.strip()) if sep else ()
    for o in overrides:
        if "=" not in o:
            raise ConfigError(f"--arm {text!r}: {o!r} is not key=value (write NAME:key=value,key=value)")
    return Arm(name.strip(), overrides)


def _flatten(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """{rl: {loss: {clip_high: 0.2}}} or {rl.loss.clip_high: 0.2} -> ["rl.loss.clip_high=0.2"] (values written as
    YAML)."""
    out = []
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out += _flatten(value, f"{dotted}.")
        else:
            text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip()
            out.append(f"{dotted}={text.removesuffix('...').strip()}")
    return out


def read_arms_file(path: str | Path) -> tuple[list[Arm], str]:
    """Arms (and an optional baseline) from YAML: `arms: {NAME: {key: value, ...}, ...}`, `baseline: NAME`."""
    path = Path(path)
    data = read_yaml_file(path, "--arms")  # a key given twice (two arms of one name) is refused there
    if not isinstance(data, Mapping) or not isinstance(data.get("arms"), Mapping):
        raise ConfigError(f"--arms {path}: expected a mapping with 'arms: {{NAME: {{key: value}}, ...}}'")
    unknown = set(data) - {"arms", "baseline"}
    if unknown:
        raise ConfigError(f"--arms {path}: unknown keys {sorted(unknown)}; valid: arms, baseline")
    return arms_of(data["arms"], f"--arms {path}"), str(data.get("baseline") or "")


def arms_of(section: Mapping[Any, Any], where: str) -> list[Arm]:
    """The arms of an `arms: {NAME: {key: value, ...}, ...}` section of the file `where` names."""
    arms = []
    for name, values in section.items():
        if not isinstance(name, str):  # `null:`, `~:`, `yes:` or `2024:` are YAML values, not names
            kind = "null" if name is None else f"{type(name).__name__} {name!r}"
            raise ConfigError(
                f"{where}: an arm name is read by YAML as {kind}, not text: quote it, or choose another"
            )
        if values is not None and not isinstance(values, Mapping):
            raise ConfigError(f"{where}: arm {name!r} must map keys to values")
        arms.append(Arm(name, tuple(_flatten(values or {}))))
    return arms


def with_overrides(cfg: TirlConfig, overrides: Sequence[str]) -> TirlConfig:
    """`cfg` with dotted overrides applied and every section checked again (a bad value names its key)."""
    if not overrides:
        return cfg
    cls = type(cfg)  # TirlConfig, not imported here: `tirl --help` builds this module's parser without torch
    return from_dict(cls, apply_overrides(to_dict(cfg), list(overrides), cls))


def arm_config(base: TirlConfig, arm: Arm) -> TirlConfig:
    """The arm's config: the base config with the arm's overrides; raises the override's own error."""
    try:
        return with_overrides(base, arm.overrides)
    except (ConfigError, ValueError) as e:
        raise ConfigError(f"arm {arm.name!r}: {e}") from None
