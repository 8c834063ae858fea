"""A Qwen3-like template that strips earlier reasoning trains with SFT under `chat.history: per_turn` (one sample
per assistant turn, loss on the turn alone), and RL with it is refused before an engine starts, naming the
template's divergence."""

import sys
from pathlib import Path

import pytest
import torch

from conftest import make_model
from tirl.chat.template import ChatRenderer
from tirl.chat.template_check import synthetic_conversation
from tirl.commands.run_config import TirlConfig
from tirl.commands.stages import build_agent
from tirl.core.config import load_config
from tirl.train.optim import OptimConfig
from tirl.train.sft import SFTConfig, render_rows, train_sft

sys.path.insert(0, str(Path(__file__).parents[1] / "chat"))
from family_templates import STRIPS_REASONING, with_family_tokens  # noqa: E402


def test_sft_with_per_turn_trains_each_turn_of_a_history_rewriting_template(tokenizer):
    tok = with_family_tokens(tokenizer, STRIPS_REASONING)
    renderer = ChatRenderer(tok, fmt="template", history="per_turn")
    rows = [{"messages": synthetic_conversation()}] * 4
    examples = render_rows(rows, renderer, max_length=1024)
    assert len(examples) == 4 * 3  # three assistant turns a row
    for ids, mask in examples[:3]:
        start = mask.index(1)
        assert sum(mask) == len(ids) - start and ids[-1] == renderer.eos_id  # the loss covers the turn alone
    torch.manual_seed(0)
    model = make_model(tok).train()
    first = train_sft(
        model, renderer, rows, SFTConfig(epochs=1, batch_size=4), pad_id=renderer.pad_id, seed=0
    )
    last = train_sft(
        model, renderer, rows, SFTConfig(epochs=6, batch_size=4, optim=OptimConfig(lr=3e-3)),
        pad_id=renderer.pad_id, seed=0,
    )  # fmt: skip
    assert last["sft/loss"] < first["sft/loss"]


def test_rl_with_per_turn_is_refused_before_an_engine_starts(tokenizer, sandbox):
    tok = with_family_tokens(tokenizer, STRIPS_REASONING)
    cfg = load_config(TirlConfig, None, ["chat.format=template", "chat.history=per_turn"])
    with pytest.raises(ValueError) as e:
        build_agent(make_model(tok), tok, cfg, sandbox)  # the RL and eval stages' agent
    msg = str(e.value)
    assert msg.startswith("chat.history=per_turn: sampling for RL, evaluation or tirl data sample needs each")
    assert "the chat template re-renders history: adding message" in msg and "SFT only" in msg


def test_a_row_without_an_assistant_turn_is_an_error_under_per_turn(tokenizer):
    renderer = ChatRenderer(tokenizer, history="per_turn")
    with pytest.raises(ValueError, match="SFT data: row 2: no assistant tokens to train on"):
        render_rows([{"messages": synthetic_conversation()[:3]}, {"messages": [{"role": "user", "content": "Hi."}]}],
                    renderer, max_length=1024)  # fmt: skip
