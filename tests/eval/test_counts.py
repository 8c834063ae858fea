"""Per-problem correct counts: written by `tirl eval`, derived from old records, and analysed as a run with the
same pass@k, intervals and paired differences as the eval directory they came from."""

import json

import numpy as np
import pytest

from tirl.core.io import atomic_write_jsonl
from tirl.eval.analysis import analyze_runs
from tirl.eval.counts import ProblemCount, counts_from_records, read_counts, write_counts
from tirl.eval.evaluate import SampleRecord, write_eval
from tirl.eval.report import run_analyze
from tirl.eval.samples import COUNTS_ONLY_NOTE, eval_dir_counts, load_run
from tirl.eval.tables import AnalysisConfig

CFG = AnalysisConfig(num_resamples=200, seed=3)
TEMPS = (0.6, 1.0)


def _records(label: str, rate: float, *, n: int = 8, problems: int = 30, seed: int = 0) -> list[SampleRecord]:
    """Temperature by temperature, problem by problem, sample by sample, as `tirl eval` orders them; correct
    samples fall anywhere among the n (never all first), two sources numbering their problems alike."""
    rng = np.random.default_rng(seed)
    out = []
    for t in TEMPS:
        for src in ("gsm8k", "math"):
            for i in range(problems):
                p = rng.uniform(0, 2 * rate) if i % 5 else 0.0  # every fifth problem never solved
                for k in range(n):
                    ok = bool(rng.random() < p)
                    out.append(SampleRecord(label, f"q{i}", src, k, t, 1.0, ok, 1.0 if ok else -1.0,
                                            "42" if ok else str(k), 1, 0, 2, 10, "answer"))  # fmt: skip
    return out


def _eval_dir(path, records):
    path.mkdir()
    atomic_write_jsonl(path / "records.jsonl", [r.__dict__ for r in records])
    return path


def _pairs(report: dict) -> dict:
    """Every number pass@k and the comparisons give, keyed by where it sits in the report."""
    out = {}
    for src, e in report["sources"].items():
        for label, m in e["models"].items():
            for tkey, b in m["temperatures"].items():
                for key in ("pass@k", "cover", "histogram", "avg@n", "solved_ids", "num_problems"):
                    out[(src, label, tkey, key)] = b[key]
            out[(src, label, "envelope")] = m["envelope"]
        for c in e["comparisons"]:
            for key in ("diff", "share_other_better", "crossover", "solvable", "dropped"):
                out[(src, c["condition"], key)] = c[key]
    return out


def test_write_eval_writes_counts_in_the_order_evaluated(tmp_path) -> None:
    recs = [
        SampleRecord("m", pid, "src", k, t, 1.0, ok, 1.0, "1", 0, 0, 1, 3, "answer")
        for t, pid, k, ok in [
            (1.0, "b", 0, True), (1.0, "b", 1, True), (1.0, "a", 0, False), (1.0, "a", 1, True),
            (0.6, "b", 0, False), (0.6, "b", 1, False), (0.6, "a", 0, True), (0.6, "a", 1, False),
        ]
    ]  # fmt: skip
    write_eval(tmp_path, recs, [], {})
    rows = [json.loads(line) for line in (tmp_path / "counts.jsonl").read_text().splitlines()]
    assert rows == [
        {"data_source": "src", "temperature": 1.0, "problem_id": "b", "n": 2, "correct": 2},
        {"data_source": "src", "temperature": 1.0, "problem_id": "a", "n": 2, "correct": 1},
        {"data_source": "src", "temperature": 0.6, "problem_id": "b", "n": 2, "correct": 0},
        {"data_source": "src", "temperature": 0.6, "problem_id": "a", "n": 2, "correct": 1},
    ]


def test_counts_derived_from_old_records_equal_those_eval_writes(tmp_path) -> None:
    recs = _records("m", 0.4)
    write_eval(tmp_path / "new", recs, [], {})
    old = _eval_dir(tmp_path / "old", recs)  # an evaluation from before counts.jsonl
    assert eval_dir_counts(old) == read_counts(tmp_path / "new" / "counts.jsonl")


def test_analysis_from_counts_equals_analysis_from_the_eval_directories(tmp_path) -> None:
    base = _eval_dir(tmp_path / "base", _records("base", 0.3, seed=1))
    rl = _eval_dir(tmp_path / "rl", _records("rl", 0.5, seed=2))
    write_counts(tmp_path / "base.counts.jsonl", eval_dir_counts(base))
    write_counts(tmp_path / "rl.counts.jsonl", eval_dir_counts(rl))
    from_records = analyze_runs([load_run(base), load_run(rl)], CFG)
    from_counts = analyze_runs(
        [load_run(tmp_path / "base.counts.jsonl"), load_run(tmp_path / "rl.counts.jsonl")], CFG
    )
    a, b = _pairs(from_records), _pairs(from_counts)
    assert len(a) == 2 * 2 * 2 * 6 + 2 * 2 + 2 * 3 * 5 and a.keys() == b.keys()
    for key in a:
        assert a[key] == b[key], key  # exactly equal: the same counts through the same seeded draws
    assert from_records["findings"] == from_counts["findings"]


def test_a_counts_only_run_skips_what_needs_the_samples(tmp_path) -> None:
    write_counts(tmp_path / "m.counts.jsonl", counts_from_records(_records("m", 0.4)))
    report = analyze_runs([load_run(tmp_path / "m.counts.jsonl")], CFG)
    block = report["sources"]["gsm8k"]["models"]["m"]["temperatures"]["1"]
    assert block["skipped"] == ["maj@k", "verl_bootstrap"]
    assert block["maj@k"]["mean"] == [] and block["verl_bootstrap"]["best@k"] == []
    assert report["tool_use"] == {} and report["reasoning_mode"] == {} and report["audit"] == {}
    assert report["meta"]["runs"][0]["notes"] == [COUNTS_ONLY_NOTE]
    assert report["meta"]["runs"][0]["samples"] == 2 * 2 * 30 * 8


def test_a_directory_with_counts_but_no_records_loads_as_counts(tmp_path) -> None:
    write_eval(tmp_path / "sft", _records("m", 0.4), [], {})
    (tmp_path / "sft" / "records.jsonl").unlink()
    run = load_run(tmp_path / "sft")
    assert (run.kind, run.label, run.samples, len(run.counts)) == ("counts", "sft", [], 2 * 2 * 30)
    assert load_run(tmp_path / "sft" / "counts.jsonl").label == "sft"


def test_run_analyze_writes_the_report_pages_from_counts_files(tmp_path) -> None:
    for name, rate in (("base", 0.3), ("rl", 0.5)):
        write_counts(
            tmp_path / f"{name}.counts.jsonl", counts_from_records(_records(name, rate, problems=10))
        )
    paths = [tmp_path / "base.counts.jsonl", tmp_path / "rl.counts.jsonl"]
    run_analyze(paths, tmp_path / "out", config=CFG, viewer=True)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["models"] == ["base", "rl"] and (tmp_path / "out" / "report.html").is_file()


def test_the_envelope_of_counts_with_unequal_n_uses_each_full_n(tmp_path) -> None:
    rows = [ProblemCount("s", 0.6, "a", 4, 1), ProblemCount("s", 1.0, "a", 8, 6)]
    write_counts(tmp_path / "m.counts.jsonl", rows)
    env = analyze_runs([load_run(tmp_path / "m.counts.jsonl")], CFG)["sources"]["s"]["models"]["m"][
        "envelope"
    ]
    # pass@1 at T=1 is 6/8 from all 8 samples (its first 4 grades would say 4/4); pass@4: 1 - C(2,4)/C(8,4) = 1
    assert env["n"] == 4 and env["best_temperature"][0] == "1" and env["pass@k"]["mean"][:1] == [0.75]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"data_source": "s", "temperature": 1.0, "problem_id": "a", "n": 4}', r":2: counts row lacks \['correct'\]"),
        ('{"data_source": "s", "temperature": 1.0, "problem_id": "a", "n": 4, "correct": 5}', r":2: 'correct' must"),
        ('{"data_source": "s", "temperature": "hot", "problem_id": "a", "n": 4, "correct": 1}', r":2: 'temperature'"),
        ('{"data_source": "s", "temperature": 1.0, "problem_id": 7, "n": 4, "correct": 1}', r":2: 'problem_id' must"),
        ('{"data_source": "s", "temperature": 1.0, "problem_id": "b", "n": true, "correct": 1}', r":2: 'n' must"),
        ('{"data_source": "s", "temperature": 1.0, "problem_id": "a", "n": 4, "correct": 1}', r"problem 'a' is listed twice"),
        ('{"data_source": "s", "temperature": 1.0, "problem_id": "b", "n": 5, "correct": 1}', r"problem 'b' has n=5"),
        ("[1, 2]", r":2: expected a JSON object"),
        ("{", r":2: not valid JSON"),
    ],
)  # fmt: skip
def test_bad_counts_rows_are_errors_naming_the_file(tmp_path, line, message) -> None:
    path = tmp_path / "m.counts.jsonl"
    first = '{"data_source": "s", "temperature": 1.0, "problem_id": "a", "n": 4, "correct": 1}'
    path.write_text(first + "\n" + line + "\n")
    with pytest.raises(ValueError, match="m.counts.jsonl" + ".*" + message):
        load_run(path)


def test_a_counts_file_past_the_sample_cap_is_refused_while_reading(tmp_path) -> None:
    # 300 rows of n=65536 would ask for 19.7M grades: refused at the row that passes 2**24, before any table
    rows = [ProblemCount("s", 1.0, f"q{i}", 65536, 1) for i in range(300)]
    write_counts(tmp_path / "big.counts.jsonl", rows)
    with pytest.raises(ValueError, match=r"big.counts.jsonl:257: more than .* samples"):
        load_run(tmp_path / "big.counts.jsonl")


def test_a_failed_summary_leaves_no_counts_behind(tmp_path, monkeypatch) -> None:
    import tirl.eval.evaluate

    def disk_full(path, obj, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tirl.eval.evaluate, "atomic_write_json", disk_full)
    with pytest.raises(OSError):
        write_eval(tmp_path, _records("m", 0.4, problems=2), [], {})
    assert sorted(p.name for p in tmp_path.iterdir()) == []
