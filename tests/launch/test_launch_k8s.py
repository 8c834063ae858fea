"""`tirl launch k8s`: the documents validate against the Kubernetes schemas (kubernetes-validate, strict, the
newest version it ships), the trainers meet at pod 0's stable name, every vLLM replica has a name of its own, the
Secret's keys are the ones referenced, the claim holds the run directory, and the pods' scripts run (bash -n,
shellcheck, and train.sh with a fake `$PY`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from launch_fakes import calls, fake_python

from tirl.launch.k8s import K8sOptions, write
from tirl.launch.layout import LaunchError, Layout

RUN = "/runs/exp 1"


def render(tmp_path: Path, **changes) -> tuple[Path, dict[str, dict]]:
    """Write tirl.yaml for a 2-trainer, 3-replica x 2-server run; its documents by kind (and name for Services)."""
    base = dict(stage="rl", run_dir=RUN, python="python", train_nodes=2, gpus_per_node=4, vllm_nodes=3,
                servers_per_node=2, model="/runs/models/m", overrides=("rl.steps=3",), name="exp")  # fmt: skip
    path = write(
        Layout(**(base | changes)), K8sOptions(image="registry/tirl:1", pvc="runs"), tmp_path / "out"
    )
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return path, {
        d["kind"] + ("/" + d["metadata"]["name"] if d["kind"] == "Service" else ""): d for d in docs
    }


def pod(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]


def env_of(container: dict) -> dict[str, dict | str]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_every_document_validates_against_the_kubernetes_schemas(tmp_path: Path) -> None:
    kv = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (pip install kubernetes-validate)"
    )
    for stage in ("rl", "sft"):
        changes = {"vllm_nodes": None} if stage == "sft" else {}
        _, docs = render(tmp_path / stage, stage=stage, **changes)
        for doc in docs.values():
            kv.validate(doc, kv.latest_version(), strict=True)  # raises naming the field
    assert set(docs) == {"ConfigMap", "Service/exp-train", "Job"}  # SFT: trainers only
    docs["Job"]["spec"]["completions"] = "two"  # a planted error is caught
    with pytest.raises(kv.ValidationError):
        kv.validate(docs["Job"], kv.latest_version(), strict=True)
    docs["Job"]["spec"] |= {"completions": 2, "restartsPerIndex": 1}  # and so is an unknown field (strict)
    with pytest.raises(kv.ValidationError):
        kv.validate(docs["Job"], kv.latest_version(), strict=True)


def test_the_trainers_meet_at_pod_0_of_the_indexed_job(tmp_path: Path) -> None:
    _, docs = render(tmp_path)
    job, service = docs["Job"], docs["Service/exp-train"]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert job["spec"]["backoffLimit"] == 3
    assert pod(job)["subdomain"] == service["metadata"]["name"] == "exp-train"
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    env = env_of(pod(job)["containers"][0])
    assert (
        env["TIRL_RDZV_ENDPOINT"] == "exp-train-0.exp-train:29500"
    )  # Indexed Job pod 0's hostname.subdomain
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert pod(job)["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 4}}


def test_every_vllm_replica_has_a_stable_name_of_its_own(tmp_path: Path) -> None:
    _, docs = render(tmp_path)
    sts, service = docs["StatefulSet"], docs["Service/exp-vllm"]
    assert sts["spec"]["serviceName"] == service["metadata"]["name"] and sts["spec"]["replicas"] == 3
    assert service["spec"]["clusterIP"] == "None"
    assert [p["port"] for p in service["spec"]["ports"]] == [8000, 8001]
    urls = env_of(pod(docs["Job"])["containers"][0])["TIRL_VLLM_URLS"].split(",")
    assert urls == [f"http://exp-vllm-{i}.exp-vllm:{port}" for i in range(3) for port in (8000, 8001)]
    assert env_of(pod(docs["Job"])["containers"][0])["TIRL_SANDBOX_URL"] == "http://exp-sandbox:8080"
    assert docs["Service/exp-sandbox"]["spec"]["ports"][0]["port"] == 8080


def test_the_servers_are_ready_when_their_open_health_route_answers(tmp_path: Path) -> None:
    """Kubernetes' probes carry no key: they ask GET /health, which tirl's vLLM servers and sandbox leave open."""
    _, docs = render(tmp_path)
    vllm = pod(docs["StatefulSet"])["containers"][0]["readinessProbe"]["httpGet"]
    sandbox = pod(docs["Deployment"])["containers"][0]["readinessProbe"]["httpGet"]
    assert vllm == {"path": "/health", "port": 8000} and sandbox == {"path": "/health", "port": 8080}


def test_the_secret_holds_every_key_the_pods_reference(tmp_path: Path) -> None:
    path, docs = render(tmp_path)
    secret = docs["Secret"]
    refs = [
        e["valueFrom"]["secretKeyRef"]
        for kind in ("Job", "StatefulSet", "Deployment")
        for e in pod(docs[kind])["containers"][0]["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    ]
    assert {r["name"] for r in refs} == {secret["metadata"]["name"]}
    assert {r["key"] for r in refs} == set(secret["stringData"]) == {"vllm-api-key", "sandbox-token"}
    assert all(len(v) >= 32 for v in secret["stringData"].values())
    assert path.stat().st_mode & 0o777 == 0o600  # it holds the keys
    _, again = render(tmp_path / "again")
    assert again["Secret"]["stringData"] != secret["stringData"]  # new keys for every render


def test_the_claim_is_mounted_at_the_run_directory_parent(tmp_path: Path) -> None:
    _, docs = render(tmp_path)
    for kind in ("Job", "StatefulSet"):
        spec = pod(docs[kind])
        claim = next(v for v in spec["volumes"] if "persistentVolumeClaim" in v)
        assert claim["persistentVolumeClaim"]["claimName"] == "runs"
        mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        assert mounts[claim["name"]] == "/runs"


def test_the_sandbox_binds_its_pod_address_with_the_token_from_the_secret(tmp_path: Path) -> None:
    _, docs = render(tmp_path, overrides=("sandbox.max_timeout_s=300", "sandbox.python=/opt/$(POD_IP)/py"))
    container = pod(docs["Deployment"])["containers"][0]
    assert container["command"] == [
        "python", "-m", "tirl", "sandbox", "serve", "--host", "$(POD_IP)", "--port", "8080",
        "sandbox.max_timeout_s=300", "sandbox.python=/opt/$$(POD_IP)/py",  # Kubernetes expands only the --host
    ]  # fmt: skip
    assert env_of(container)["TIRL_SANDBOX_TOKEN"] == {
        "secretKeyRef": {"name": "exp-keys", "key": "sandbox-token"}
    }


def scripts(tmp_path: Path, **changes) -> dict[str, Path]:
    _, docs = render(tmp_path, **changes)
    out = {}
    for name, text in docs["ConfigMap"]["data"].items():
        out[name] = tmp_path / name
        out[name].write_text("#!/bin/bash\n" + text)
    return out


def test_the_pod_scripts_parse(tmp_path: Path) -> None:
    for path in scripts(tmp_path).values():
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
        if shutil.which("shellcheck"):
            result = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
            assert result.returncode == 0, result.stdout


def test_a_trainer_pod_waits_then_runs_torchrun_as_its_own_process(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.mkdir()
    train = scripts(tmp_path, python=str(fake_python(tmp_path)), gpus_per_node=0)["train.sh"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIRL_", "SLURM_", "CUDA_"))}
    env |= {"FAKE_LOG": str(log), "POD_IP": "10.0.0.7", "JOB_COMPLETION_INDEX": "0",
            "TIRL_RDZV_ENDPOINT": "exp-train-0.exp-train:29500", "TIRL_VLLM_URLS": "http://v0:8000,http://v1:8000",
            "TIRL_SANDBOX_URL": "http://exp-sandbox:8080", "SLURM_NODEID": "0"}  # fmt: skip
    result = subprocess.run(["bash", str(train)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    wait, trainer = calls(log, 0)
    assert wait == [
        "-m",
        "tirl.launch.wait",
        "--timeout",
        "1800",
        "http://v0:8000",
        "http://v1:8000",
        "--sandbox",
        "http://exp-sandbox:8080",
    ]  # fmt: skip  (the token comes from $TIRL_SANDBOX_TOKEN)
    assert trainer == [
        "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
        "--rdzv_endpoint=exp-train-0.exp-train:29500", "--rdzv_id=exp", "--rdzv_conf=is_host=1", "--max_restarts=0",
        "--local_addr=10.0.0.7", "-m", "tirl", "rl", "--out", RUN, "--resume", "auto", "rollout.engine=vllm",
        "rollout.urls=[http://v0:8000,http://v1:8000]", "rollout.vllm.sync_host=10.0.0.7", "sandbox.backend=remote",
        "sandbox.urls=[http://exp-sandbox:8080]", "rl.steps=3",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "opts, message",
    [(dict(image="a b", pvc="runs"), "--image 'a b'"), (dict(image="i", pvc="Runs"), "--pvc 'Runs'"),
     (dict(image="i", pvc="runs", backoff_limit=-1), "--backoff-limit must be 0-1000")],
)  # fmt: skip
def test_bad_kubernetes_options_name_themselves(opts: dict, message: str) -> None:
    with pytest.raises(LaunchError, match=message.replace("(", r"\(")):
        K8sOptions(**opts)


def test_the_command_line_writes_the_file_and_refuses_a_bad_claim(tmp_path: Path, capsys) -> None:
    from tirl.cli import main

    argv = ["launch", "k8s", "--out", str(tmp_path / "out"), "--run-dir", RUN, "--image", "r/tirl:1"]
    assert main([*argv, "--pvc", "runs", "--model", "/runs/m", "--", "rl.steps=3"]) == 0
    assert "kubectl apply -f" in capsys.readouterr().out
    assert (tmp_path / "out" / "tirl.yaml").is_file()
    assert main([*argv, "--pvc", "Runs!", "--model", "/runs/m"]) == 2
    assert "--pvc 'Runs!' is not a PersistentVolumeClaim name" in capsys.readouterr().err
