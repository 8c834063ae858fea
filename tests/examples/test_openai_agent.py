"""examples/openai_agent: an agent program on the official OpenAI client, trained by `tirl rl` from the command
line (`agent.program.command`) on a tiny model of the demo's task."""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")

from tirl.chat.template import conversation_text  # noqa: E402
from tirl.cli import main  # noqa: E402
from tirl.models.tiny import TinyModelConfig, build_tiny  # noqa: E402
from tirl.tasks.arith.problems import generate_problems  # noqa: E402

AGENT = Path(__file__).resolve().parents[2] / "examples" / "openai_agent" / "agent.py"


def test_the_calculator_reads_arithmetic_only() -> None:
    sys.path.insert(0, str(AGENT.parent))
    try:
        import agent
    finally:
        sys.path.remove(str(AGENT.parent))
    assert agent.calculate("print(6 * 7)") == "42\n" and agent.calculate("1/4") == "0.25\n"
    assert agent.calculate("__import__('os').getcwd()").startswith("Error")
    assert agent.calculate("2 ** 10**9").startswith("Error")  # no powers: no huge numbers


@pytest.mark.slow  # ~20 s on 2 cores: 8 program runs, 2 RL steps, an evaluation of 6 episodes by 4 workers
def test_tirl_rl_trains_two_steps_through_the_agent_program(tmp_path) -> None:
    texts = [conversation_text([{"role": "user", "content": p.question}], add_generation_prompt=True) + f"{p.answer}"
             for p in generate_problems(200, seed=0)]  # fmt: skip
    shape = TinyModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                            num_kv_heads=2)  # fmt: skip
    model = build_tiny(tmp_path / "model", texts, shape, seed=0)
    args = [
        "rl", f"model.path={model}", "rl.steps=2", "rl.prompts_per_step=2", "rl.n=2", "rl.mini_batch_size=4",
        "agent.max_response_tokens=32", "agent.max_tokens_per_turn=16", "logging.backends=[jsonl]", "threads=1",
        f"agent.program.command={sys.executable} {AGENT}", "agent.program.timeout_s=120", "--out", str(tmp_path / "rl"),
    ]  # fmt: skip
    assert main(args) == 0
    steps = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2
    assert all(
        s["agent/episodes"] == 4 and s["agent/crashed"] == 0 and s["agent/timeout"] == 0 for s in steps
    )
    assert (tmp_path / "rl" / "model" / "config.json").is_file()
    # the trained model evaluated through the same program: one record per episode, pass@k as always
    command = [f"model.path={tmp_path / 'rl' / 'model'}", "eval.n=2", "eval.max_problems=3", "threads=1",
               f"agent.program.command={sys.executable} {AGENT}", "agent.max_tokens_per_turn=16"]  # fmt: skip
    assert main(["eval", *command, "agent.program.mode=worker", "--out", str(tmp_path / "eval")]) == 0
    records = (tmp_path / "eval" / "records.jsonl").read_text().splitlines()
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert len(records) == 6 and any("pass@2" in m for m in summary.values())
