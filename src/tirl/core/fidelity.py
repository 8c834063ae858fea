"""`fidelity: recipe`: one switch that puts every setting where tirl and the reference recipe's code differ at the
recipe's value, so a run's numbers can be put next to the paper's.

`ROWS` is the table (docs/fidelity.md prints it): each row is one config key, tirl's default and the value that
reproduces Open-AgentRL (recipe/demystify at 1fe5dbd) and its verl fork. With `fidelity: recipe`, every row the
user's config file and overrides leave out takes the recipe's value when the config is loaded (`recipe_data`); a
row the user set keeps the user's value, even one equal to tirl's default. The resolved values are what the run's
config.yaml records. Under `fidelity: tirl` (the default) nothing changes: each key can still be set by itself.

Not here: the behaviour behind each key (grading in rewards/, the token stream in chat/ and rollout/, ...).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FIDELITIES = ("tirl", "recipe")


@dataclass(frozen=True)
class Row:
    """One difference: the dotted config key, tirl's default, the recipe's value, and what it is about."""

    key: str
    tirl: Any
    recipe: Any
    what: str


ROWS: tuple[Row, ...] = (
    Row("reward.grading", "verify", "math_dapo", "math and GPQA grading"),
    Row("rl.prompt_rewrite", "none", "verl", "RL training prompts (CustomRLHFDataset rewrites)"),
    Row("sandbox.timeout_s", 5.0, 30.0, "sandbox run timeout (s)"),
    Row("sandbox.memory_mb", 1024, 2048, "sandbox memory (MB)"),
    Row("reward.code_timeout_s", 10.0, 30.0, "code-test reward timeout (s)"),
    Row(
        "rl.correction.mode",
        "auto",
        "none",
        "rollout correction (token TIS where engine and trainer round differently)",
    ),
    Row("rollout.dtype", "auto", "bfloat16", "vLLM weights dtype"),
    Row("rl.loss.token_mean", "exact", "micro", "token-mean policy loss normalization"),
    Row("sft.loss_mean", "token", "micro", "SFT loss normalization"),
    Row("agent.token_stream", "tirl", "verl", "the token stream before a tool turn"),
    Row("agent.malformed_calls", "feedback", "drop", "malformed tool calls"),
    Row("rl.validation.at_start", False, True, "validation before the first step"),
    Row("eval.log_generations", 0, 20, "validation generations logged"),
)


def _section(cfg: Any, key: str) -> tuple[Any, str]:
    *path, leaf = key.split(".")
    node = cfg
    for part in path:
        node = getattr(node, part)
    return node, leaf


def get_value(cfg: Any, key: str) -> Any:
    node, leaf = _section(cfg, key)
    return getattr(node, leaf)


def check_fidelity(fidelity: str) -> None:
    if fidelity not in FIDELITIES:
        raise ValueError(f"unknown fidelity {fidelity!r}; valid: {', '.join(FIDELITIES)}")


def _is_set(data: Mapping[str, Any], key: str) -> bool:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def recipe_data(data: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a loaded config mapping with, under `fidelity: recipe`, every row it does not set at the recipe's
    value (nested mappings created as needed); unchanged under `fidelity: tirl`."""
    out = copy.deepcopy(dict(data))
    if out.get("fidelity") != "recipe":  # tirl, or a bad value the config's own check names
        return out
    for row in ROWS:
        if _is_set(out, row.key):
            continue
        *path, leaf = row.key.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = row.recipe
    return out


def departures(cfg: Any) -> list[Row]:
    """The rows where `cfg` does not do what the recipe does (empty for a faithful recipe config)."""
    return [row for row in ROWS if get_value(cfg, row.key) != row.recipe]


__all__ = ["FIDELITIES", "ROWS", "Row", "check_fidelity", "departures", "get_value", "recipe_data"]
