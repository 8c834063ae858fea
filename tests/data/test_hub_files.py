"""Hostile Hub cache entries and answers: a snapshot file linked to a device is refused before anything reads it
(`tirl.core.hub.regular_size`: datasets and models alike), and an AIME answer that is not an integer from 0 to 999
is refused naming its row instead of becoming a ground truth no answer matches."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hangguard import hang_guard
from hubcache import offline_cache, put_repo
from tirl.cli import main
from tirl.core.hub import HubError
from tirl.data.benchmarks import aime_answer
from tirl.data.hub import SFT_3K_COMMIT, sha256_of
from tirl.models.hub import resolve_model

GUARD_S = 20  # the old code read /dev/zero without end; this ends such a read with a failure instead


def _parquet(rows: list[dict]) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue().to_pybytes()


def _link_to_dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


def test_a_dataset_file_linked_to_dev_zero_is_refused_before_it_is_hashed(tmp_path, monkeypatch, capsys):
    cache = offline_cache(tmp_path, monkeypatch)
    name = "full_sft_3k_shuffled_v4.parquet"
    snap = put_repo(cache, "Gen-Verse/Open-AgentRL-SFT-3K", SFT_3K_COMMIT, {name: b"PAR1"}, repo_type="dataset",
                    ref=None)  # fmt: skip
    _link_to_dev_zero(snap / name)
    out = tmp_path / "sft.jsonl"
    with hang_guard(GUARD_S, "still reading"):
        assert main(["data", "prepare", "open-agentrl-sft-3k", "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{snap / name} is not a regular file (it resolves to /dev/zero" in err
    assert not out.exists()


def test_a_model_snapshot_file_linked_to_dev_zero_is_refused_before_a_loader_reads_it(tmp_path, monkeypatch):
    cache = offline_cache(tmp_path, monkeypatch)
    snap = put_repo(cache, "org/tiny", "c" * 40, {"config.json": b"{}", "tokenizer.json": b"{}"})
    _link_to_dev_zero(snap / "config.json")
    with pytest.raises(HubError, match=r"config\.json is not a regular file \(it resolves to /dev/zero"):
        resolve_model("org/tiny")


def test_the_hash_reads_no_more_than_the_size_the_file_was_found_with(tmp_path):
    path = tmp_path / "grown.bin"
    path.write_bytes(b"abc" + b"x" * (3 << 20))  # past the 1 MiB chunk the hash reads at a time
    assert sha256_of(path, 3) == hashlib.sha256(b"abc").hexdigest()


@pytest.mark.parametrize("answer", ["1/2", "1000", "-3", "x + 1", "2.5"])
def test_an_answer_outside_aimes_integers_is_refused(answer):
    with pytest.raises(ValueError, match="an AIME answer is an integer from 0 to 999"):
        aime_answer(answer)


def test_a_hub_aime_row_with_a_non_integer_answer_is_refused_naming_its_row(tmp_path, monkeypatch, capsys):
    cache = offline_cache(tmp_path, monkeypatch)
    rows = [
        {"Problem": "Find x if x = 25.", "Answer": "025"},
        {"Problem": "Find y.", "Answer": "\\frac{1}{2}"},
    ]
    put_repo(cache, "Gen-Verse/Open-AgentRL-Eval", "e" * 40,
             {"aime2024/aime_2024_problems.parquet": _parquet(rows)}, repo_type="dataset")  # fmt: skip
    out = tmp_path / "aime.jsonl"
    assert main(["data", "prepare", "open-agentrl-aime24", "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "aime_2024_problems.parquet: row 2, column 'Answer': an AIME answer is an integer from 0 to 999"
        in err
    )
    assert not out.exists()
