"""GSM8K's verifier lives with the GSM8K task: importing the task registers it and routes GSM8K's data sources."""

from __future__ import annotations

import subprocess
import sys

from tirl.rewards.registry import get_verifier, verifier_name
from tirl.tasks import gsm8k


def test_the_task_module_registers_its_verifier_and_routes_its_sources():
    assert get_verifier("gsm8k").fn is gsm8k.grade_gsm8k
    assert verifier_name("openai/GSM8K") == verifier_name("gsm8k") == "gsm8k"


def test_a_raw_solution_is_graded_on_the_number_after_its_marker():
    raw = "She sold 48 + 24 = 72 clips.\n#### 1,072"
    assert gsm8k.grade_gsm8k("so \\boxed{1072}", raw).correct
    assert not gsm8k.grade_gsm8k("so \\boxed{72}", raw).correct
    assert gsm8k.grade_gsm8k("\\boxed{18}", "18").correct  # an already extracted gold is used as is


def test_the_rewards_layer_alone_knows_no_gsm8k():
    code = "import tirl.rewards.registry as r; print('gsm8k' in r.verifier_names())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_packaged_row_is_graded_in_the_worker_processes_by_its_gold():
    from tirl.rewards.batch import grade_many

    row = gsm8k.prepare_gsm8k("recipe")[0]
    assert row["reward_model"]["ground_truth"] == "18"
    raw = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n#### 1,018"
    graded = grade_many([("gsm8k", "so \\boxed{1018}", raw), ("gsm8k", "\\boxed{18}", raw)], workers=1)
    assert [g.correct for g in graded] == [True, False]
