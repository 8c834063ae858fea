"""`tirl compare` end to end on a tiny model: 2 arms x 2 seeds (and an arm whose override is bad), a planted
difference found with an interval that excludes 0, the report's structure, and a rerun that reuses every stage
and gives the same numbers.

The task is a stand-in small enough to learn in seconds ("Say 1." -> \\boxed{1}, answers 1 or 2, no tool): the
arithmetic demo's model needs minutes of SFT before it answers anything, and a difference between two arms that
both answer nothing cannot be seen. The planted difference: arm `frozen` trains its SFT at a learning rate of
1e-9 (0 is refused by the config) and never learns the answer format, arm `learns` does.
"""

from __future__ import annotations

import json
import random
from typing import Any

from tirl.cli import main
from tirl.tasks.arith.task import ArithOptions
from tirl.tasks.task import Task, TrainingData

TINY = [  # every stage at its smallest: 48 SFT steps (the format is learned by then), one RL step
    "task=test_demo_ablation_e2e:SAY",
    "task.num_sft=128",
    "task.num_rl=16",
    "task.num_test=10",
    "demo.warmup.epochs=0",
    "demo.tiny.hidden_size=64",
    "demo.tiny.intermediate_size=128",
    "demo.tiny.num_heads=2",
    "demo.tiny.num_kv_heads=2",
    "sft.epochs=6",
    "sft.batch_size=16",
    "sft.optim.lr=1e-2",
    "sft.optim.schedule=constant",
    "rl.steps=1",
    "rl.prompts_per_step=4",
    "rl.n=4",
    "rl.mini_batch_size=16",
    "eval.n=4",
    "agent.max_turns=1",
    "agent.max_response_tokens=16",
    "agent.max_tokens_per_turn=16",
    "reward.overlong=false",
    "threads=1",  # a model this small runs several times faster on one thread than on two shared cores
]


def _digits(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice((1, 2)) for _ in range(n)]


def _row(i: int, d: int, split: str) -> dict[str, Any]:
    return {
        "data_source": "test/say",
        "prompt": [{"role": "user", "content": f"Say {d}."}],
        "ability": "math",
        "reward_model": {"ground_truth": str(d), "style": "rule"},
        "extra_info": {"id": f"{split}-{i}"},
    }


def _rows(split: str, options: Any, seed: int) -> list[dict[str, Any]]:
    n, offset = (options.num_rl, 1) if split == "train" else (options.num_test, 2)
    return [_row(i, d, split) for i, d in enumerate(_digits(n, 10 * seed + offset))]


def _training_data(options: Any, seed: int, sandbox: Any, max_tool_response_chars: int) -> TrainingData:
    sft = [
        {
            "messages": [
                {"role": "user", "content": f"Say {d}."},
                {"role": "assistant", "content": f"\\boxed{{{d}}}"},
            ]
        }
        for d in _digits(options.num_sft, 10 * seed)
    ]
    return TrainingData(sft, _rows("train", options, seed), _rows("test", options, seed), [])


SAY = Task("say", tools=(), system_prompt="", rows=_rows, training_data=_training_data, options=ArithOptions)


def _numbers(report: dict) -> list:
    return [(c["arm"], c["metrics"]) for c in report["comparisons"]] + [
        (a, s["metrics"]) for a, s in report["arms"].items()
    ]


def test_compare_finds_a_planted_difference_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("TIRL_QUIET", "1")
    out = tmp_path / "cmp"
    args = [
        "compare",
        "--out",
        str(out),
        "--seeds",
        "2",
        "--arm",
        "learns",
        "--arm",
        "frozen:sft.optim.lr=1e-9",
    ]
    args += ["--arm", "bad:rl.optim.lr=0", *TINY]
    assert main(args) == 1  # an arm failed: said in the exit code, the others ran
    report = json.loads((out / "report.json").read_text())

    assert report["study"]["baseline"] == "learns" and report["study"]["seeds"] == [0, 1]
    assert set(report["failed"]) == {"bad"} and set(report["failed"]["bad"]) == {"0", "1"}
    assert "lr" in report["failed"]["bad"]["0"]
    done = {(r["arm"], r["seed"]): r for r in report["runs"] if r["status"] == "done"}
    assert set(done) == {(a, s) for a in ("learns", "frozen") for s in (0, 1)}
    assert done[("frozen", 0)]["own_sft"] and not done[("learns", 0)]["own_sft"]
    assert (out / "seed-0" / "sft" / "model").is_dir() and (
        out / "seed-1" / "sft-frozen" / "sft" / "model"
    ).is_dir()
    for arm in ("learns", "frozen"):
        a = report["arms"][arm]
        assert a["seeds"] == [0, 1] and a["pass@k"]["ks"] == [1, 2, 4]
        assert set(a["metrics"]["pass@1"]) == {"mean", "min", "max"}
        assert a["training"]["rollout/entropy"]["step"] == [0]
    assert report["arms"]["learns"]["metrics"]["pass@1"]["min"] > 0.2
    assert report["arms"]["frozen"]["metrics"]["pass@1"]["max"] == 0.0

    (cmp,) = report["comparisons"]
    d = cmp["metrics"]["pass@1"]
    assert cmp["arm"] == "frozen" and cmp["seeds"] == [0, 1] and d["problems"] == [10, 10]
    assert d["lo"] <= d["mean"] <= d["hi"] < 0  # the planted difference, its interval clear of 0
    assert cmp["direction"] == -1 and "frozen is lower" in cmp["line"]
    assert set(report["figures"]) == {"pass@k", "training"}
    assert all((out / f).is_file() for f in report["figures"].values())
    assert (out / "seed-1" / "analysis" / "report.json").is_file()

    model = out / "seed-0" / "rl-learns" / "model" / "model.safetensors"
    before = model.stat().st_mtime_ns
    assert main(args) == 1  # resumed: every stage reused, the same numbers
    assert model.stat().st_mtime_ns == before
    assert _numbers(json.loads((out / "report.json").read_text())) == _numbers(report)
