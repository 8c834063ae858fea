"""Two RL steps whose rollouts are an agent program on the official OpenAI client (`agent.program.command`), on
the tiny model with the torch engine: the update trains on exactly the ids and log-probs the engine sampled."""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("openai")

from conftest import make_model, rl_trainer  # noqa: E402
from tirl.chat.template import ChatRenderer  # noqa: E402
from tirl.rollout.agent.config import AgentConfig, ProgramConfig  # noqa: E402
from tirl.rollout.engines.torch.engine import TorchEngine  # noqa: E402
from tirl.rollout.gateway.program import ProgramLoop  # noqa: E402
from tirl.tools.code_interpreter import CODE_INTERPRETER_SCHEMA  # noqa: E402
from tirl.train.optim import OptimConfig  # noqa: E402
from tirl.train.rl.trainer import RLConfig  # noqa: E402

AGENT = Path(__file__).resolve().parents[2] / "examples" / "openai_agent" / "agent.py"


class RecordingEngine(TorchEngine):
    """The torch engine, keeping every generation it returned."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.returned = []

    def generate(self, prompts, params, **kw):
        out = super().generate(prompts, params, **kw)
        self.returned += [(list(p), g) for p, g in zip(prompts, out, strict=True)]
        return out


def test_two_rl_steps_train_on_the_ids_the_engine_sampled_for_the_program(tokenizer, sandbox, tmp_path):
    torch.manual_seed(0)
    model = make_model(tokenizer)
    renderer = ChatRenderer(tokenizer, tools=[CODE_INTERPRETER_SCHEMA])
    engine = RecordingEngine(model, eos_ids=[renderer.eos_id], pad_id=renderer.pad_id)
    program = ProgramConfig(command=f"{sys.executable} {AGENT}", concurrency=4, timeout_s=120)
    cfg = AgentConfig(max_response_tokens=48, max_tokens_per_turn=24, program=program)
    agent = ProgramLoop(engine, renderer, sandbox, cfg, program)
    rows = [
        {
            "prompt": [{"role": "user", "content": f"What is {a} + {a}?"}],
            "reward_model": {"ground_truth": str(2 * a)},
        }
        for a in (1, 2)
    ]
    rl = RLConfig(steps=2, prompts_per_step=2, n=2, mini_batch_size=4, optim=OptimConfig(lr=1e-3))
    trainer = rl_trainer(model, tokenizer, agent, rows, rl, tmp_path)
    try:
        for _ in range(2):
            engine.returned.clear()
            m = trainer.step()
            assert m["agent/episodes"] == 4 and m["agent/crashed"] == m["agent/timeout"] == 0
            sampled = {(tuple(p), tuple(g.token_ids)): g.logprobs for p, g in engine.returned}
            for t in trainer.last_trajectories:
                assert t.response_ids  # each episode gave a trainable sample
                # every model span of the trajectory is one generation the engine returned, log-probs included
                start, stream = 0, t.prompt_ids
                while start < len(t.loss_mask):
                    end = start
                    while end < len(t.loss_mask) and t.loss_mask[end] == t.loss_mask[start]:
                        end += 1
                    if t.loss_mask[start]:
                        key = (tuple(stream + t.response_ids[:start]), tuple(t.response_ids[start:end]))
                        assert sampled[key] == t.logprobs[start:end]
                    start = end
    finally:
        agent.close()


def test_an_agent_program_is_refused_with_streaming_or_sampling_ahead():
    from tirl.train.rl.check import check_program

    program = ProgramConfig(command="python agent.py")
    check_program(RLConfig(), program)  # synchronous: fine
    check_program(RLConfig(off_policy_steps=1), ProgramConfig())  # no program: nothing to refuse
    with pytest.raises(ValueError, match="rl.off_policy_steps=0"):
        check_program(RLConfig(off_policy_steps=1), program)
    from tirl.rollout.config import RolloutConfig
    from tirl.train.rl.check import check_rl

    with pytest.raises(
        ValueError, match="agent.program.command runs each step's episodes"
    ):  # the stage's check
        check_rl(RLConfig(off_policy_steps=1), RolloutConfig(engine="vllm"), 1, program)


def test_a_split_episode_trains_each_run_of_calls_in_its_group(tokenizer, sandbox, tmp_path):
    """A program that edits the model's reply before asking again diverges: with on_divergence=split, an RL step
    trains both runs of calls as samples of the episode's group."""
    program_file = tmp_path / "editor.py"
    program_file.write_text(
        "import json, sys\n"
        "from openai import OpenAI\n"
        "e = json.loads(sys.stdin.read()); client = OpenAI(); msgs = list(e['messages'])\n"
        "first = client.chat.completions.create(model='p', messages=msgs).choices[0].message\n"
        "msgs += [{'role': 'assistant', 'content': (first.content or '') + ' (edited)'},\n"
        "         {'role': 'user', 'content': 'Go on.'}]\n"
        "last = client.chat.completions.create(model='p', messages=msgs).choices[0].message\n"
        "print(json.dumps({'answer': last.content}))\n"
    )
    torch.manual_seed(0)
    model = make_model(tokenizer)
    renderer = ChatRenderer(tokenizer)
    engine = RecordingEngine(model, eos_ids=[renderer.eos_id], pad_id=renderer.pad_id)
    program = ProgramConfig(command=f"{sys.executable} {program_file}", on_divergence="split", timeout_s=120)
    agent = ProgramLoop(
        engine, renderer, sandbox, AgentConfig(max_tokens_per_turn=8, program=program), program
    )
    rows = [
        {"prompt": [{"role": "user", "content": "What is 1 + 1?"}], "reward_model": {"ground_truth": "2"}}
    ]
    rl = RLConfig(steps=1, prompts_per_step=1, n=2, mini_batch_size=4, optim=OptimConfig(lr=1e-3))
    trainer = rl_trainer(model, tokenizer, agent, rows, rl, tmp_path)
    try:
        m = trainer.step()
    finally:
        agent.close()
    assert m["agent/episodes"] == 2 and m["agent/divergent"] == 2 and m["agent/samples"] == 4
    trajs = trainer.last_trajectories
    assert len(trajs) == 4 and {t.group for t in trajs} == {0} and all(t.response_ids for t in trajs)
