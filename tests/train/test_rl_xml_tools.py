"""One RL step whose rollouts call the tool in Qwen3-Coder XML (`chat.tool_format: qwen3_xml`) on the tiny model:
the calls run, the results reach the model, and the update trains on the sampled ids."""

import torch

from conftest import make_model, rl_trainer
from tirl.chat.template import ChatRenderer
from tirl.rollout.agent.loop import AgentConfig, AgentLoop
from tirl.rollout.capabilities import EngineCapabilities
from tirl.rollout.engines.base import RemoteModel
from tirl.rollout.types import Generation
from tirl.tools.code_interpreter import default_tools
from tirl.train.optim import OptimConfig
from tirl.train.rl.trainer import RLConfig

CALL = "Let me run it.\n\n<tool_call>\n<function=code_interpreter>\n<parameter=code>\nprint(2 * 3)\n</parameter>\n"
CALL += "</function>\n</tool_call>"


class ScriptedXMLEngine(RemoteModel):
    """Writes an XML call, then (once the tool's result is in the context) an answer, right or wrong by turns;
    its log-probs are the model's own for those ids, as an engine sampling them would report."""

    capabilities = EngineCapabilities(
        name="scripted", weight_sync="memory", logprobs="full", per_request_seeds=False, multi_process=False,
        batches_requests=False,
    )  # fmt: skip

    def __init__(self, model, renderer):
        self.model, self.renderer, self.answers, self.contexts = model, renderer, 0, []
        self.weight_version = 0

    def generate(self, prompts, params, *, max_new_tokens=None, generator=None, seeds=None):
        out = []
        for ctx in prompts:
            text = self.renderer.tokenizer.decode(ctx)
            if "<tool_response>" in text:
                self.contexts.append(text)
                self.answers += 1
                ids = self.renderer.encode(f"\\boxed{{{6 if self.answers % 2 else 5}}}") + [
                    self.renderer.eos_id
                ]
                reason = "eos"
            else:
                ids, reason = self.renderer.encode(CALL), "stop"
            with torch.no_grad():
                logits = self.model(torch.tensor([list(ctx) + ids])).logits[0, len(ctx) - 1 : -1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
            out.append(Generation(ids, lp.tolist(), reason))
        return out

    def sync_weights(self, model):
        self.weight_version += 1

    def close(self):
        pass


def test_one_rl_step_with_xml_tool_calls(tokenizer, sandbox, tmp_path):
    torch.manual_seed(0)
    model = make_model(tokenizer)
    tools = default_tools()
    renderer = ChatRenderer(
        tokenizer, fmt="qwen2.5", tools=[t.schema for t in tools], tool_format="qwen3_xml"
    )
    engine = ScriptedXMLEngine(model, renderer)
    agent = AgentLoop(
        engine, renderer, sandbox, AgentConfig(max_response_tokens=200, max_tokens_per_turn=100)
    )
    rows = [
        {"prompt": [{"role": "user", "content": "What is 2 * 3?"}], "reward_model": {"ground_truth": "6"}}
    ]
    cfg = RLConfig(steps=1, prompts_per_step=1, n=4, mini_batch_size=4, optim=OptimConfig(lr=1e-3))
    before = [p.detach().clone() for p in model.parameters()]
    m = rl_trainer(model, tokenizer, agent, rows, cfg, tmp_path).step()
    assert m["rollout/tool_calls_per_response"] == 1.0 and m["rollout/tool_error_rate"] == 0.0
    assert len(engine.contexts) == 4
    assert all("<tool_response>\n6\n\n</tool_response>" in c for c in engine.contexts)
    assert m["rollout/retokenized_turn_share"] == 0.0  # the step's token check ran: every turn canonical
    assert abs(m["rollout/logprob_diff_mean"]) < 1e-4  # the trainer scores the very ids the engine sampled
    assert any((a != b).any() for a, b in zip(before, model.parameters()))
