"""Load evaluated samples for the analysis: a `tirl eval` directory, a verl / Open-AgentRL validation dump, or a
counts file (`counts.jsonl`, `NAME.counts.jsonl`, or an eval directory holding counts.jsonl without records.jsonl).

tirl eval directories hold `records.jsonl` (one `SampleRecord` per line, the schema in docs/eval-records.md)
and `trajectories.jsonl` (the full `Trajectory` of each record, same order). verl's trainer, with
`trainer.validation_data_dir` set, writes `<step>.jsonl` files whose lines carry `input` (prompt text), `output`
(response text, tool responses included for multi-turn rollouts), `score`, `step`, usually `gts`, and every
reward-extra-info key (`acc`, `pred`, `data_source`, ... when the reward function returns them). From those:
problem = identical input text (id: a hash of it, so two dumps of one validation set pair up); correct = `acc`
when present, else score > 0; answer = `pred` when present, else the last \\boxed{} of the output; tool calls =
`<tool_call>` blocks, tool errors = `<tool_response>` blocks containing a traceback or "Error" (a heuristic:
verl does not record execution status). Response tokens, temperature and stop reason are unknown there (None).
A counts file (tirl.eval.counts) is a run without samples: only its per-problem correct counts (`Run.counts`).

Not here: computing any metric (see analysis.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from array import array
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tirl.core.config import read_config_file
from tirl.eval.answers import extract_answer
from tirl.eval.counts import (
    COUNTS_FILE,
    COUNTS_SUFFIX,
    ProblemCount,
    counts_from_records,
    is_counts_file,
    read_counts,
)
from tirl.eval.evaluate import SampleRecord

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
_TOOL_RESPONSE = re.compile(r"<tool_response>(.*?)(?:</tool_response>|$)", re.S)
_ERROR = re.compile(r"Traceback \(most recent call last\)|\b\w*Error\b")
_RECORD_KEYS = [f.name for f in fields(SampleRecord)]
_OPTIONAL_RECORD_KEYS = {"num_tool_errors", "turns", "response_tokens", "stop_reason", "top_p", "score"}
_INT_KEYS = ("sample_index", "num_tool_calls", "num_tool_errors", "turns", "response_tokens")
_NUMBER_KEYS = ("temperature", "top_p", "score")


def _typed(values: dict[str, Any], where: str) -> None:
    """Counts must be integers and temperatures/scores numbers (None where unknown): a string here would crash
    the analysis far from the file, or reach the viewer's HTML unescaped."""
    for key in _INT_KEYS:
        v = values.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise ValueError(f"{where}: {key!r} must be an integer, got {v!r}")
    for key in _NUMBER_KEYS:
        v = values.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise ValueError(f"{where}: {key!r} must be a number, got {v!r}")


@dataclass
class Sample:
    """One graded sample: its record, plus the text the audit and the viewer need."""

    record: SampleRecord
    reasoning: str = ""  # the model's own text, all turns (tool outputs excluded)
    tool_outputs: list[str] = field(default_factory=list)  # outputs of the calls that ran without error
    ground_truth: str | None = None
    trajectory: dict[str, Any] | None = None  # the stored Trajectory dict (tirl runs), for the viewer
    raw_output: str | None = None  # the whole response text (verl dumps), for the viewer
    question: str | None = None  # the prompt as the model saw it (last user message, or verl's input text)


@dataclass
class Run:
    label: str
    path: str
    kind: str  # "tirl" | "verl" | "counts"
    samples: list[Sample]
    tokenizer_path: str | None = None  # where the run's tokenizer lives, when known
    notes: list[str] = field(default_factory=list)
    counts: list[ProblemCount] | None = None  # a counts-only run (no samples): its per-problem correct counts

    @property
    def num_samples(self) -> int:
        return len(self.samples) if self.counts is None else sum(c.n for c in self.counts)


def _last_user_message(prompt: Any) -> str | None:
    """The question of a stored prompt (meta.prompt, a list of chat messages); None for older runs."""
    if not isinstance(prompt, list):
        return None
    users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    return str(users[-1]) if users else None


def _no_lone_surrogates(x: Any) -> Any:
    """Half an emoji escaped in JSON ("\\ud83d") loads as a lone surrogate, which no UTF-8 file can hold: U+FFFD."""
    if isinstance(x, str):
        return x.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if isinstance(x, list):
        return [_no_lone_surrogates(v) for v in x]
    if isinstance(x, dict):
        return {_no_lone_surrogates(k): _no_lone_surrogates(v) for k, v in x.items()}
    return x


def _compact_trajectory(t: dict[str, Any], where: str) -> dict[str, Any]:
    """A large run holds every trajectory at once, so each is shrunk as it is read: log-probs and prompt ids are
    never shown; the ids and mask the viewer decodes become 4- and 1-byte arrays (a list costs ~36 B per id)."""
    t.pop("logprobs", None)
    t.pop("prompt_ids", None)
    if isinstance(t.get("response_ids"), list) and isinstance(t.get("loss_mask"), list):
        try:
            t["response_ids"], t["loss_mask"] = array("i", t["response_ids"]), array("b", t["loss_mask"])
        except (TypeError, OverflowError) as e:
            raise ValueError(f"{where}: response_ids / loss_mask must be token ids / 0-1 ({e})") from e
    return t


def _read_jsonl(path: Path, *, trajectories: bool = False) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from e
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{n}: expected a JSON object, got {type(row).__name__}")
            row = _no_lone_surrogates(row) if "\\ud" in line.lower() else row
            rows.append(_compact_trajectory(row, f"{path}:{n}") if trajectories else row)
    if not rows:
        raise ValueError(f"{path}: the file has no rows")
    return rows


def load_run(path: str | Path, label: str | None = None) -> Run:
    """A tirl eval directory, a counts file (or an eval directory with counts.jsonl but no records.jsonl), a verl
    dump file, or a verl dump directory (its latest step is used)."""
    p = Path(path)
    if p.is_dir() and (p / "records.jsonl").is_file():
        return _load_tirl(p, label)
    if p.is_dir() and (p / COUNTS_FILE).is_file():
        return _load_counts(p / COUNTS_FILE, label or p.name)
    if p.is_file() and is_counts_file(p):
        return _load_counts(
            p, label or p.name.removesuffix(COUNTS_SUFFIX).removesuffix(COUNTS_FILE) or p.parent.name
        )
    if p.is_file() and p.suffix == ".jsonl":
        return _load_verl(p, label)
    if p.is_dir():
        steps = sorted((f for f in p.glob("*.jsonl") if f.stem.isdigit()), key=lambda f: int(f.stem))
        if steps:
            run = _load_verl(steps[-1], label)
            run.notes.append(f"verl dump directory: used its latest step file {steps[-1].name}")
            return run
    raise FileNotFoundError(
        f"{p}: not a tirl eval directory (records.jsonl or counts.jsonl), a counts file (*.counts.jsonl), a verl "
        "dump (.jsonl) or a directory of <step>.jsonl"
    )


COUNTS_ONLY_NOTE = (
    "counts-only run: pass@k, Cover@tau, histograms, solvable sets, comparisons and the envelope come from its "
    "per-problem correct counts; maj@k, verl's bootstrap estimators, tool use, the reasoning mode, the audit and "
    "the viewer need the samples and are skipped for it"
)


def _load_counts(path: Path, label: str) -> Run:
    return Run(label, str(path), "counts", [], None, [COUNTS_ONLY_NOTE], counts=read_counts(path))


def eval_dir_counts(run_dir: str | Path) -> list[ProblemCount]:
    """The counts of a tirl eval directory, from its records.jsonl (for evaluations older than counts.jsonl;
    write them with `tirl.eval.counts.write_counts`)."""
    path = Path(run_dir) / "records.jsonl"
    return counts_from_records(_record(r, f"{path}:{i + 1}") for i, r in enumerate(_read_jsonl(path)))


def _record(row: dict[str, Any], where: str) -> SampleRecord:
    missing = [k for k in _RECORD_KEYS if k not in row and k not in _OPTIONAL_RECORD_KEYS]
    if missing:
        raise ValueError(f"{where}: record lacks {missing} (see docs/eval-records.md)")
    values = {k: row.get(k) for k in _RECORD_KEYS}
    if not isinstance(values["correct"], bool):
        raise ValueError(f"{where}: 'correct' must be true or false, got {values['correct']!r}")
    _typed(values, where)
    for key in ("model", "problem_id", "data_source"):
        values[key] = str(values[key])
    values["pred"] = None if values["pred"] is None else str(values["pred"])
    values["num_tool_errors"] = values["num_tool_errors"] or 0
    values["stop_reason"] = values["stop_reason"] or "unknown"
    return SampleRecord(**values)


def _tokenizer_from_config(run_dir: Path) -> str | None:
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        return None
    model_path = (read_config_file(cfg_path).get("model") or {}).get("path") or ""
    for candidate in (Path(model_path), run_dir / model_path):
        if model_path and (candidate / "tokenizer.json").is_file():
            return str(candidate)
    return None


def _activate_task(run_dir: Path) -> str | None:
    """Load the run's task (config.yaml `task.name`) so that verifiers it registers group its answers for maj@k;
    a note if it cannot be imported here (its sources then fall back to the registry's default routing)."""
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        return None
    name = (read_config_file(cfg_path).get("task") or {}).get("name")
    if not name:
        return None
    from tirl.tasks import load_task

    try:
        load_task(str(name))
    except (ValueError, ImportError) as e:
        return f"task {name!r} could not be loaded ({e}); its answers are grouped by the default verifiers"
    return None


def _load_tirl(run_dir: Path, label: str | None) -> Run:
    task_note = _activate_task(run_dir)
    rows = _read_jsonl(run_dir / "records.jsonl")
    records = [_record(r, f"{run_dir / 'records.jsonl'}:{i + 1}") for i, r in enumerate(rows)]
    traj_path = run_dir / "trajectories.jsonl"
    notes = [task_note] if task_note else []
    trajs: list[dict[str, Any] | None] = [None] * len(records)
    if traj_path.is_file():
        trajs = _read_jsonl(traj_path, trajectories=True)
        if len(trajs) != len(records):
            raise ValueError(f"{traj_path}: {len(trajs)} trajectories for {len(records)} records")
    else:
        notes.append("no trajectories.jsonl: the audit and the viewer skip this run")
    samples = []
    for i, (rec, t) in enumerate(zip(records, trajs, strict=True)):
        if t is None:
            samples.append(Sample(rec))
            continue
        meta = t.get("meta") or {}
        if str(meta.get("id", rec.problem_id)) != rec.problem_id:
            raise ValueError(
                f"{traj_path}:{i + 1}: trajectory is for problem {meta.get('id')!r}, record for {rec.problem_id!r}"
            )
        calls = t.get("tool_calls") or []
        samples.append(
            Sample(
                rec,
                reasoning="".join(t.get("turn_texts") or []),
                tool_outputs=[c.get("response", "") for c in calls if c.get("status") == "ok"],
                ground_truth=None if meta.get("ground_truth") is None else str(meta["ground_truth"]),
                trajectory=t,
                question=_last_user_message(meta.get("prompt")),
            )
        )
    if label:
        for s in samples:
            s.record.model = label
    return Run(
        label or records[0].model, str(run_dir), "tirl", samples, _tokenizer_from_config(run_dir), notes
    )


def _load_verl(path: Path, label: str | None) -> Run:
    rows = _read_jsonl(path)
    seen: dict[str, int] = {}
    samples = []
    name = label or path.parent.name or "model"
    for i, row in enumerate(rows):
        where = f"{path}:{i + 1}"
        for key in ("input", "output", "score"):
            if key not in row:
                raise ValueError(f"{where}: verl dump line lacks {key!r} (has {sorted(row)})")
        output, source = str(row["output"]), str(row.get("data_source", "unknown"))
        pid = "p-" + hashlib.sha1(f"{source}\n{row['input']}".encode()).hexdigest()[:10]
        k = seen[pid] = seen.get(pid, -1) + 1
        _typed(
            {"score": row["score"], "temperature": row.get("temperature"), "top_p": row.get("top_p")}, where
        )
        _typed({"response_tokens": row.get("response_length")}, where)
        if row["score"] is None:
            raise ValueError(f"{where}: 'score' must be a number, got None")
        score = float(row["score"])
        acc = row.get("acc")
        if "acc" in row and (acc is None or not isinstance(acc, int | float)):
            raise ValueError(f"{where}: 'acc' must be a number or true/false, got {acc!r}")
        correct = float(acc) > 0 if "acc" in row else score > 0
        pred = row.get("pred")
        pred = extract_answer(output, source) if pred is None else str(pred)
        responses = _TOOL_RESPONSE.findall(output)
        errors = [r for r in responses if _ERROR.search(r)]
        calls = len(_TOOL_CALL.findall(output))
        rec = SampleRecord(
            name, pid, source, k, row.get("temperature"), row.get("top_p"), correct, score, pred,
            calls, len(errors), calls + 1, row.get("response_length"), "unknown",
        )  # fmt: skip
        samples.append(
            Sample(
                rec,
                reasoning=_TOOL_RESPONSE.sub(" ", output),
                tool_outputs=[r for r in responses if not _ERROR.search(r)],
                ground_truth=None if row.get("gts") is None else str(row["gts"]),
                raw_output=output,
                question=str(row["input"]),
            )
        )
    return Run(name, str(path), "verl", samples, None, [])
