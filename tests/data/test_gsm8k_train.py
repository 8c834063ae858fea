"""GSM8K's train split ships byte for byte as the test split does, and `tirl data prepare gsm8k --split` picks it."""

import hashlib
import json

import pytest

from tirl.cli import main
from tirl.data import read_rows
from tirl.data.benchmarks import FILES, prepare

TRAIN_SHA256 = "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465"


def test_train_file_is_the_recorded_byte_copy():
    data = (FILES / "gsm8k/train.jsonl").read_bytes()
    assert hashlib.sha256(data).hexdigest() == TRAIN_SHA256
    assert f"{TRAIN_SHA256}  gsm8k/train.jsonl" in (FILES / "SOURCE.md").read_text()


def test_train_split_rows_answers_and_ids():
    rows = prepare("gsm8k", split="train")
    assert len(rows) == 7473 and {r["data_source"] for r in rows} == {"gsm8k"}
    ids = [r["extra_info"]["id"] for r in rows]
    assert len(set(ids)) == len(ids) and ids[0] == "gsm8k-train-0" and ids[-1] == "gsm8k-train-7472"
    truths = [r["reward_model"]["ground_truth"] for r in rows]
    assert truths[:3] == ["72", "10", "5"]  # Natalia's clips, Weng's babysitting, Betty's wallet
    assert all(float(t) == float(t) for t in truths)  # every gold parses as a number (commas removed)
    assert "Natalia sold clips to 48" in rows[0]["prompt"][0]["content"]


def test_default_split_is_unchanged_and_other_benchmarks_have_no_train_split(tmp_path, capsys):
    test = prepare("gsm8k")
    assert (
        len(test) == 1319
        and test[0]["extra_info"]["id"] == "gsm8k-0"
        and test == prepare("gsm8k", split="test")
    )
    with pytest.raises(ValueError, match="math500 has only a test split"):
        prepare("math500", split="train")
    with pytest.raises(ValueError, match="unknown gsm8k split 'dev'"):
        prepare("gsm8k", split="dev")
    out = tmp_path / "train.jsonl"
    assert (
        main(["data", "prepare", "gsm8k", "--split", "train", "--wording", "plain", "--out", str(out)]) == 0
    )
    rows = read_rows(out)
    assert len(rows) == 7473 and rows[5]["extra_info"]["id"] == "gsm8k-train-5"
    assert json.loads(out.read_text().splitlines()[0])["reward_model"]["ground_truth"] == "72"
    assert "gsm8k train: 7473 rows" in capsys.readouterr().out
