"""`gsm8k-no-tool`, the arm that reasons in text alone: GSM8K's options, rows and verifier without a tool; no tool
in the system turn, and with `agent.max_turns: 1` a rollout is one turn in which nothing is run."""

from __future__ import annotations

from tirl.commands.run_config import TirlConfig
from tirl.commands.stages import build_agent, build_renderer
from tirl.core.config import load_config
from tirl.rollout.agent.loop import AgentConfig, AgentLoop
from tirl.rollout.engines.base import RemoteModel
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Generation
from tirl.tasks import load_task
from tirl.tasks.gsm8k import NO_TOOL_PROMPT, GSM8KOptions, gsm8k_rows

TASK = ["task.name=gsm8k-no-tool", "task.num_test=2", "task.levels=[1, 2]"]


def _config(tmp_path, *overrides: str) -> TirlConfig:
    return load_config(TirlConfig, None, [f"out_dir={tmp_path}", *TASK, *overrides])


def test_the_no_tool_task_is_gsm8k_without_its_tool(tmp_path):
    cfg = _config(tmp_path)
    task = load_task("gsm8k-no-tool")
    assert isinstance(cfg.task, GSM8KOptions) and task.toolset().schemas == []
    assert task.load_rows("test", cfg.task, 0) == gsm8k_rows("test", cfg.task, 0)
    assert "tool" not in NO_TOOL_PROMPT and "\\boxed{number}" in NO_TOOL_PROMPT


def test_its_system_turn_lists_no_tool(tmp_path, tokenizer):
    cfg = _config(tmp_path, "chat.format=qwen2.5")  # the format that lists a task's tools
    text = build_renderer(tokenizer, cfg).text([{"role": "user", "content": "q"}], add_generation_prompt=True)
    assert text.startswith(f"<|im_start|>system\n{NO_TOOL_PROMPT}<|im_end|>")
    assert "<tools>" not in text and "code_interpreter" not in text
    with_tool = build_renderer(tokenizer, _config(tmp_path, "chat.format=qwen2.5", "task.name=gsm8k"))
    assert "<tools>" in with_tool.text([{"role": "user", "content": "q"}], add_generation_prompt=True)


def test_a_rollout_of_the_tiny_model_is_one_turn_without_a_tool(tmp_path, model, tokenizer, sandbox):
    cfg = _config(
        tmp_path, "agent.max_turns=1", "agent.max_response_tokens=24", "agent.max_tokens_per_turn=24"
    )
    agent = build_agent(model, tokenizer, cfg, sandbox)
    prompts = [r["prompt"] for r in gsm8k_rows("test", cfg.task, cfg.seed)]
    trajs = agent.run(prompts * 2, SamplingParams(temperature=1.0))
    assert [t.turns for t in trajs] == [1] * 4
    assert all(t.tool_calls == [] and set(t.loss_mask) == {1} for t in trajs)  # every token sampled
    assert {t.stop_reason for t in trajs} <= {"answer", "turn_length", "budget", "max_turns"}


class WritesACall(RemoteModel):
    """Answers every prompt with a written code_interpreter call, stopped at `</tool_call>`."""

    def __init__(self, renderer):
        text = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1)"}}\n</tool_call>'
        self.ids = renderer.encode(text)

    def generate(self, prompts, params, *, max_new_tokens=None, generator=None):
        return [Generation(list(self.ids), [-0.5] * len(self.ids), "stop") for _ in prompts]


def test_a_written_call_is_the_answer_and_runs_nothing(tmp_path, tokenizer, sandbox):
    cfg = _config(tmp_path)
    renderer, task = build_renderer(tokenizer, cfg), load_task("gsm8k-no-tool")
    loop = AgentLoop(WritesACall(renderer), renderer, sandbox, AgentConfig(max_turns=1), tools=task.toolset())
    [t] = loop.run([[{"role": "user", "content": "q"}]], SamplingParams())
    assert t.turns == 1 and t.stop_reason == "max_turns" and t.num_tool_calls == 0 and set(t.loss_mask) == {1}
