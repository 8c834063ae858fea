"""Two-number additions graded by the last number of the answer: a reward a 135M pretrained model can earn.

    tirl rl --config src/tirl/configs/smollm2.yaml task=examples.smollm2_addition.task:task rollout.engine=vllm

SmolLM2-135M-Instruct scores 0 on GSM8K and on the demo's arithmetic because it almost never writes `\\boxed{}`,
so RL on those gets no signal (every reward -1). Here it answers "What is 14 + 15?" correctly about one time in
ten at temperature 1 ("14 + 15 = 29"), so GRPO groups have both rewards and RL has something to push. The verifier
takes the last integer of the response: lenient on purpose, and open to a policy that learns to end on the right
number for the wrong reason; it is a demonstration of RL on a real model, not a benchmark. No tools: the model was
not trained on a tool format.
"""

from __future__ import annotations

import random
import re

from tirl.rewards import GradeResult, register_verifier
from tirl.tasks import Task

SOURCE = "examples/addition"
_INT = re.compile(r"-?\d+")


def last_integer(text: str) -> str | None:
    found = _INT.findall(text.replace(",", ""))
    return found[-1] if found else None


def grade_last_integer(response: str, ground_truth, *, timeout_s: float = 1.0) -> GradeResult:
    pred = last_integer(response)
    ok = pred is not None and int(pred) == int(str(ground_truth))
    return GradeResult(1.0 if ok else -1.0, ok, pred)


register_verifier("last_integer", grade_last_integer, timeout_s=1.0, replace=True)


def make_rows(split: str) -> list[dict]:
    """All pairs 2..30 + 2..30, shuffled once: the first 64 are the test split, the rest train."""
    pairs = [(a, b) for a in range(2, 31) for b in range(2, 31)]
    random.Random(0).shuffle(pairs)
    chosen = pairs[:64] if split == "test" else pairs[64:]
    return [
        {
            "data_source": SOURCE,
            "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
            "ability": "math",
            "reward_model": {"ground_truth": str(a + b)},
            "extra_info": {"id": f"add-{a}-{b}"},
        }
        for a, b in chosen
    ]


def rows(split: str, options, seed: int) -> list[dict]:
    return make_rows("train" if split == "train" else "test")


task = Task("smollm2_addition", tools=[], verifier="last_integer", data_sources=(SOURCE,), rows=rows)
