"""Every count a config sets has an upper bound (`tirl.core.bounds.MAX_*`), refused as the config loads with its key,
before any work; the recipes' own values stay well inside."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from tirl.algorithms.losses import _LOSS_OPTIONS
from tirl.commands.run_config import TirlConfig
from tirl.core.bounds import MAX_IN_FLIGHT, check_range
from tirl.core.config import ConfigError, _dataclass_of, _hints, load_config
from tirl.tasks.task import TaskOptions

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "src" / "tirl" / "configs").glob("*.yaml"))
HUGE = 10**12
# int keys with no upper bound, each for a reason
UNBOUNDED = {
    "eval.max_problems": "a cap that only shortens the list of rows read (0 = all): a huge one holds nothing more",
}


def _int_keys(cls: type, prefix: str) -> list[str]:
    """The dotted names of every int field under the config dataclass `cls` (nested sections followed)."""
    hints, out = _hints(cls), []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        sub = _dataclass_of(hints[f.name])
        if sub is not None:
            out += _int_keys(sub, f"{prefix}{f.name}.")
        elif (
            hints[f.name] is int
            or re.search(r"\bint\b", str(hints[f.name]))
            and "list" not in str(hints[f.name])
        ):
            out.append(prefix + f.name)
    return out


def _every_int_key() -> list[tuple[str, tuple[str, ...]]]:
    """(key, the overrides that select its section's variant) for the root and every task and loss variant."""
    keys = [(k, ()) for k in _int_keys(TirlConfig, "")]
    for task in ("arith", "gsm8k"):
        keys += [(k, (f"task.name={task}",)) for k in _int_keys(TaskOptions.config_variant(task), "task.")]
    for loss, options in _LOSS_OPTIONS.items():
        keys += [(k, (f"rl.loss.name={loss}",)) for k in _int_keys(options, "rl.loss.")]
    return sorted(set(keys))


def test_the_key_walk_finds_nested_and_variant_keys() -> None:
    keys = {k for k, _ in _every_int_key()}
    assert {
        "eval.n",
        "rl.stream.buffer_groups",
        "demo.tiny.num_layers",
        "task.num_val",
        "rl.loss.norm_len",
    } <= keys


@pytest.mark.parametrize(("key", "variant"), [kv for kv in _every_int_key() if kv[0] not in UNBOUNDED])
def test_a_huge_count_is_refused_naming_its_key(key: str, variant: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(TirlConfig, None, [*variant, f"{key}={HUGE}"])
    assert key.rsplit(".", 1)[-1] in str(exc.value)


def test_eval_n_of_a_billion_is_refused_at_load() -> None:
    said = "eval.n=1000000000 must be an integer with 1 <= eval.n <= 65536"
    with pytest.raises(ConfigError, match=re.escape(said)):
        load_config(TirlConfig, None, ["eval.n=1000000000"])


def test_samples_times_problems_past_what_a_run_holds_is_refused_with_what_to_lower() -> None:
    said = f"eval.n=4096 x eval.batch_problems=32 = 131072 trajectories held at once: at most {MAX_IN_FLIGHT}"
    with pytest.raises(ConfigError, match=re.escape(said) + ".*lower eval.batch_problems"):
        load_config(TirlConfig, None, ["eval.n=4096"])
    load_config(TirlConfig, None, ["eval.n=4096", "eval.batch_problems=16"])  # the same n, fewer at once


def test_rl_group_times_prompts_past_what_a_step_holds_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=re.escape("rl.prompts_per_step=64 x rl.n=2048 = 131072 trajectories")
    ):
        load_config(TirlConfig, None, ["rl.prompts_per_step=64", "rl.n=2048"])


def test_a_stream_buffer_past_what_a_run_holds_is_refused() -> None:
    overrides = [
        "rl.stream.enabled=true",
        "rl.stream.max_staleness=1000",
        "rl.n=16",
        "rl.prompts_per_step=64",
    ]
    with pytest.raises(ConfigError, match="trajectories the stream buffer holds"):
        load_config(TirlConfig, None, overrides)


def test_an_int_past_a_floats_range_is_refused_without_an_overflow() -> None:
    with pytest.raises(ValueError, match=r"must be an integer with 1 <= k <= 10"):
        check_range("k", 10**400, 1, 10)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_packaged_config_loads_within_the_bounds(path: Path) -> None:
    load_config(TirlConfig, path)


def test_pass_at_k_studies_sampling_a_thousand_per_problem_fit() -> None:
    load_config(TirlConfig, None, ["eval.n=1024", "eval.ks=[1,16,256,1024]", "eval.batch_problems=64"])
