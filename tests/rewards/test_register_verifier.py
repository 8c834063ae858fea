"""A verifier registered from outside tirl: routing, grading (with its own time limit) and maj@k equivalence in
eval summaries and `tirl analyze`."""

import json
import re
import time

import pytest

from tirl.data.records import ProblemRow
from tirl.eval.evaluate import SampleRecord, summarize_records, write_eval
from tirl.rewards.math import GradeResult, last_boxed
from tirl.rewards.registry import register_verifier, route, verifier_for, verifier_name
from tirl.rewards.scoring import Response, grade_responses
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.types import Trajectory

_UNITS = {"km": 1000.0, "m": 1.0, "cm": 0.01}
_LENGTH = re.compile(r"^\s*([\d.]+)\s*(km|m|cm)\s*$")


def meters(answer: str) -> float | None:
    m = _LENGTH.match(answer)
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def same_length(a: str, b: str) -> bool:
    x, y = meters(a), meters(b)
    return x is not None and x == y


def grade_length(response: str, ground_truth, *, timeout_s: float) -> GradeResult:
    if "slowly" in response:
        time.sleep(2.0)
    pred = last_boxed(response)
    if pred is None:
        return GradeResult(-1.0, False, None, {"no_boxed": True})
    ok = same_length(pred, str(ground_truth))
    return GradeResult(1.0 if ok else -1.0, ok, pred)


register_verifier(
    "test_length",
    grade_length,
    timeout_s=0.2,
    equivalent=same_length,
    data_sources=("test/lengths",),
    replace=True,
)


def answer(text: str, source: str = "test/lengths") -> Response:
    return Response(text, ProblemRow("q0", source, [], "3 km"))


def traj(text: str, source: str) -> Trajectory:
    return Trajectory([1], [2], [1], [0.0], [text], problem=ProblemRow("q0", source, [], "3 km"))


def test_registered_verifier_routes_and_grades():
    assert verifier_name("TEST/lengths") == "test_length"
    got = grade_responses(
        [
            answer("\\boxed{3000 m}"),
            answer("\\boxed{2 km}"),
            answer("no box"),
            answer("slowly \\boxed{3 km}"),
        ],
        RewardConfig(),
    )
    assert [(g.correct, g.pred) for g in got[:3]] == [(True, "3000 m"), (False, "2 km"), (False, None)]
    assert got[3].details == {"timeout": True} and got[3].pred == "3 km"  # its own 0.2 s limit, not 5 s


def test_a_name_cannot_be_taken_twice_silently():
    with pytest.raises(ValueError, match="already registered"):
        register_verifier("test_length", grade_length)
    with pytest.raises(
        ValueError,
        match="unknown verifier 'nope'; valid: choice, code, (.*, )?gsm8k, integer, (.*, )?math, (.*, )?test_length",
    ):
        route("x", "nope")
    assert verifier_for("test/lengths").timeout_s == 0.2


def records(source: str) -> list[SampleRecord]:
    preds = ["3 km", "3000 m", "300000 cm", "2 km"]
    return [
        SampleRecord("m", "q0", source, k, 1.0, 1.0, k < 3, 1.0, p, 0, 0, 1, 5, "answer")
        for k, p in enumerate(preds)
    ]


def test_maj_at_k_uses_the_registered_equivalence_in_eval_and_tirl_analyze(tmp_path):
    from tirl.cli import main

    # three spellings of 3 km are one vote: maj@4 = 1; under string equality four answers tie: 3/4
    assert summarize_records(records("test/lengths"))["test/lengths"]["maj@4"] == 1.0
    assert summarize_records(records("other/lengths"))["other/lengths"]["maj@4"] == 0.75
    for source in ("test/lengths", "other/lengths"):
        trajs = [traj(f"\\boxed{{{r.pred}}}", source) for r in records(source)]
        write_eval(tmp_path / source.split("/")[0], records(source), trajs, {})
    assert main(["analyze", str(tmp_path / "test"), str(tmp_path / "other"), "--out", str(tmp_path / "a"),
                 "--labels", "a,b", "--no-viewer", "--bootstrap", "10"]) == 0  # fmt: skip
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    maj = {
        src: e["models"][label]["temperatures"]["1"]["maj@k"]["mean"][-1]
        for src, e in report["sources"].items()
        for label in e["models"]
    }
    assert maj == {"test/lengths": 1.0, "other/lengths": 0.75}
