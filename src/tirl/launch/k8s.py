"""`tirl launch k8s`: one multi-document `tirl.yaml` for `kubectl apply -f`: the run's keys (a Secret), its node
scripts (a ConfigMap), the trainers (an Indexed Job behind a headless Service), the vLLM servers (a StatefulSet
behind a headless Service) and the sandbox service (a Deployment and a Service).

Why a StatefulSet for vLLM, not a Deployment behind one Service: the trainer syncs its weights into every replica
by address, so each replica needs its own stable DNS name (`NAME-vllm-0.NAME-vllm`); one Service would spread the
sync over the replicas, and all but one would keep sampling from stale weights. Trainer pod i of the Indexed Job
is `NAME-train-i.NAME-train`; pod 0 hosts the c10d rendezvous. A failed trainer pod is retried (`backoffLimit`)
and resumes with `--resume auto` from the run directory on the claim.

The scripts run from the ConfigMap as files, so that Kubernetes' `$(VAR)` expansion of `command` and `args`
never touches them; the one argv Kubernetes expands (the sandbox's `--host $(POD_IP)`) has every literal `$`
doubled. The keys reach the pods as environment variables from the Secret (`TIRL_VLLM_API_KEY`,
`TIRL_SANDBOX_TOKEN`), which the servers and tirl's clients read.
"""

from __future__ import annotations

import os
import posixpath
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tirl import __version__
from tirl.core.io import atomic_write_text, check_output_path
from tirl.launch.layout import LaunchError, Layout
from tirl.launch.shell import assignment, gpu_block, sandbox_tail, server_lines, train_function

YAML_FILE = "tirl.yaml"
SCRIPTS = "/etc/tirl"  # where the ConfigMap's scripts are mounted


@dataclass(frozen=True)
class K8sOptions:
    """What only Kubernetes asks: the image every pod runs, the claim that holds the run directory, and how many
    times a failed trainer pod is retried."""

    image: str
    pvc: str
    backoff_limit: int = 3

    def __post_init__(self) -> None:
        if not self.image or re.search(r"\s", self.image):
            raise LaunchError(f"--image {self.image!r} must be an image reference without spaces")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", self.pvc):
            raise LaunchError(
                f"--pvc {self.pvc!r} is not a PersistentVolumeClaim name (lower case, digits, - .)"
            )
        if not 0 <= self.backoff_limit <= 1000:
            raise LaunchError(f"--backoff-limit must be 0-1000, got {self.backoff_limit}")


def labels(layout: Layout, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "tirl",
        "app.kubernetes.io/instance": layout.name,
        "app.kubernetes.io/component": component,
    }


def meta(layout: Layout, suffix: str, component: str) -> dict[str, Any]:
    return {"name": f"{layout.name}-{suffix}", "labels": labels(layout, component)}


def headless(layout: Layout, component: str, ports: list[tuple[str, int]]) -> dict[str, Any]:
    """A headless Service: a DNS name per pod (`POD.SERVICE`), published before the pod is ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(layout, component, component),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": labels(layout, component),
            "ports": [{"name": name, "port": port, "targetPort": port} for name, port in ports],
        },
    }


def env(
    layout: Layout, *, keys: tuple[str, ...], values: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The pod's address (downward API), the Secret's keys it needs, and plain values."""
    secret = {"TIRL_VLLM_API_KEY": "vllm-api-key", "TIRL_SANDBOX_TOKEN": "sandbox-token"}
    out: list[dict[str, Any]] = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    out += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": f"{layout.name}-keys", "key": secret[k]}}}
        for k in keys
    ]
    return out + [{"name": k, "value": v} for k, v in (values or {}).items()]


def container(
    layout: Layout, opts: K8sOptions, name: str, *, script: str | None, gpus: bool
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": opts.image}
    if script:
        out["command"] = ["bash", f"{SCRIPTS}/{script}"]
    if gpus and layout.gpus_per_node:
        out["resources"] = {"limits": {"nvidia.com/gpu": layout.gpus_per_node}}
    return out


def pod_volumes(layout: Layout, opts: K8sOptions, *, run: bool) -> tuple[list[dict], list[dict]]:
    """(volumes, mounts): the scripts, /dev/shm in memory (NCCL and vLLM use it), and the claim at the run
    directory's parent."""
    volumes = [
        {"name": "scripts", "configMap": {"name": f"{layout.name}-scripts", "defaultMode": 0o555}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    mounts = [
        {"name": "scripts", "mountPath": SCRIPTS, "readOnly": True},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    if run:
        volumes.append({"name": "run", "persistentVolumeClaim": {"claimName": opts.pvc}})
        mounts.append({"name": "run", "mountPath": posixpath.dirname(posixpath.normpath(layout.run_dir))})
    return volumes, mounts


def urls(layout: Layout) -> tuple[list[str], str]:
    """(every vLLM server's URL, the sandbox's URL), by the Services' DNS names."""
    vllm = [
        f"http://{layout.name}-vllm-{i}.{layout.name}-vllm:{port}"
        for i in range(layout.vllm_nodes)
        for port in layout.vllm_ports
    ]
    return vllm, f"http://{layout.name}-sandbox:{layout.sandbox_port}"


def trainer_job(layout: Layout, opts: K8sOptions) -> dict[str, Any]:
    vllm, sandbox = urls(layout)
    values = {"TIRL_RDZV_ENDPOINT": f"{layout.name}-train-0.{layout.name}-train:{layout.rdzv_port}"}
    if layout.stage == "rl":
        values |= {"TIRL_VLLM_URLS": ",".join(vllm), "TIRL_SANDBOX_URL": sandbox}
    keys = ("TIRL_VLLM_API_KEY", "TIRL_SANDBOX_TOKEN") if layout.stage == "rl" else ()
    volumes, mounts = pod_volumes(layout, opts, run=True)
    main = container(layout, opts, "train", script="train.sh", gpus=True)
    main |= {
        "env": env(layout, keys=keys, values=values),
        "volumeMounts": mounts,
        "ports": [{"name": "rdzv", "containerPort": layout.rdzv_port}],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(layout, "train", "train"),
        "spec": {
            "completionMode": "Indexed",
            "completions": layout.train_nodes,
            "parallelism": layout.train_nodes,
            "backoffLimit": opts.backoff_limit,
            "template": {
                "metadata": {"labels": labels(layout, "train")},
                "spec": {
                    "subdomain": f"{layout.name}-train",  # pod i: NAME-train-i.NAME-train
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 120,
                    "containers": [main],
                    "volumes": volumes,
                },
            },
        },
    }


def ready(port: int, period_s: int) -> dict[str, Any]:
    """A readiness probe on `GET /health`, which tirl's vLLM servers and sandbox answer without a key."""
    return {"httpGet": {"path": "/health", "port": port}, "periodSeconds": period_s, "failureThreshold": 3}


def vllm_set(layout: Layout, opts: K8sOptions) -> dict[str, Any]:
    volumes, mounts = pod_volumes(layout, opts, run=True)
    main = container(layout, opts, "vllm", script="vllm.sh", gpus=True)
    main |= {
        "env": env(layout, keys=("TIRL_VLLM_API_KEY",)),
        "volumeMounts": mounts,
        "ports": [{"name": f"vllm-{k}", "containerPort": p} for k, p in enumerate(layout.vllm_ports)],
        "readinessProbe": ready(layout.vllm_ports[0], period_s=10),  # model loading takes minutes
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta(layout, "vllm", "vllm"),
        "spec": {
            "serviceName": f"{layout.name}-vllm",  # replica i: NAME-vllm-i.NAME-vllm, its own name for the sync
            "replicas": layout.vllm_nodes,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels(layout, "vllm")},
            "template": {
                "metadata": {"labels": labels(layout, "vllm")},
                "spec": {"containers": [main], "volumes": volumes},
            },
        },
    }


def sandbox_objects(layout: Layout, opts: K8sOptions) -> list[dict[str, Any]]:
    # Kubernetes expands $(POD_IP) here; every literal $ is doubled so that it reaches the server unchanged
    argv = [layout.python.replace("$", "$$"), "-m", "tirl", "sandbox", "serve", "--host", "$(POD_IP)"]
    argv += ["--port", str(layout.sandbox_port), *(a.replace("$", "$$") for a in sandbox_tail(layout))]
    main = container(layout, opts, "sandbox", script=None, gpus=False)
    main |= {
        "command": argv,
        "env": env(layout, keys=("TIRL_SANDBOX_TOKEN",)),
        "ports": [{"name": "http", "containerPort": layout.sandbox_port}],
        "readinessProbe": ready(layout.sandbox_port, period_s=5),
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(layout, "sandbox", "sandbox"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels(layout, "sandbox")},
            "template": {"metadata": {"labels": labels(layout, "sandbox")}, "spec": {"containers": [main]}},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(layout, "sandbox", "sandbox"),
        "spec": {
            "selector": labels(layout, "sandbox"),
            "ports": [{"name": "http", "port": layout.sandbox_port, "targetPort": layout.sandbox_port}],
        },
    }
    return [deployment, service]


def scripts(layout: Layout) -> dict[str, str]:
    """The pods' bash scripts: train.sh (every trainer pod) and vllm.sh (every vLLM replica)."""
    head = ["set -euo pipefail", assignment("PY", layout.python), 'NODE_ADDR="$POD_IP"']
    train = [
        *head,
        assignment("RUN", layout.run_dir),
        'NODE_RANK="$JOB_COMPLETION_INDEX"  # the pod index of the Indexed Job',
        'log() { echo "tirl train pod $NODE_RANK ($NODE_ADDR): $*" >&2; }',
    ]
    train += train_function(layout, rdzv_id=layout.name, token_file=False, finish=None) + ["train"]
    out = {"train.sh": "\n".join(train) + "\n"}
    if layout.stage == "rl":
        vllm = [
            *head,
            'log() { echo "tirl vLLM pod ($NODE_ADDR): $*" >&2; }',
            *gpu_block(layout),
            "serve() {",
        ]
        vllm += server_lines(layout, vllm=True, sandbox=False, token_file=False)
        vllm += [
            "  trap 'kill -TERM \"${PIDS[@]}\" 2>/dev/null || true; wait || true; exit 143' TERM",
            "  local rc=0",
            "  wait -n || rc=$?",
            '  log "a server exited with code $rc: stopping the others (the pod restarts)"',
            '  kill -TERM "${PIDS[@]}" 2>/dev/null || true',
            "  exit $(( rc == 0 ? 1 : rc ))",
            "}",
            "serve",
        ]
        out["vllm.sh"] = "\n".join(vllm) + "\n"
    return out


def documents(layout: Layout, opts: K8sOptions) -> list[dict[str, Any]]:
    """Every object of the run, in the order `kubectl apply` should create them."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta(layout, "keys", "keys"),
        "type": "Opaque",
        "stringData": {"vllm-api-key": secrets.token_urlsafe(32), "sandbox-token": secrets.token_urlsafe(32)},
    }
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(layout, "scripts", "scripts"),
        "data": scripts(layout),
    }
    docs = [configmap, headless(layout, "train", [("rdzv", layout.rdzv_port)]), trainer_job(layout, opts)]
    if layout.stage == "rl":  # SFT has no servers, so no keys
        docs.insert(0, secret)
        ports = [(f"vllm-{k}", p) for k, p in enumerate(layout.vllm_ports)]
        docs += [headless(layout, "vllm", ports), vllm_set(layout, opts), *sandbox_objects(layout, opts)]
    return docs


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the scripts) as literal blocks, readable and editable in place."""


_Dumper.add_representer(
    str,
    lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None),
)


SECRET_NOTE = """\
# The Secret below holds keys generated at render time: keep this file private (it is written 0600), or
# delete the Secret from it and create your own: kubectl create secret generic {name}-keys \\
#   --from-literal=vllm-api-key=$(openssl rand -hex 32) --from-literal=sandbox-token=$(openssl rand -hex 32)"""


def render(layout: Layout, opts: K8sOptions) -> str:
    rl = layout.stage == "rl"
    servers = (
        f"{layout.vllm_nodes} vLLM replica(s) x {layout.servers_per_node} server(s), a sandbox; "
        if rl
        else ""
    )
    head = [
        f"# One tirl {layout.stage} run, rendered by `tirl launch k8s` (tirl {__version__}): kubectl apply -f THIS_FILE",
        f"# {layout.train_nodes} trainer pod(s) ({layout.gpus_per_node or 'no'} GPUs each), {servers}"
        f"the run directory {layout.run_dir} on the claim {opts.pvc}.",
        *(SECRET_NOTE.format(name=layout.name).splitlines() if rl else []),
    ]
    body = "---\n".join(  # in the order kubectl should create them
        yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=110) for d in documents(layout, opts)
    )
    return "\n".join(head) + "\n" + body


def write(layout: Layout, opts: K8sOptions, out: str | Path) -> Path:
    """Write DIR/tirl.yaml atomically, private to its owner (it holds the keys)."""
    out = Path(check_output_path(out))
    if out.exists() and not out.is_dir():
        raise LaunchError(f"--out {out} is a file: name a directory for {YAML_FILE}")
    out.mkdir(parents=True, exist_ok=True)
    path = out / YAML_FILE
    text = render(layout, opts)
    old = os.umask(0o077)  # 0600 from the start: the keys are never readable by others, not even for a moment
    try:
        atomic_write_text(path, text)
    finally:
        os.umask(old)
    return path
