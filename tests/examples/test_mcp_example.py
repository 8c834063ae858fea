"""The MCP example (examples/mcp_tools/, public API only) runs: its server's tools answer through tirl, its verifier
grades, and `tirl rl` trains 2 RL steps on a tiny model with the task picked by its Python path."""

import json

import pytest

pytest.importorskip("mcp")

from tirl.chat.template import conversation_text  # noqa: E402
from tirl.chat.tool_formats.hermes import call_json, parse_tool_calls  # noqa: E402
from tirl.commands.run_config import TirlConfig  # noqa: E402
from tirl.commands.stages import build_renderer, run_rl  # noqa: E402
from tirl.core.config import load_config  # noqa: E402
from tirl.data.records import ProblemRow  # noqa: E402
from tirl.models.tiny import TinyModelConfig, build_tiny  # noqa: E402
from tirl.rewards.scoring import Response, grade_responses  # noqa: E402
from tirl.rewards.shaping import RewardConfig  # noqa: E402
from tirl.tasks import load_task  # noqa: E402

SPEC = "examples.mcp_tools.task:task"


@pytest.fixture(autouse=True)
def repo_on_path(monkeypatch, request):
    monkeypatch.syspath_prepend(str(request.config.rootpath))


def test_the_servers_tools_answer_and_the_verifier_grades():
    task = load_task(SPEC)
    assert [(t.name, t.sandbox) for t in task.tools] == [
        ("mountain_height", False),
        ("convert_length", False),
    ]
    calls = [("mountain_height", {"name": "Mount Denali"}), ("convert_length", {"value": 6190, "from_unit": "m",
             "to_unit": "ft"}), ("convert_length", {"value": 1, "from_unit": "m", "to_unit": "parsec"})]  # fmt: skip
    text = "".join(f"<tool_call>\n{call_json(name, args)}\n</tool_call>" for name, args in calls)
    out = task.toolset().execute(parse_tool_calls(text), None)
    assert [(o.status, o.text) for o in out[:2]] == [("ok", "6190 m"), ("ok", "20308.399")]
    assert out[2].status == "parse_error" and "'parsec' is not one of" in out[2].text
    problem = ProblemRow("p", "examples/mountains", [], "20308.40")
    answers = [Response(f"\\boxed{{{a}}}", problem) for a in ("20308", "20,308.4", "20310")]
    assert [g.correct for g in grade_responses(answers, RewardConfig())] == [True, True, False]


def tiny_model(tmp_path, cfg):
    task = load_task(SPEC)
    texts = []
    for split in ("train", "test"):
        for r in task.load_rows(split, cfg.task, cfg.seed):
            msgs = [{"role": "system", "content": task.system_prompt}, *r["prompt"]]
            texts.append(conversation_text(msgs, add_generation_prompt=True) + "\\boxed{12} <tool_call>")
    shape = TinyModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                            num_kv_heads=2)  # fmt: skip
    return build_tiny(tmp_path / "model-init", texts, shape, seed=0)


@pytest.mark.slow  # the tokenizer, the model, the sandbox pool, the MCP server and 2 RL steps
def test_tirl_rl_trains_two_steps_with_the_mcp_task(tmp_path):
    from tirl.commands.args import load_run_config

    class Args:
        config, command = None, "rl"
        overrides = [
            f"task={SPEC}", "rl.steps=2", "rl.prompts_per_step=2", "rl.n=2", "rl.mini_batch_size=4",
            "agent.max_response_tokens=24", "agent.max_tokens_per_turn=24", "logging.backends=[jsonl]",
            "sandbox.max_workers=1", "threads=1",
        ]  # fmt: skip

    cfg = load_run_config(Args)
    model = tiny_model(tmp_path, cfg)
    out = run_rl(cfg, tmp_path / "rl", model_path=model)
    assert (out / "config.json").is_file()
    steps = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2 and all("reward/mean" in s for s in steps)
    # each step re-rendered every trajectory and found the ids and loss mask the engine sampled (else it raises)
    assert all(s["rollout/retokenized_turn_share"] >= 0.0 for s in steps)
    # the server's tools are what the model is told about (Qwen formats list them in the system turn)
    from transformers import AutoTokenizer

    qwen = load_config(TirlConfig, None, [f"task.name={SPEC}", "chat.format=qwen2.5"])
    text = build_renderer(AutoTokenizer.from_pretrained(model), qwen).text([{"role": "user", "content": "q"}])
    for t in load_task(SPEC).tools:
        assert json.dumps(t.schema, ensure_ascii=False) in text
