"""`model.path` as a Hub id (`tirl.models.hub`), against a cache this test builds in the Hub's own layout with
downloads off: ids with and without a revision resolve to the cached snapshot and its commit, every consumer
(loaders, stages, plan, export, the vLLM spec's directory, the viewer) takes the id, and a missing one is refused
naming the id and the command that fetches it. The slow test at the end tries the real Hub where it is reachable."""

from __future__ import annotations

import json
import socket

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import make_model, say_rows
from hubcache import offline_cache, put_repo
from tirl.cli import main
from tirl.core.hub import HubError
from tirl.models.hub import cached_file, resolve_model
from tirl.models.loading import ModelConfig, load_model, load_tokenizer

REPO = "tirl-test/tiny"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.fixture()
def hub(tokenizer, tmp_path, monkeypatch):
    """(cache, snapshot, the model saved there): REPO at COMMIT (refs/main), offline."""
    cache = offline_cache(tmp_path, monkeypatch)
    torch.manual_seed(0)
    model = make_model(tokenizer)
    src = tmp_path / "src"
    model.save_pretrained(src)
    tokenizer.save_pretrained(src)
    snapshot = put_repo(cache, REPO, COMMIT, {f.name: f for f in src.iterdir()})
    return cache, snapshot, model


def test_org_name_resolves_to_the_cached_snapshot_and_its_commit(hub):
    _, snapshot, _ = hub
    got = resolve_model(REPO)
    assert (got.path, got.repo_id, got.commit) == (snapshot, REPO, COMMIT)
    assert got.label == f"{REPO}@{COMMIT}" and got.from_hub


def test_a_revision_by_commit_or_by_branch_resolves_to_that_snapshot(hub, tmp_path):
    cache, snapshot, _ = hub
    other = put_repo(cache, REPO, OTHER, {"config.json": (snapshot / "config.json")}, ref="v2")
    assert resolve_model(f"{REPO}@{COMMIT}").path == snapshot
    assert resolve_model(f"{REPO}@main").path == snapshot
    assert resolve_model(f"{REPO}@{OTHER}").path == other
    assert resolve_model(f"{REPO}@v2").commit == OTHER


def test_the_loaders_take_the_id_and_load_the_cached_weights(hub):
    _, _, model = hub
    loaded = load_model(ModelConfig(path=f"{REPO}@main"))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    assert load_tokenizer(REPO).encode("12 * 34") == load_tokenizer(resolve_model(REPO).path).encode(
        "12 * 34"
    )


def test_an_existing_local_path_wins_over_the_hub_id(hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / REPO).mkdir(parents=True)
    got = resolve_model(REPO)
    assert got.path.resolve() == (tmp_path / REPO).resolve() and not got.from_hub and got.label == REPO


def test_a_missing_id_offline_is_refused_naming_it_and_the_fetch_command(hub, tmp_path, capsys):
    with pytest.raises(HubError) as e:
        resolve_model("tirl-test/absent@v1")
    text = str(e.value)
    assert (
        "model.path 'tirl-test/absent@v1' (no such local directory): cannot get model tirl-test/absent at revision v1"
        in text
    )
    assert "HF_HUB_OFFLINE is set and the cache" in text
    assert "`hf download tirl-test/absent --revision v1`" in text
    assert main(["eval", "model.path=tirl-test/absent", "--out", str(tmp_path / "e")]) == 2
    assert "hf download tirl-test/absent`" in capsys.readouterr().err  # the CLI prints it, no traceback


def test_no_network_and_no_cache_is_refused_naming_the_connection_error(hub, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # a closed port: refused at once
    with pytest.raises(
        HubError, match=r"the Hub could not be reached \(ConnectError.*`hf download tirl-test/absent`"
    ):
        resolve_model("tirl-test/absent")


def test_a_path_that_is_no_hub_id_keeps_the_local_error(hub, tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory, nor a Hugging Face Hub id"):
        load_model(ModelConfig(path=str(tmp_path / "runs" / "missing")))


def test_sft_records_the_commit_in_its_identity_and_config(hub, tmp_path):
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in say_rows(4)))
    out = tmp_path / "run"
    args = [f"model.path={REPO}", f"sft.data={data}", "sft.epochs=1", "sft.batch_size=4", "sft.save_every=1"]
    assert main(["sft", *args, "threads=1", "logging.backends=[jsonl]", "--out", str(out)]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["path"] == f"{REPO}@{COMMIT}"
    manifest = json.loads((out / "checkpoint-1" / "manifest.json").read_text())
    assert manifest["settings"]["model"] == f"{REPO}@{COMMIT}"


def test_plan_reads_the_config_json_of_the_id(hub, tmp_path, capsys):
    from tirl.train.plan import PlanError, load_arch

    name, config = load_arch(REPO)
    assert name == REPO and config.model_type == "qwen2"
    with pytest.raises(
        PlanError, match="hf download tirl-test/absent`.*or size it without the model: --arch"
    ):
        load_arch("tirl-test/absent")


def test_export_takes_the_id(hub, tmp_path):
    _, snapshot, model = hub
    out = tmp_path / "exported"
    assert main(["export", REPO, "--out", str(out)]) == 0
    weights = load_file(out / "model.safetensors")
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items() if k in weights)
    assert (out / "tokenizer_config.json").is_file()


def test_the_vllm_engine_serves_the_snapshot_directory_as_it_is(hub):
    from tirl.rollout.engines.vllm.weights import is_plain_hf_dir, servable_dir

    snapshot = resolve_model(REPO).path
    assert is_plain_hf_dir(snapshot) and servable_dir(str(snapshot), None, None, None) == snapshot


def test_the_viewer_finds_the_tokenizer_of_a_recorded_id_without_fetching(hub):
    from tirl.eval.viewer import load_tokenizer as viewer_tokenizer

    _, snapshot, _ = hub
    assert cached_file(f"{REPO}@{COMMIT}", "tokenizer.json") == snapshot / "tokenizer.json"
    assert viewer_tokenizer(f"{REPO}@{COMMIT}").encode("12").ids == load_tokenizer(snapshot).encode("12")
    assert viewer_tokenizer("tirl-test/absent") is None


def _hub_reachable() -> bool:
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_a_real_tiny_repository_from_the_hub(tmp_path, monkeypatch):
    if not _hub_reachable():
        pytest.skip("huggingface.co is not reachable")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    got = resolve_model("hf-internal-testing/tiny-random-LlamaForCausalLM")
    assert len(got.commit) == 40 and (got.path / "config.json").is_file()
    assert not list(got.path.glob("*.bin")) and not list(got.path.glob("*/*"))  # only what a model needs
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # now from the cache alone
    assert resolve_model(f"hf-internal-testing/tiny-random-LlamaForCausalLM@{got.commit}").path == got.path


def test_rl_from_the_id_records_its_commit_in_identity_config_and_reference_source(hub, tmp_path):
    from tirl.tasks.arith.problems import generate_problems
    from tirl.train import run_outputs

    data = tmp_path / "rl.jsonl"
    data.write_text("".join(json.dumps(p.to_row()) + "\n" for p in generate_problems(2, seed=0)))
    out = tmp_path / "rl"
    args = [f"model.path={REPO}@main", f"rl.data={data}", "rl.steps=1", "rl.prompts_per_step=2", "rl.n=2"]
    args += ["rl.mini_batch_size=4", "rl.save_every=1", "agent.max_response_tokens=8"]
    args += ["agent.max_tokens_per_turn=8", "threads=1", "logging.backends=[jsonl]", "--out", str(out)]
    assert main(["rl", *args]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["path"] == f"{REPO}@{COMMIT}"
    [ckpt] = run_outputs.complete_checkpoints(out)
    assert json.loads((ckpt / "manifest.json").read_text())["settings"]["model"] == f"{REPO}@{COMMIT}"
    assert torch.load(ckpt / "trainer_state.pt", weights_only=False)["ref_source"] == f"{REPO}@{COMMIT}"
