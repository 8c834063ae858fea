"""rollout_and_score, the one roll-out-then-score path of RL steps and evaluation: each trajectory comes back with
its problem, sample index, group and outcome, and the phases are timed in order; scoring sees each trajectory as
a `Response` (its own text, its problem, its shaping counts)."""

from contextlib import nullcontext

import pytest

from tirl.data.records import ProblemRow
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.agent.episodes import responses_of, rollout_and_score
from tirl.rollout.agent.loop import AgentConfig, AgentLoop
from tirl.rollout.engines.base import RemoteModel
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Generation, Origin, ToolCallRecord, Trajectory


class Answers(RemoteModel):
    """Answers each prompt with the next of `answers` (cycling), closing the turn."""

    def __init__(self, renderer, answers):
        self.r, self.answers, self.k = renderer, answers, 0

    def generate(self, prompts, params, *, max_new_tokens=None, generator=None):
        out = []
        for _ in prompts:
            ids = self.r.encode(f"\\boxed{{{self.answers[self.k % len(self.answers)]}}}") + [self.r.eos_id]
            self.k += 1
            out.append(Generation(ids, [-0.1] * len(ids), "eos"))
        return out


def _problems():
    return [
        ProblemRow(str(i), "arith", [{"role": "user", "content": f"q{i}"}], gt)
        for i, gt in enumerate(["4", "9"])
    ]


def test_groups_samples_and_outcomes(renderer, sandbox):
    agent = AgentLoop(Answers(renderer, ["4", "4", "9"]), renderer, sandbox, AgentConfig())
    phases = []

    def timed(phase):
        phases.append(phase)
        return nullcontext()

    def sampling_context():
        phases.append("sampling")
        return nullcontext()

    trajs, scores = rollout_and_score(
        agent, _problems(), SamplingParams(temperature=0.7), n=3, reward=RewardConfig(), generator=None, where="test",
        first_group=5, timed=timed, sampling_context=sampling_context,
    )  # fmt: skip
    assert phases == ["rollout", "sampling", "reward"]
    assert [(t.problem.problem_id, t.sample, t.group) for t in trajs] == [
        ("0", 0, 5), ("0", 1, 5), ("0", 2, 5), ("1", 0, 6), ("1", 1, 6), ("1", 2, 6)
    ]  # fmt: skip
    assert [s.correct for s in scores] == [True, True, False, False, False, True]
    assert [t.outcome.correct for t in trajs] == [s.correct for s in scores]
    assert [t.outcome.score for t in trajs] == [s.reward for s in scores] == [1.0, 1.0, -1.0, -1.0, -1.0, 1.0]
    assert {t.temperature for t in trajs} == {0.7} and trajs[2].outcome.pred == "9"


def test_without_first_group_there_are_no_groups(renderer, sandbox):
    agent = AgentLoop(Answers(renderer, ["4"]), renderer, sandbox, AgentConfig())
    trajs, _ = rollout_and_score(
        agent, _problems(), SamplingParams(), n=1, reward=RewardConfig(), generator=None, where="test"
    )
    assert [t.group for t in trajs] == [None, None] and "group" not in trajs[0].meta()


def test_one_origin_per_prompt(renderer, sandbox):
    agent = AgentLoop(Answers(renderer, ["4"]), renderer, sandbox, AgentConfig())
    p = _problems()[0]
    with pytest.raises(ValueError, match="2 prompts but 1 origins"):
        agent.run([p.prompt, p.prompt], SamplingParams(), origins=[Origin(p)])


def test_scoring_reads_the_assistant_text_problem_and_counts():
    p = _problems()[0]
    call = ToolCallRecord(0, "1+1", "2", "ok")
    t = Trajectory([1], [2, 3, 4], [1, 0, 1], [0.0] * 3, ["\\boxed{4}"], [call], problem=p)
    (r,) = responses_of([t])
    assert (r.text, r.problem, r.tool_calls, r.length) == ("\\boxed{4}", p, 1, 3)
    with pytest.raises(ValueError, match="trajectory 1 has no problem"):
        responses_of([t, Trajectory([1], [2], [1], [0.0], ["x"])])
