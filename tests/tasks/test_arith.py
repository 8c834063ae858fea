import pytest

from tirl.tasks.arith.problems import KINDS, LEVELS, generate_problems, make_problem, split_problems
from tirl.tasks.arith.solver import SolverConfig, choose_styles, scripted_trajectories
from tirl.tasks.arith.warmup import copy_warmup_rows


def test_problems_have_exact_answers():
    for p in generate_problems(48, seed=1, style="mixed"):
        assert p.answer == eval(p.expression) and p.answer >= 0
        assert p.kind in KINDS and p.level in LEVELS
        row = p.to_row()
        assert row["prompt"] == [{"role": "user", "content": p.question}]
        assert row["reward_model"]["ground_truth"] == str(p.answer)


def test_splits_are_disjoint_and_deterministic():
    a = split_problems(seed=0, num_sft=50, num_rl=40, num_test=30)
    b = split_problems(seed=0, num_sft=50, num_rl=40, num_test=30)
    assert [p.question for s in a for p in s] == [p.question for s in b for p in s]
    sft, rl, test = ({p.question for p in s} for s in a)
    assert len(sft) == 50 and len(rl) == 40 and len(test) == 30
    assert not (sft & test) and not (rl & test) and not (sft & rl)


def test_levels_grow_in_size():
    import random

    rng = random.Random(0)
    for kind in KINDS:  # the longest operand grows with the level (a remainder need not)
        sizes = [
            len(max(make_problem(rng, level=lv, kind=kind, pid="x").question.split(), key=len))
            for lv in LEVELS
        ]
        assert sizes[0] < sizes[-1], kind
    with pytest.raises(ValueError, match="unknown level 9"):
        make_problem(rng, level=9, kind="mul", pid="x")
    with pytest.raises(ValueError, match="unknown question style"):
        make_problem(rng, level=1, kind="mul", pid="x", style="poem")


def test_solver_styles_and_real_tool_outputs(sandbox):
    problems = generate_problems(40, seed=3)
    cfg = SolverConfig(share_no_tool=0.25, share_fix=0.25, share_copy_error=0.25)
    rows = scripted_trajectories(problems, sandbox, cfg, seed=0)
    assert {r["style"] for r in rows} == {"clean", "no_tool", "fix", "copy_error"}
    for p, r in zip(problems, rows):
        msgs = r["messages"]
        final = msgs[-1]["content"]
        tools = [m["content"] for m in msgs if m["role"] == "tool"]
        if r["style"] == "clean":
            assert tools == [f"{p.answer}\n"] and final == f"The answer is \\boxed{{{p.answer}}}."
        elif r["style"] == "fix":
            assert len(tools) == 2 and "Error" in tools[0] and tools[1] == f"{p.answer}\n"
            assert f"\\boxed{{{p.answer}}}" in final
        elif r["style"] == "copy_error":
            assert tools == [f"{p.answer}\n"] and f"\\boxed{{{p.answer}}}" not in final
        else:
            assert tools == [] and "in my head" in final
    assert choose_styles(100, cfg, seed=1) == choose_styles(100, cfg, seed=1)
    with pytest.raises(ValueError, match="sum to at most 1"):
        SolverConfig(share_no_tool=0.6, share_fix=0.6)


def test_warmup_rows_are_pure_copies():
    (p,) = generate_problems(1, seed=0)
    rows = copy_warmup_rows([p])
    assert rows[0] == {"prompt": f"{p.question}\n", "completion": f"{p.expression}\n"}
    assert rows[1]["completion"] == f"{p.answer}}}"
