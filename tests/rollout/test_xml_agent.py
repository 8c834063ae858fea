"""The agent loop with Qwen3-Coder XML tool calls (`chat.tool_format: qwen3_xml`): calls parse with the tools'
types, malformed ones get the format's error text, and the token stream re-renders exactly (`check_rollout`)."""

from tirl.chat.template import ChatRenderer
from tirl.chat.tokcheck import check_rollout, check_rows
from tirl.rollout.agent.loop import AgentConfig, AgentLoop, stop_token_ids
from tirl.rollout.engines.base import RemoteModel
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Generation
from tirl.tools import CodeInterpreter, ToolSet, tool


@tool(sandbox=False)
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def xml_call(name, **params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


class ScriptedEngine(RemoteModel):
    """Returns the next scripted turn; a turn ending in </tool_call> stops there, as a stop token would."""

    def __init__(self, renderer, turns):
        self.renderer, self.turns = renderer, turns

    def generate(self, prompts, params, *, max_new_tokens=None, generator=None):
        ids = self.renderer.encode(self.turns.pop(0))
        reason = "stop" if ids[-1] == self.renderer.tool_call_end_id else "eos"
        ids = ids if reason == "stop" else ids + [self.renderer.eos_id]
        return [Generation(ids, [-0.5] * len(ids), reason)]


def test_xml_calls_run_typed_and_the_stream_re_renders_exactly(tokenizer, sandbox):
    tools = ToolSet([CodeInterpreter(), add])
    r = ChatRenderer(tokenizer, fmt="qwen2.5", tools=tools.schemas, tool_format="qwen3_xml")
    turns = [
        "Let me add.\n\n" + xml_call("add", a=2, b=40),
        xml_call("code_interpreter", code="x = '<b>'\nprint(x, 6 * 7)"),
        xml_call("add", a="two", b=1),
        "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</tool_call>",
        "The answer is \\boxed{42}.",
    ]
    prompt = [{"role": "user", "content": "q"}]
    loop = AgentLoop(ScriptedEngine(r, turns), r, sandbox, AgentConfig(max_response_tokens=4096), tools=tools)
    assert loop.stop_ids() == stop_token_ids(r, loop.config) == [r.tool_call_end_id]
    t = loop.run([prompt], SamplingParams())[0]
    got = [(c.name, c.arguments, c.status, c.response) for c in t.tool_calls]
    assert got[:2] == [
        ("add", {"a": 2, "b": 40}, "ok", "42"),
        ("code_interpreter", {"code": "x = '<b>'\nprint(x, 6 * 7)"}, "ok", "<b> 42\n"),
    ]
    assert got[2][2] == "parse_error" and "'a' of 'add' must be a JSON integer value" in got[2][3]
    assert got[3][2] == "parse_error" and "is not closed with </function>" in got[3][3]
    assert t.stop_reason == "answer" and t.turns == 5
    row = {"prompt_ids": t.prompt_ids, **t.to_dict()}
    divergence, drift = check_rollout(r, 1, prompt, row)
    assert divergence is None and drift == 0


def test_check_tokens_covers_xml_sft_rows(tokenizer):
    """`tirl check-tokens` on an SFT file written with XML calls: piecewise ids equal the whole text's."""
    r = ChatRenderer(tokenizer, fmt="qwen3", tools=ToolSet([add]).schemas, tool_format="qwen3_xml")
    call = {"function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    msgs = [
        {"role": "user", "content": "2 + 3?"},
        {"role": "assistant", "content": "Adding.", "tool_calls": [call]},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "\\boxed{5}"},
    ]
    ids, mask = r.render(msgs)
    res = check_rows(
        r, iter([(1, {"messages": msgs}), (2, {"messages": msgs, "input_ids": ids, "loss_mask": mask})])
    )
    assert res.rows == 2 and res.divergences == []
    assert "<function=add>\n<parameter=a>\n2\n</parameter>" in tokenizer.decode(ids)
