"""`gsm8k-fewshot`: the gsm8k task's problems prompted as SmolLM2's makers prompt them (lighteval's gsm8k, few-shot,
no tool), its shots outside every split, and the gsm8k verifier reading the "#### N" answer line."""

from __future__ import annotations

import json

import pytest

from tirl.cli import main
from tirl.rewards.registry import get_verifier
from tirl.tasks import load_task
from tirl.tasks.gsm8k import answer_line, grade_gsm8k, gsm8k_id, gsm8k_records, gsm8k_rows, sample_pool
from tirl.tasks.gsm8k.fewshot import FewShotOptions, as_fewshot, fewshot_rows, shot_ids
from tirl.tasks.gsm8k.task import _order

# train rows 3332 and 5179, copied from src/tirl/tasks/gsm8k/files/train.jsonl by hand
NANCY_Q = (
    "Nancy and Jason are learning to dance for the first time. Nancy steps on her partner's feet 3 times as often "
    "as Jason. If together they step on each other's feet 32 times, how many times does Jason step on his "
    "partner's feet?"
)
NANCY_A = (
    "Let n be the number of times Nancy steps on her partner's feet and j be the number of times Jason does. We "
    "know that n = 3j and n + j = 32.\nSubstituting the first equation into the second equation, we get 3j + j = "
    "32\nCombining like terms, we get 4j = 32\nDividing both sides by 4, we get j = 8\n#### 8"
)
TANK_Q = (
    "John has a large water collection tank.  The tank can hold 200 gallons.  It weighs 80 pounds empty.  A "
    "rainstorm fills it to 80% of capacity.  If a gallon of water weighs 8 pounds, how much does it weigh now?"
)
TANK_A = (
    "The tank has 200*.8=<<200*.8=160>>160 gallons of water in it\nThat water weighs 160*8=<<160*8=1280>>1280 "
    "pounds\nSo in total it weighs 1280+80=<<1280+80=1360>>1360 pounds\n#### 1360"
)
# test row 484, the first held-out problem of seed 0 within 1-2 calculator steps
STETSON_Q = (
    "Stetson made a bet with Alec that he would give up $10 for each orange he eats. While at the farm, Stetson "
    "ate 2/5 of the oranges they picked. If they picked 60 oranges, calculate the total amount of money Stetson "
    "gave up?"
)


def _options(**task) -> FewShotOptions:
    base = {"name": "gsm8k-fewshot", "num_sft": 40, "num_rl": 30, "num_test": 3, "levels": [1, 2], "shots": 2}
    return FewShotOptions(**{**base, **task})


def test_two_shots_are_question_and_solution_turns_before_the_question():
    rows = fewshot_rows("test", _options(), 0)
    assert rows[0]["prompt"] == [
        {"role": "user", "content": f"Question: {NANCY_Q}\nAnswer:"},
        {"role": "assistant", "content": NANCY_A},
        {"role": "user", "content": f"Question: {TANK_Q}\nAnswer:"},
        {"role": "assistant", "content": TANK_A},
        {"role": "user", "content": f"Question: {STETSON_Q}\nAnswer:"},
    ]


def test_only_the_prompt_differs_from_the_gsm8k_tasks_rows():
    tool_rows = gsm8k_rows("test", _options(), 0)
    rows = fewshot_rows("test", _options(), 0)
    assert [{k: v for k, v in r.items() if k != "prompt"} for r in rows] == [
        {k: v for k, v in r.items() if k != "prompt"} for r in tool_rows
    ]
    assert rows[0]["extra_info"]["id"] == "gsm8k-484" and rows[0]["data_source"] == "gsm8k"


def test_the_shots_are_no_problem_of_any_split_nor_a_test_question():
    opts = _options(shots=64, num_test=422)
    shots = {gsm8k_id("train", i) for i in shot_ids(opts, 0)}
    assert len(shots) == 64
    every_split = {gsm8k_id("train", i) for i in _order("train", opts, 0)}  # SFT, pool, validation and RL
    assert every_split >= {r["extra_info"]["id"] for r in gsm8k_rows("train", opts, 0) + sample_pool(opts, 0)}
    assert not shots & every_split
    test_questions = {r["question"].strip() for r in gsm8k_records("test")}
    train = gsm8k_records("train")
    assert not {train[i]["question"].strip() for i in shot_ids(opts, 0)} & test_questions


def test_the_shots_are_fixed_by_the_split_seed_and_grow_as_a_prefix():
    assert shot_ids(_options(shots=5), 0)[:2] == shot_ids(_options(), 0) == [3332, 5179]
    assert shot_ids(_options(), 1) != shot_ids(_options(), 0)
    assert shot_ids(_options(split_seed=0), 1) == shot_ids(_options(), 0)


def test_a_row_that_is_a_shot_is_refused_naming_it():
    shot = shot_ids(_options(), 0)[0]
    row = {**gsm8k_rows("test", _options(), 0)[0], "extra_info": {"id": gsm8k_id("train", shot)}}
    with pytest.raises(ValueError, match=f"problem gsm8k-train-{shot} is one of the shots"):
        as_fewshot([row], _options(), 0)


def test_shots_need_levels_that_leave_problems_out():
    with pytest.raises(ValueError, match=r"task.levels = \[\] puts every train problem in a split"):
        shot_ids(_options(levels=[]), 0)
    with pytest.raises(ValueError, match="task.shots"):
        FewShotOptions(name="gsm8k-fewshot", shots=0)


def test_the_task_lists_no_tool_and_keeps_the_gsm8k_verifier():
    task = load_task("gsm8k-fewshot")
    assert not task.toolset().schemas and task.system_prompt is None
    assert get_verifier("gsm8k").extract("x\n#### 8") == "8"


@pytest.mark.parametrize(
    ("response", "pred"),
    [
        ("She sold 48/2 = <<48/2=24>>24 clips.\n#### 72", "72"),
        ("#### 1,072 clips", "1072"),  # commas removed
        ("#### -3", "-3"),
        ("#### 72\n\nQuestion: Tom has 5 apples.\nAnswer: #### 5", "72"),  # the first line
        ("Question: what next?\n#### 72", None),  # nothing before the stop sequence
        ("####72", None),  # the metric's pattern wants one space
        ("The answer is 72.", None),
        ("#### 72.", "72."),  # as the metric reads it: wrong against 72
    ],
)
def test_answer_line_reads_as_lightevals_gsm8k_metric(response, pred):
    assert answer_line(response) == pred


def test_a_response_without_a_box_is_graded_on_its_answer_line():
    assert grade_gsm8k("4j = 32, so j = 8\n#### 8", "8").correct
    assert grade_gsm8k("so 1,000\n#### 1,000", "1000").correct
    wrong = grade_gsm8k("so j = 4\n#### 4", "8")
    assert (wrong.correct, wrong.score, wrong.pred, wrong.details) == (False, -1.0, "4", {})


def test_the_answer_line_is_compared_exactly():
    assert not grade_gsm8k("#### 8.0", "8").correct
    assert not grade_gsm8k("#### 8.", "8").correct


def test_a_box_is_read_before_an_answer_line():
    assert grade_gsm8k("#### 5\nThe answer is \\boxed{8}.", "8").correct
    assert not grade_gsm8k("#### 8\nThe answer is \\boxed{5}.", "8").correct
    assert grade_gsm8k("no answer here", "8").details == {"no_boxed": True}


def test_tirl_eval_runs_the_fewshot_prompt_one_turn_without_a_tool(tokenizer, tmp_path):
    from conftest import make_model

    make_model(tokenizer, max_positions=4096).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    args = [
        f"model.path={tmp_path / 'm'}", "task.name=gsm8k-fewshot", "task.levels=[1,2]", "task.shots=2",
        "task.num_test=3", "eval.n=2", "agent.max_turns=1", "agent.max_response_tokens=8",
    ]  # fmt: skip
    assert main(["eval", *args, "--out", str(tmp_path / "eval")]) == 0
    records = [json.loads(x) for x in (tmp_path / "eval" / "records.jsonl").read_text().splitlines()]
    ids = [r["extra_info"]["id"] for r in gsm8k_rows("test", _options(), 0)]
    assert [r["problem_id"] for r in records] == [i for i in ids for _ in range(2)]
    assert {r["data_source"] for r in records} == {"gsm8k"}
    assert all(r["turns"] == 1 and r["num_tool_calls"] == 0 for r in records)
    trajs = [json.loads(x) for x in (tmp_path / "eval" / "trajectories.jsonl").read_text().splitlines()]
    prompt = tokenizer.decode(trajs[0]["prompt_ids"], skip_special_tokens=False)
    assert prompt.startswith(f"<|im_start|>user\nQuestion: {NANCY_Q}\nAnswer:<|im_end|>\n")
    assert f"<|im_start|>assistant\n{TANK_A}<|im_end|>\n" in prompt
    assert prompt.endswith(
        f"<|im_start|>user\nQuestion: {STETSON_Q}\nAnswer:<|im_end|>\n<|im_start|>assistant\n"
    )
