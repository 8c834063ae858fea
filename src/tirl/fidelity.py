"""`fidelity: recipe`: one switch that puts every setting where tirl and the reference recipe's code differ at the
recipe's value, so a run's numbers can be put next to the paper's.

`ROWS` is the table (docs/fidelity.md prints it): each row is one config key, tirl's default and the value that
reproduces Open-AgentRL (recipe/demystify at 1fe5dbd) and its verl fork. With `fidelity: recipe`, every row still at
tirl's default takes the recipe's value when the config is loaded; a row set to some third value (a longer sandbox
timeout, say) keeps it. The resolved values are what the run's config.yaml records. Under `fidelity: tirl` (the
default) nothing changes: each key can still be set by itself.

Not here: the behaviour behind each key (grading in rewards/, the token stream in chat/ and rollout/, ...).
"""

from __future__ import annotations

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
    Row("rl.rollout_correction", "auto", "none", "rollout correction (token TIS where engine and trainer round differently)"),
    Row("rollout.dtype", "auto", "bfloat16", "vLLM weights dtype"),
    Row("rl.token_mean", "exact", "micro", "token-mean policy loss normalization"),
    Row("sft.loss_mean", "token", "micro", "SFT loss normalization"),
    Row("agent.token_stream", "tirl", "verl", "the token stream before a tool turn"),
    Row("agent.malformed_calls", "feedback", "drop", "malformed tool calls"),
    Row("rl.eval_at_start", False, True, "validation before the first step"),
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


def apply_fidelity(cfg: Any, fidelity: str) -> None:
    """Set every row still at tirl's default to the recipe's value (in place), when `fidelity` is "recipe"."""
    if fidelity not in FIDELITIES:
        raise ValueError(f"unknown fidelity {fidelity!r}; valid: {', '.join(FIDELITIES)}")
    if fidelity == "tirl":
        return
    for row in ROWS:
        node, leaf = _section(cfg, row.key)
        if getattr(node, leaf) == row.tirl:
            setattr(node, leaf, row.recipe)


def departures(cfg: Any) -> list[Row]:
    """The rows where `cfg` does not do what the recipe does (empty for a faithful recipe config)."""
    return [row for row in ROWS if get_value(cfg, row.key) != row.recipe]


__all__ = ["FIDELITIES", "ROWS", "Row", "apply_fidelity", "departures", "get_value"]
