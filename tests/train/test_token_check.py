"""The RL step's token check: the share of sampled turns whose ids are not the tokenizer's own encoding of their
text, and an error naming the trajectory when ids or masks disagree with their re-render."""

import pytest

from tirl.core.errors import TirlError
from tirl.data.records import ProblemRow
from tirl.rollout.agent.loop import AgentConfig, AgentLoop
from tirl.rollout.engines.base import RemoteModel
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Generation, Origin
from tirl.tools.code_interpreter import tool_call_json
from tirl.train.rl.token_check import token_fidelity

CALL = f"Let me run it.\n<tool_call>\n{tool_call_json('print(6 * 7)')}\n</tool_call>"


class SplitEngine(RemoteModel):
    """Samples a call then an answer; for prompt 0 the answer's ids are split one character per token (the same
    text, a non-canonical split)."""

    def __init__(self, renderer, prompts):
        self.renderer, self.turns = renderer, {}
        self.prompts = [renderer.prompt_ids(p) for p in prompts]

    def generate(self, prompts, params, *, max_new_tokens=None, generator=None):
        out = []
        for ctx in prompts:
            k = next(i for i, p in enumerate(self.prompts) if list(ctx[: len(p)]) == p)
            self.turns[k] = self.turns.get(k, 0) + 1
            if self.turns[k] == 1:
                ids = self.renderer.encode(CALL)
                out.append(Generation(ids, [-0.5] * len(ids), "stop"))
                continue
            text = "The answer is 42."
            ids = (
                [i for ch in text for i in self.renderer.encode(ch)] if k == 0 else self.renderer.encode(text)
            )
            out.append(Generation(ids + [self.renderer.eos_id], [-0.5] * (len(ids) + 1), "eos"))
        return out


def _trajectories(renderer, sandbox):
    prompts = [[{"role": "user", "content": f"question {i}"}] for i in range(2)]
    engine = SplitEngine(renderer, prompts)
    origins = [Origin(ProblemRow(f"p{i}", "test", p, "42"), sample=i) for i, p in enumerate(prompts)]
    loop = AgentLoop(
        engine, renderer, sandbox, AgentConfig(max_response_tokens=4096, max_tokens_per_turn=1024)
    )
    return loop.run(prompts, SamplingParams(), origins=origins)


def test_the_share_of_retokenized_turns_is_logged(renderer, sandbox):
    trajs = _trajectories(renderer, sandbox)
    assert [t.turns for t in trajs] == [2, 2]
    assert token_fidelity(trajs, renderer, "tirl") == {"rollout/retokenized_turn_share": 1 / 4}
    assert token_fidelity(trajs[1:], renderer, "tirl") == {"rollout/retokenized_turn_share": 0.0}


def test_a_mask_that_disagrees_with_the_re_render_is_an_error_naming_the_trajectory(renderer, sandbox):
    trajs = _trajectories(renderer, sandbox)
    tool_token = trajs[1].loss_mask.index(0)  # the first token of the tool turn
    trajs[1].loss_mask[tool_token] = 1
    with pytest.raises(TirlError, match=r"RL trajectory 2 of this step \(problem p1, sample 1\).*first mask"):
        token_fidelity(trajs, renderer, "tirl")


def test_ids_that_disagree_with_the_re_render_are_an_error(renderer, sandbox):
    trajs = _trajectories(renderer, sandbox)
    trajs[0].prompt_ids[-2] = renderer.eos_id  # a prompt the renderer would not write
    with pytest.raises(TirlError, match=r"RL trajectory 1 .*first ids divergence"):
        token_fidelity(trajs, renderer, "tirl")


def test_a_turn_cut_inside_a_character_is_checked_over_all_its_byte_tokens(renderer):
    """Two byte tokens of a three-byte character decode to one U+FFFD, as does the first alone: the turn's span is
    both (planted: a turn of 'é' then the first two bytes of '数', cut by the token budget)."""
    from tirl.chat.tokcheck import _sampled_span

    tok = renderer.tokenizer
    byte_ids = [tok.convert_tokens_to_ids(c) for c in ("Ã", "©", "æ", "ķ")]  # byte-level: 'é' and '数'[:2]
    text = tok.decode(byte_ids)
    assert text == "é\ufffd" and tok.decode(byte_ids[:3]) == text  # the shorter span decodes the same
    stored = byte_ids + [renderer.eos_id]
    assert _sampled_span(stored, 0, text, len(renderer.encode(text)), tok.decode) == 4
