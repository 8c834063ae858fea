"""The viewer's spans: trained (loss_mask 1) and masked tool-output (0) runs, from ids or from stored texts."""

import pytest

from tirl.eval.evaluate import SampleRecord
from tirl.eval.samples import Sample
from tirl.eval.viewer import mask_spans, text_spans


def _decode(ids: list[int]) -> str:
    return ",".join(map(str, ids))


def test_mask_spans_follow_loss_mask_runs() -> None:
    assert mask_spans([1, 2, 3, 4, 5], [1, 1, 0, 0, 1], _decode) == [
        {"m": 1, "t": "1,2"},
        {"m": 0, "t": "3,4"},
        {"m": 1, "t": "5"},
    ]
    assert mask_spans([], [], _decode) == []
    with pytest.raises(ValueError, match="differ in length"):
        mask_spans([1, 2], [1], _decode)


def _record() -> SampleRecord:
    return SampleRecord("m", "q", "s", 0, 1.0, 1.0, True, 1.0, "4", 1, 0, 2, 9, "answer")


def test_text_spans_interleave_turns_and_tool_responses() -> None:
    traj = {
        "turn_texts": ["call A", "call B", "answer"],
        "tool_calls": [{"turn": 1, "response": "out A"}, {"turn": 2, "response": "out B"}],
    }
    spans = text_spans(Sample(_record(), trajectory=traj))
    assert [(s["m"], s["t"]) for s in spans] == [
        (1, "call A"),
        (0, "out A"),
        (1, "call B"),
        (0, "out B"),
        (1, "answer"),
    ]
    raw = "think <tool_call>x</tool_call><tool_response>4\n</tool_response> so \\boxed{4}"
    spans = text_spans(Sample(_record(), raw_output=raw))
    assert [s["m"] for s in spans] == [1, 0, 1] and spans[1]["t"] == "<tool_response>4\n</tool_response>"
