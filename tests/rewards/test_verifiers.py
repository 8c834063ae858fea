"""The reward registry on real benchmark rows: HumanEval through the sandbox, MATH-500, AIME, GPQA letters
(GSM8K's verifier is its task's: tests/tasks/test_gsm8k_verifier.py)."""

import json
import signal

import pytest

from tirl.data.records import ProblemRow
from tirl.rewards.batch import grade_many
from tirl.rewards.choice import grade_choice
from tirl.rewards.code import extract_code, grade_code, grade_code_batch
from tirl.rewards.registry import register, verifier_name
from tirl.rewards.scoring import Response, score_responses
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.engines.base import RemoteModel
from tirl.tasks.benchmarks import prepare_aime24, prepare_humaneval, prepare_math500


def _humaneval_answer(row, body=None):
    spec = json.loads(row["reward_model"]["ground_truth"])
    return f"Here it is.\n```python\n{spec['prompt']}{body or row['extra_info']['canonical_solution']}```"


@pytest.fixture(scope="module")
def humaneval():
    return prepare_humaneval("recipe")


def test_all_humaneval_canonical_solutions_pass_and_a_mutant_fails(humaneval, sandbox):
    assert len(humaneval) == 164
    graded = grade_code_batch(
        [_humaneval_answer(r) for r in humaneval],
        [r["reward_model"]["ground_truth"] for r in humaneval],
        sandbox=sandbox,
        timeout_s=10,
    )
    failed = [r["extra_info"]["id"] for r, g in zip(humaneval, graded) if not (g.correct and g.score == 1.0)]
    assert failed == []
    row = humaneval[0]  # has_close_elements: flip the comparison
    mutant = row["extra_info"]["canonical_solution"].replace("distance < threshold", "distance > threshold")
    g = grade_code(_humaneval_answer(row, mutant), row["reward_model"]["ground_truth"], sandbox=sandbox)
    assert (g.score, g.correct, g.details["statuses"]) == (0.0, False, {"runtime_error": 1})


def test_missing_or_unparsable_code_scores_minus_one(humaneval, sandbox):
    truth = humaneval[0]["reward_model"]["ground_truth"]
    assert grade_code("no code here", truth, sandbox=sandbox).score == -1.0
    g = grade_code("```python\ndef f(:\n```", truth, sandbox=sandbox)
    assert g.score == -1.0 and "does not parse" in g.details["no_code"]
    code, _ = extract_code("<think>```python\nx = 1\n```</think>\n```python\nprint(2)\n```")
    assert code == "print(2)\n"  # the last block after the reasoning


def test_stdin_tests_score_the_fraction_passed_with_a_per_test_timeout(sandbox):
    spec = {"inputs": ["1 2\n", "3 4\n", "5 6\n", "0 0\n"], "outputs": ["3\n", "7\n", "11\n", "0"]}
    code = (
        "a, b = map(int, input().split())\nif a == 5:\n    while True: pass\nprint(a + b if a != 3 else 0)\n"
    )
    g = grade_code(f"```python\n{code}```", json.dumps(spec), sandbox=sandbox, timeout_s=1.0)
    assert (g.score, g.correct, g.details["passed"]) == (0.5, False, 2)
    assert g.details["statuses"] == {"ok": 3, "timeout": 1}
    good = "a, b = map(int, input().split())\nprint(a + b)   \n"
    g = grade_code(f"```python\n{good}```", spec, sandbox=sandbox, timeout_s=5.0)
    assert g.correct and g.score == 1.0


def test_boxed_answer_without_code_falls_back_to_math_only_for_plain_truths(sandbox):
    g = grade_code("No code needed: the answer is \\boxed{\\frac{1}{2}}.", "0.5", sandbox=sandbox)
    assert (g.score, g.correct, g.details["boxed_fallback"]) == (1.0, True, True)
    assert not grade_code("So \\boxed{3}.", "4", sandbox=sandbox).correct
    tests = {"inputs": ["1\n"], "outputs": ["3\n"]}
    g = grade_code("The output is \\boxed{3}.", tests, sandbox=sandbox)  # tests cannot be met by a box
    assert (g.score, g.correct) == (-1.0, False) and "no_code" in g.details


def test_fn_name_tests_call_the_solution_method(sandbox):
    spec = {"fn_name": "twoSum", "inputs": ["[2, 7, 11]\n9", "[3, 3]\n6"], "outputs": ["[0, 1]", "[0, 1]"]}
    code = (
        "class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
        "        for i, x in enumerate(nums):\n            if target - x in seen:\n"
        "                return [seen[target - x], i]\n            seen[x] = i\n"
    )
    assert grade_code(f"```python\n{code}```", spec, sandbox=sandbox).correct
    plain = "def twoSum(nums, target):\n    return [0, 1] if target == 9 else [1, 0]\n"
    g = grade_code(f"```python\n{plain}```", json.dumps({"ground_truth": json.dumps(spec)}), sandbox=sandbox)
    assert (g.score, g.correct) == (0.5, False)


def test_math500_reference_solutions_grade_correct():
    rows = prepare_math500("recipe")
    items = [("math", r["extra_info"]["solution"], r["reward_model"]["ground_truth"]) for r in rows]
    graded = grade_many(items, workers=2, timeout_s=10)
    wrong = [(r["extra_info"]["id"], g.pred, g.details) for r, g in zip(rows, graded) if not g.correct]
    assert wrong == []
    assert not grade_many([("math", "\\boxed{\\frac{1}{3}}", "\\frac12")], workers=1)[0].correct


def test_aime_answers_grade_with_or_without_zero_padding():
    raw = [r["extra_info"]["raw_answer"] for r in prepare_aime24("recipe")]
    assert any(a.startswith("0") for a in raw)
    items = []
    for a in raw:
        items += [("integer", f"\\boxed{{{int(a)}}}", a), ("integer", f"\\boxed{{{int(a):03d}}}", a)]
        items += [
            ("integer", f"\\boxed{{{int(a):03d}}}", str(int(a))),
            ("integer", f"\\boxed{{{int(a) + 1}}}", a),
        ]
    graded = grade_many(items, workers=1)
    assert [g.correct for g in graded] == [True, True, True, False] * len(raw)
    assert grade_many([("integer", "\\boxed{27}", 27.0)], workers=1)[0].correct  # AMC's float answers


def test_boxed_letter_for_multiple_choice():
    assert grade_choice("The answer is \\boxed{C}.", "C").correct
    assert grade_choice("\\boxed{(b)}", "B").correct
    assert grade_choice("\\boxed{\\text{D}}", "D").correct
    assert grade_choice("\\boxed{A. 12 eV}", "A").correct
    assert not grade_choice("\\boxed{A}", "B").correct
    g = grade_choice("\\boxed{12 eV}", "A")
    assert (g.score, g.details) == (-1.0, {"not_a_letter": True})
    with pytest.raises(ValueError, match="one letter"):
        grade_choice("\\boxed{A}", "AB")


def test_registry_routes_by_source_then_ability_then_recipe_rule():
    assert verifier_name("aime25") == "integer" and verifier_name("GPQA_diamond", "Physics") == "choice"
    assert verifier_name("my_set", "choice") == "choice"
    assert verifier_name("skywork_code_contests") == "code" and verifier_name("dapo") == "math"
    register("my_mcq", "choice")
    assert verifier_name("my_mcq") == "choice"
    with pytest.raises(
        ValueError, match="valid: choice, code, (.*, )?integer, (.*, )?math"
    ):  # + any registered
        register("x", "nope")


def test_a_pathological_expression_is_reported_as_a_timeout():
    items = [("math", "\\boxed{(10^{10^{10^{10}}})!}", "3"), ("math", "\\boxed{\\frac{1}{2}}", "0.5")]
    slow, fine = grade_many(items, workers=2, timeout_s=1.0)
    assert slow.details == {"timeout": True} and not slow.correct
    assert fine.correct


def _answer(text, *, data_source, ground_truth, ability=""):
    return Response(text, ProblemRow("p", data_source, [], ground_truth, ability), tool_calls=0, length=2)


def test_score_responses_routes_each_row_and_shapes(humaneval, sandbox):
    he = humaneval[2]
    answers = [
        _answer("\\boxed{025}", data_source="aime24", ground_truth="25"),
        _answer("\\boxed{B}", data_source="gpqa_diamond", ability="Physics", ground_truth="A"),
        _answer(
            _humaneval_answer(he), data_source="humaneval", ground_truth=he["reward_model"]["ground_truth"]
        ),
        _answer("no answer", data_source="humaneval", ground_truth=he["reward_model"]["ground_truth"]),
    ]
    cfg = RewardConfig(tool_call_bonus=True)
    scores = score_responses(answers, cfg, max_len=100, sandbox=sandbox)
    assert [s.verdict for s in scores] == ["correct", "wrong", "correct", "no_answer"]
    assert [s.reward for s in scores] == [1.0, -1.0, 1.0, -1.0]  # no tool calls: the tool term adds nothing


class _AnswerWith(RemoteModel):
    """An engine that answers every prompt with one fixed text (canonical ids), closing the turn."""

    def __init__(self, renderer, text):
        self.r, self.text = renderer, text

    def generate(self, prompts, params, *, max_new_tokens=None, generator=None):
        from tirl.rollout.engines.torch.engine import Generation

        ids = self.r.encode(self.text) + [self.r.eos_id]
        return [Generation(list(ids), [-0.1] * len(ids), "eos") for _ in prompts]


def test_evaluate_routes_code_rows_through_the_agents_sandbox(humaneval, renderer, sandbox):
    """The evaluator's trajectories carry data_source and ability, and code answers run in the agent's sandbox."""
    from tirl.eval.evaluate import EvalConfig, evaluate
    from tirl.rollout.agent.loop import AgentConfig, AgentLoop

    row = humaneval[2]
    agent = AgentLoop(_AnswerWith(renderer, _humaneval_answer(row)), renderer, sandbox, AgentConfig())
    records, trajs = evaluate(agent, [row], EvalConfig(n=2), model_label="scripted", seed=0)
    assert [r.correct for r in records] == [True, True] and [r.score for r in records] == [1.0, 1.0]
    assert trajs[0].outcome.verdict == "correct" and trajs[0].problem.ability == "code"
    assert trajs[0].problem.prompt == row["prompt"]
    assert trajs[0].meta()["verdict"] == "correct"  # what trajectories.jsonl stores


def test_worker_pool_is_reused_across_batches_of_different_sizes():
    """The pool is sized by `workers`, not by how many items need sympy, so it is not respawned every batch."""
    from tirl.rewards import batch

    one = [("math", "\\boxed{\\frac{1}{2}}", "0.5")]
    assert grade_many(one, workers=2, timeout_s=10)[0].correct
    pool = batch._pool
    assert all(g.correct for g in grade_many(one * 3, workers=2, timeout_s=10))
    assert batch._pool is pool


def test_stdin_tests_must_be_lists():
    """inputs/outputs given as strings would be split into one 'test' per character: refuse them instead."""
    from tirl.rewards.code import parse_tests

    with pytest.raises(ValueError, match="inputs and outputs must be lists"):
        parse_tests({"inputs": "12", "outputs": "34"})
    assert parse_tests(json.dumps({"inputs": ["1"], "outputs": ["2"]}))["inputs"] == ["1"]


def test_a_code_block_against_a_plain_truth_is_an_error_item_not_a_crashed_batch(humaneval, sandbox):
    """A code-named source holding a math row, answered with a python block: the recipe's -1 for an exception,
    reported as an error for that item, while the rest of the batch is graded."""
    good = _humaneval_answer(humaneval[0])
    bad, ok = grade_code_batch(
        ["```python\nprint(42)\n```\nSo \\boxed{42}.", good],
        ["42", humaneval[0]["reward_model"]["ground_truth"]],
        sandbox=sandbox,
        timeout_s=10,
    )
    assert (bad.score, bad.correct) == (-1.0, False) and "code ground truth" in bad.details["error"]
    assert ok.correct


def _kill_workers(signum: int) -> None:
    """Send `signum` to every worker of the grading pool and wait until each is gone (Ctrl-C or a stop signal
    sent to the whole process group, or the memory killer)."""
    import os
    import time

    from tirl.rewards import batch

    procs = list(batch._pool._processes.values())
    for proc in procs:
        os.kill(proc.pid, signum)
    deadline = time.monotonic() + 30
    while any(proc.is_alive() for proc in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(proc.is_alive() for proc in procs)


def test_workers_killed_between_batches_cost_no_grade():
    """The memory killer (SIGKILL) took the grading workers while the run went on to finish its step (it
    checkpoints after it): the next batch is graded in a fresh pool, not raised as BrokenProcessPool nor turned
    into errors (which would have been the rewards of the step saved in the checkpoint)."""
    items = [("math", "\\boxed{\\frac{1}{2}}", "\\frac12"), ("math", "\\boxed{3}", "\\sqrt{9}")]
    assert [g.correct for g in grade_many(items, workers=2, timeout_s=10)] == [True, True]
    _kill_workers(signal.SIGKILL)
    graded = grade_many(items, workers=2, timeout_s=10)
    assert [g.correct for g in graded] == [True, True], [g.details for g in graded]


def _ignores(pid: int, signum: int) -> bool:
    """Whether process `pid` ignores `signum` (its SigIgn mask in /proc)."""
    from pathlib import Path

    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_workers_outlive_the_stop_signals_their_group_gets(signum):
    """torchrun's SIGTERM and a terminal's Ctrl-C reach the whole process group while the run finishes its step:
    the grading workers ignore them (their parent ends the pool), so the same pool grades the next batch."""
    import os
    import time

    from tirl.rewards import batch

    items = [("math", "\\boxed{\\frac{1}{2}}", "\\frac12"), ("math", "\\boxed{3}", "\\sqrt{9}")]
    assert [g.correct for g in grade_many(items, workers=2, timeout_s=10)] == [True, True]
    pool, procs = batch._pool, list(batch._pool._processes.values())
    deadline = time.monotonic() + 60  # a worker still starting has not run its initializer yet: wait for it
    while not all(_ignores(proc.pid, signum) for proc in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    for proc in procs:
        os.kill(proc.pid, signum)
    time.sleep(0.5)
    assert all(proc.is_alive() for proc in procs)
    assert [g.correct for g in grade_many(items, workers=2, timeout_s=10)] == [True, True]
    assert batch._pool is pool


def dies_once(response: str, ground_truth: str, timeout_s: float = 5.0):
    """A verifier whose worker dies the first time it grades (the marker file named by the response is made
    first): the memory killer in the middle of a batch."""
    import os
    from pathlib import Path

    from tirl.rewards.math import GradeResult

    marker = Path(response)
    if not marker.exists():
        marker.write_text("died")
        os._exit(1)
    return GradeResult(1.0, True, "ok", {})


def test_a_worker_dying_in_a_batch_has_its_items_graded_again(tmp_path):
    from tirl.rewards.registry import register_verifier

    register_verifier("dies-once", dies_once, in_workers=True, replace=True)
    items = [("dies-once", str(tmp_path / "marker"), "x"), ("math", "\\boxed{3}", "\\sqrt{9}")]
    graded = grade_many(items, workers=2, timeout_s=10)
    assert (tmp_path / "marker").read_text() == "died"  # a worker did die on it
    assert [g.correct for g in graded] == [True, True], [g.details for g in graded]
