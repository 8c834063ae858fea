"""`gsm8k`: GSM8K's grade-school word problems with the code tool, the real benchmark `tirl demo --task gsm8k`
trains on (docs/gsm8k.md).

Splits, all fixed by the split seed (`task.split_seed`, or the run's `seed` when it is -1) and disjoint, so seeds
of training can share one split (`seed=1 task.split_seed=0`: seed 1's training on seed 0's problems):
- SFT: stitched trajectories (`stitch.py`) of train problems, from the front of the seed-shuffled train split;
- RL: `num_rl` train problems from the back of that order (never an SFT problem);
- sample pool (`sample_pool`): the train problems before the RL ones, SFT problems first, for sampling real
  end-to-end trajectories (`tirl demo --compare data`);
- test: `num_test` problems of GSM8K's test split, seed-shuffled (at most the split's problems within
  `task.levels`: 422 for levels [1, 2]; more is an error naming the count).

`task.levels` is the difficulty knob: the numbers of calculator steps (annotations in the human solution) a
problem may have, in every split; `[]` takes every problem. Prompts use the plain wording (a 135M model has never
seen the recipe's tool instructions; the system prompt says how to call the tool).

`gsm8k-no-tool` is the same task without a tool, for the arm that reasons in text alone: the same options, splits
and verifier, no tool listed or run, a system prompt without one (when `chat.system_prompt` is empty), and SFT rows
of the `plain` stitching style (the human solution with its annotations removed). Its runs set
`agent.max_turns: 1`, so whatever a turn writes is the answer (with no tool, a written call would only be answered
with an "unknown tool" error), and `reward.tool_call_bonus: false`.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tirl.core.bounds import MAX_ROWS, check_counts
from tirl.data.benchmarks import math_prompt
from tirl.tasks.gsm8k.data import DATA_SOURCES, gsm8k_answer, gsm8k_id, gsm8k_records, prepare_gsm8k
from tirl.tasks.gsm8k.stitch import StitchConfig, stitch_rows
from tirl.tasks.gsm8k.verifier import VERIFIER
from tirl.tasks.task import Task, TaskOptions, TrainingData, register_task

if TYPE_CHECKING:
    from tirl.sandbox.types import Sandbox

WORDING = "plain"
NO_TOOL_PROMPT = (
    "Solve it step by step. Answer as \\boxed{number}."  # gsm8k-no-tool's, when chat.system_prompt is ""
)
MAX_SPLIT_SEED = 2**32 - 1  # as the run's seed (`seed`, tirl.commands.run_config.MAX_SEED)
_ANNOTATION = re.compile(r"<<[^<>]*>>")


@dataclass
class GSM8KOptions(TaskOptions):
    """`task.*` of the gsm8k and gsm8k-no-tool tasks: split sizes, the difficulty knob, the split seed."""

    num_sft: int = 384  # stitched SFT trajectories, one per problem
    num_rl: int = 400
    num_test: int = 200  # held-out problems of the test split
    levels: list[int] = field(default_factory=list)  # calculator steps a problem may have; [] = any
    # a validation slice of the train split, from the end of the SFT part (the study's choices; 0 = none)
    num_val: int = 0
    split_seed: int = -1  # the seed that fixes every split; -1 = the run's `seed`

    def __post_init__(self) -> None:
        super().__post_init__()
        if min(self.num_sft, self.num_rl, self.num_test) < 1 or any(n < 1 for n in self.levels):
            raise ValueError("task.num_sft, num_rl, num_test and every task.levels entry must be >= 1")
        if self.num_val < 0:
            raise ValueError(f"task.num_val must be >= 0, got {self.num_val}")
        bounds = {
            "num_sft": (1, MAX_ROWS),
            "num_rl": (1, MAX_ROWS),
            "num_test": (1, MAX_ROWS),
            "num_val": (0, MAX_ROWS),
            "split_seed": (-1, MAX_SPLIT_SEED),
        }
        check_counts(self, "task", bounds)


def calculator_steps(record: dict[str, Any]) -> int:
    """GSM8K's own difficulty measure: the calculator annotations in the human solution."""
    return len(_ANNOTATION.findall(record["answer"]))


def _row(record: dict[str, Any], split: str, i: int) -> dict[str, Any]:
    return {
        "data_source": "gsm8k",
        "prompt": [{"role": "user", "content": math_prompt(record["question"], WORDING)}],
        "ability": "math",
        "reward_model": {"ground_truth": gsm8k_answer(record["answer"]), "style": "rule"},
        "extra_info": {"id": gsm8k_id(split, i), "steps": calculator_steps(record)},
    }


def split_seed(options: GSM8KOptions, seed: int) -> int:
    """The seed that fixes the splits: `task.split_seed`, or the run's `seed` when it is -1."""
    return seed if options.split_seed < 0 else options.split_seed


def _order(split: str, options: GSM8KOptions, seed: int) -> list[int]:
    """The split's indices whose step count is in `task.levels`, shuffled by the split seed."""
    levels = set(options.levels)
    records = gsm8k_records(split)
    keep = [i for i, r in enumerate(records) if not levels or calculator_steps(r) in levels]
    random.Random(f"gsm8k-{split}-{split_seed(options, seed)}").shuffle(keep)
    return keep


def _within(options: GSM8KOptions) -> str:
    levels = sorted(options.levels)
    return f"have {levels} calculator steps (task.levels)" if levels else "are in the split"


def _train_parts(options: GSM8KOptions, seed: int) -> tuple[list[int], list[int]]:
    """(front: SFT problems then the sample pool, back: the RL problems)."""
    order = _order("train", options, seed)
    t = options
    if t.num_rl + t.num_sft + t.num_val > len(order):
        raise ValueError(
            f"gsm8k: task.num_sft + num_rl + num_val = {t.num_sft + t.num_rl + t.num_val} but only {len(order)} "
            f"train problems {_within(t)}"
        )
    return order[: len(order) - t.num_rl], order[len(order) - t.num_rl :]


def gsm8k_rows(split: str, options: GSM8KOptions, seed: int) -> list[dict[str, Any]]:
    """RL problems for "train", the held-out problems for "test"."""
    if split == "train":
        records = gsm8k_records("train")
        return [_row(records[i], "train", i) for i in _train_parts(options, seed)[1]]
    records = gsm8k_records("test")
    order = _order("test", options, seed)
    if options.num_test > len(order):
        raise ValueError(
            f"gsm8k: task.num_test = {options.num_test} but only {len(order)} test problems {_within(options)}"
        )
    return [_row(records[i], "test", i) for i in order[: options.num_test]]


def sample_pool(options: GSM8KOptions, seed: int) -> list[dict[str, Any]]:
    """Train problems that are neither RL nor test problems, the SFT problems first (in order)."""
    records = gsm8k_records("train")
    return [_row(records[i], "train", i) for i in _train_parts(options, seed)[0]]


def study_splits(options: GSM8KOptions, seed: int) -> tuple[list[dict[str, Any]], list[int]]:
    """(the validation slice's rows: the last `num_val` problems of the front part; the train indices before
    them, the SFT pool of the GSM8K study)."""
    front, _ = _train_parts(options, seed)
    cut = len(front) - options.num_val
    records = gsm8k_records("train")
    return [_row(records[i], "train", i) for i in front[cut:]], front[:cut]


def gsm8k_training_data(
    options: GSM8KOptions, seed: int, sandbox: Sandbox, max_tool_response_chars: int, *, style: str = "code"
) -> TrainingData:
    """The first `num_sft` stitchable problems of the front part as SFT rows stitched in `style`; RL and test
    rows."""
    front, _ = _train_parts(options, seed)
    records = gsm8k_records("train")
    config = StitchConfig(wording=WORDING, max_tool_response_chars=max_tool_response_chars, style=style)
    want = options.num_sft
    take = front[: min(len(front), want + want // 4 + 16)]  # stitching keeps ~94%: a margin, then the rest
    rows, _ = stitch_rows([records[i] for i in take], [gsm8k_id("train", i) for i in take], sandbox, config)
    if len(rows) < want:
        rest = front[len(take) :]
        more, _ = stitch_rows(
            [records[i] for i in rest], [gsm8k_id("train", i) for i in rest], sandbox, config
        )
        rows += more
    if len(rows) < want:
        raise ValueError(f"gsm8k: only {len(rows)} stitchable train problems, task.num_sft = {want}")
    return TrainingData(rows[:want], gsm8k_rows("train", options, seed), gsm8k_rows("test", options, seed))


GRADED = {"verifier": VERIFIER, "data_sources": DATA_SOURCES}
register_task(
    Task(
        "gsm8k",
        **GRADED,
        rows=gsm8k_rows,
        training_data=gsm8k_training_data,
        options=GSM8KOptions,
        prepare=prepare_gsm8k,
    )
)
register_task(
    Task(
        "gsm8k-no-tool", **GRADED, tools=(), system_prompt=NO_TOOL_PROMPT, rows=gsm8k_rows,
        training_data=functools.partial(gsm8k_training_data, style="plain"), options=GSM8KOptions,
    )
)  # fmt: skip
