"""GSM8K, every part of it in this folder: the packaged splits and their reading (`data.py`, `files/`), the
verifier (`verifier.py`), the tasks `gsm8k` and `gsm8k-no-tool` with their seed-fixed splits (`task.py`),
stitched SFT trajectories from the annotated solutions (`stitch.py`, `tirl data stitch gsm8k`) and the few-shot
task `gsm8k-fewshot` (`fewshot.py`). Importing the package registers the three tasks."""

from tirl.tasks.gsm8k import fewshot  # noqa: F401  (registers gsm8k-fewshot, after task.py's two)
from tirl.tasks.gsm8k.data import DATA_SOURCES, SPLITS, gsm8k_answer, gsm8k_id, gsm8k_records, prepare_gsm8k
from tirl.tasks.gsm8k.task import (
    NO_TOOL_PROMPT,
    WORDING,
    GSM8KOptions,
    calculator_steps,
    gsm8k_rows,
    gsm8k_training_data,
    sample_pool,
    split_seed,
    study_splits,
)
from tirl.tasks.gsm8k.verifier import answer_line, grade_gsm8k, gsm8k_pred

__all__ = [
    "DATA_SOURCES",
    "NO_TOOL_PROMPT",
    "SPLITS",
    "WORDING",
    "GSM8KOptions",
    "answer_line",
    "calculator_steps",
    "grade_gsm8k",
    "gsm8k_answer",
    "gsm8k_training_data",
    "gsm8k_id",
    "gsm8k_pred",
    "gsm8k_records",
    "gsm8k_rows",
    "prepare_gsm8k",
    "sample_pool",
    "split_seed",
    "study_splits",
]
