"""Both examples (examples/, public API only) run: their tools answer, their verifier grades, and `tirl rl` trains
a few RL steps on a tiny model with each task picked by its Python path."""

import json

import pytest

from tirl.chat.template import conversation_text
from tirl.chat.tool_formats.hermes import call_json, parse_tool_calls
from tirl.commands.run_config import TirlConfig
from tirl.commands.stages import build_renderer, run_rl
from tirl.core.config import load_config
from tirl.data.records import ProblemRow
from tirl.models.tiny import TinyModelConfig, build_tiny
from tirl.rewards.scoring import Response, grade_responses
from tirl.rewards.shaping import RewardConfig
from tirl.tasks import load_task

GSM8K = "examples.gsm8k_calculator.task:task"
ELEMENTS = "examples.element_lookup.task:task"


@pytest.fixture(autouse=True)
def repo_on_path(monkeypatch, request):
    monkeypatch.syspath_prepend(str(request.config.rootpath))


def run_calls(task, *calls):
    text = "".join(f"<tool_call>\n{call_json(name, args)}\n</tool_call>" for name, args in calls)
    return [(o.status, o.text) for o in task.toolset().execute(parse_tool_calls(text), None)]


def test_calculator_tool_needs_no_sandbox():
    task = load_task(GSM8K)
    assert [t.sandbox for t in task.tools] == [False]
    assert run_calls(
        task,
        ("calculator", {"expression": "(16 - 3 - 4) * 2"}),
        ("calculator", {"expression": "1/3 + 1,000"}),
        ("calculator", {"expression": "__import__('os')"}),
        ("calculator", {"expr": "1"}),
    ) == [
        ("ok", "18"),
        ("ok", "3001/3 = 1000.33"),
        ("tool_error", "Error: ValueError: only numbers, + - * / // % ** and parentheses are allowed, not Call"),
        ("parse_error", "Error: bad arguments for tool 'calculator': unknown argument 'expr' (valid: expression); "
                        "missing required argument 'expression'."),
    ]  # fmt: skip


def test_element_task_has_two_tools_and_its_own_verifier(sandbox):
    task = load_task(ELEMENTS)
    assert [(t.name, t.sandbox) for t in task.tools] == [
        ("code_interpreter", True),
        ("lookup_element", False),
    ]
    out = task.toolset().execute(
        parse_tool_calls(
            f"<tool_call>\n{call_json('lookup_element', {'name': 'Carbon', 'field': 'atomic_mass'})}\n</tool_call>"
            f"<tool_call>\n{call_json('code_interpreter', {'code': '12.011 * 3'})}\n</tool_call>"
        ),
        sandbox,
    )
    assert [o.text for o in out] == ["12.011", "36.033\n"]
    problem = ProblemRow("p", "examples/elements", [], "36.03")
    answers = [Response(f"\\boxed{{{a}}}", problem) for a in ("36.033", "36.1")]
    assert [g.correct for g in grade_responses(answers, RewardConfig())] == [True, False]


ADDITION = "examples.smollm2_addition.task:task"


def test_addition_task_grades_the_last_integer_and_keeps_test_problems_out_of_training():
    task = load_task(ADDITION)
    assert task.tools == [] and task.verifier == "last_integer"
    cfg = TirlConfig()
    train, test = task.load_rows("train", cfg.task, cfg.seed), task.load_rows("test", cfg.task, cfg.seed)
    assert len(test) == 64 and len(train) == 29 * 29 - 64
    assert not {r["extra_info"]["id"] for r in train} & {r["extra_info"]["id"] for r in test}
    problem = ProblemRow("p", "examples/addition", [], "29")
    answers = ("14 + 15 = 29", "It is 2,9 or 29.", "14 + 15 = 28", "twenty-nine", "29 + 1 = 30")
    graded = grade_responses([Response(a, problem) for a in answers], RewardConfig())
    assert [g.correct for g in graded] == [True, True, False, False, False]


def tiny_model(tmp_path, task_spec, cfg):
    task = load_task(task_spec)
    texts = []
    for split in ("train", "test"):
        for r in task.load_rows(split, cfg.task, cfg.seed)[:200]:
            msgs = [{"role": "system", "content": task.system_prompt}, *r["prompt"]]
            texts.append(conversation_text(msgs, add_generation_prompt=True) + "\\boxed{12} <tool_call>")
    shape = TinyModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                            num_kv_heads=2)  # fmt: skip
    return build_tiny(tmp_path / "model-init", texts, shape, seed=0)


@pytest.mark.slow  # 6-11 s each on 2 CPU cores (tokenizer, model, sandbox pool, 2 RL steps)
@pytest.mark.parametrize("spec", [GSM8K, ELEMENTS])
def test_tirl_rl_trains_a_few_steps_with_the_example_task(spec, tmp_path):
    overrides = [
        f"task={spec}", "rl.steps=2", "rl.prompts_per_step=2", "rl.n=2", "rl.mini_batch_size=4",
        "agent.max_response_tokens=24", "agent.max_tokens_per_turn=24", "logging.backends=[jsonl]",
        "sandbox.max_workers=1", "threads=1",
    ]  # fmt: skip
    from tirl.commands.args import load_run_config

    class Args:
        config, command = None, "rl"

    Args.overrides = overrides
    cfg = load_run_config(Args)
    assert cfg.task.name == spec
    model = tiny_model(tmp_path, spec, cfg)
    out = run_rl(cfg, tmp_path / "rl", model_path=model)
    assert (out / "config.json").is_file()
    steps = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2 and all("reward/mean" in s for s in steps)
    # the task's tools are what the model is told about (Qwen formats list them in the system turn)
    qwen = load_config(TirlConfig, None, [f"task.name={spec}", "chat.format=qwen2.5"])
    from transformers import AutoTokenizer

    text = build_renderer(AutoTokenizer.from_pretrained(model), qwen).text([{"role": "user", "content": "q"}])
    for t in load_task(spec).tools:
        assert json.dumps(t.schema, ensure_ascii=False) in text


def test_a_bad_task_fails_at_start_naming_it(capsys):
    from tirl.cli import main

    assert main(["eval", "task=examples.nope:task"]) == 2
    assert main(["rl", "task=nosuch"]) == 2
    err = capsys.readouterr().err
    assert "task 'examples.nope:task': cannot import 'task' from 'examples.nope'" in err
    assert (
        "unknown task 'nosuch'; valid: aime24, aime25, amc23, arith, gpqa, gsm8k, gsm8k-fewshot, gsm8k-no-tool, "
        "humaneval, livecodebench, math500, verifiers:ENV or package.module:attribute" in err
    )
