"""GSM8K's splits ship with its task byte for byte, and `tirl data prepare gsm8k [--split train]` writes them."""

import hashlib
import json
import re

import pytest

from tirl.cli import main
from tirl.data import read_rows
from tirl.tasks.gsm8k.data import FILES, gsm8k_answer, prepare_gsm8k

TRAIN_SHA256 = "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465"


def test_both_files_are_the_recorded_byte_copies():
    sums = re.findall(r"^([0-9a-f]{64})  (\S+)$", (FILES / "SOURCE.md").read_text(), re.MULTILINE)
    assert sorted(name for _, name in sums) == ["test.jsonl", "train.jsonl"]
    assert (TRAIN_SHA256, "train.jsonl") in sums
    for digest, name in sums:
        assert hashlib.sha256((FILES / name).read_bytes()).hexdigest() == digest, name


def test_the_gold_is_the_number_after_the_hashes():
    assert gsm8k_answer("... #### 1,234") == "1234"
    with pytest.raises(ValueError, match="no '####'"):
        gsm8k_answer("no marker")


def test_train_split_rows_answers_and_ids():
    rows = prepare_gsm8k("recipe", "train")
    assert len(rows) == 7473 and {r["data_source"] for r in rows} == {"gsm8k"}
    ids = [r["extra_info"]["id"] for r in rows]
    assert len(set(ids)) == len(ids) and ids[0] == "gsm8k-train-0" and ids[-1] == "gsm8k-train-7472"
    truths = [r["reward_model"]["ground_truth"] for r in rows]
    assert truths[:3] == ["72", "10", "5"]  # Natalia's clips, Weng's babysitting, Betty's wallet
    assert all(float(t) == float(t) for t in truths)  # every gold parses as a number (commas removed)
    assert "Natalia sold clips to 48" in rows[0]["prompt"][0]["content"]


def test_the_test_split_and_a_benchmark_without_a_train_split(tmp_path, capsys):
    test = prepare_gsm8k("recipe")
    assert len(test) == 1319 and test[0]["extra_info"]["id"] == "gsm8k-0"
    assert test[0]["reward_model"]["ground_truth"] == "18"  # Janet's ducks
    with pytest.raises(ValueError, match="unknown gsm8k split 'dev'"):
        prepare_gsm8k("recipe", "dev")
    bad = tmp_path / "m.jsonl"
    assert main(["data", "prepare", "math500", "--split", "train", "--out", str(bad)]) == 2
    assert "math500 has only a test split" in capsys.readouterr().err
    assert not bad.exists()
    out = tmp_path / "train.jsonl"
    assert (
        main(["data", "prepare", "gsm8k", "--split", "train", "--wording", "plain", "--out", str(out)]) == 0
    )
    rows = read_rows(out)
    assert len(rows) == 7473 and rows[5]["extra_info"]["id"] == "gsm8k-train-5"
    assert json.loads(out.read_text().splitlines()[0])["reward_model"]["ground_truth"] == "72"
    assert "gsm8k train: 7473 rows" in capsys.readouterr().out
