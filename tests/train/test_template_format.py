"""A model family with no hand-written chat format (a Llama-3-style template) trains through `chat.format:
template`: SFT on tool conversations, then one RL step whose rollouts re-render to the very ids sampled."""

import sys
from pathlib import Path

import torch

from conftest import make_agent, make_model, rl_trainer, sample_conversation
from tirl.chat.template import ChatRenderer
from tirl.chat.tokcheck import check_rollout
from tirl.rollout.sampling import SamplingParams
from tirl.train.optim import OptimConfig
from tirl.train.rl.trainer import RLConfig
from tirl.train.sft import SFTConfig, train_sft

sys.path.insert(0, str(Path(__file__).parents[1] / "chat"))
from family_templates import FAMILIES, with_family_tokens  # noqa: E402

PROMPT = [{"role": "user", "content": "What is 12 * 34?"}]


def test_sft_then_one_rl_step_through_a_llama_style_template(tokenizer, sandbox, tmp_path):
    tok = with_family_tokens(tokenizer, FAMILIES["llama3"][0])
    renderer = ChatRenderer(tok, fmt="template")
    assert renderer.eos_text == "<|eot_id|>"
    torch.manual_seed(0)
    model = make_model(tok).train()
    rows = [{"messages": sample_conversation()}] * 8
    first = train_sft(
        model, renderer, rows, SFTConfig(epochs=1, batch_size=4), pad_id=renderer.pad_id, seed=0
    )
    last = train_sft(
        model, renderer, rows, SFTConfig(epochs=6, batch_size=4, optim=OptimConfig(lr=3e-3)),
        pad_id=renderer.pad_id, seed=0,
    )  # fmt: skip
    assert last["sft/loss"] < first["sft/loss"]

    agent = make_agent(model, renderer, sandbox, max_tokens=48)
    trajs = agent.run([PROMPT] * 2, SamplingParams(), generator=torch.Generator().manual_seed(0))
    for k, t in enumerate(trajs):
        row = {"prompt_ids": t.prompt_ids, **t.to_dict()}
        assert check_rollout(renderer, k + 1, PROMPT, row)[0] is None  # ids and masks re-render exactly
    rl_rows = [{"prompt": PROMPT, "reward_model": {"ground_truth": "408"}}]
    cfg = RLConfig(steps=1, prompts_per_step=1, n=4, mini_batch_size=4, optim=OptimConfig(lr=1e-3))
    m = rl_trainer(model, tok, agent, rl_rows, cfg, tmp_path).step()
    assert m["rollout/sampled_tokens"] > 0 and "loss/pg" in m
    assert 0.0 <= m["rollout/retokenized_turn_share"] <= 1.0  # the step re-rendered every trajectory
