"""The shape of one multi-node run, as both renderers (Slurm, Kubernetes) read it: which node does what, on which
ports, with which command-line values, checked once so that neither renderer writes a file that fails later.

Nodes are numbered as the scheduler lists them: 0 .. T-1 train (torchrun, one c10d rendezvous hosted by node 0),
T .. T+M-1 run K vLLM servers each (ports `vllm_port`, `vllm_port + 1`, ...), and the last one the sandbox service;
without a sandbox node the sandbox runs on the first vLLM node beside its servers. An SFT run has train nodes only.

Every check raises `LaunchError` naming the option and the value (the CLI prints it and exits 2). Values that reach
a shell are quoted by the renderers, so a space or a `'` is fine; what no file can carry safely is refused here:
control characters anywhere, and `"` or `\\` in the run directory (it is written inside YAML-quoted overrides and
`#SBATCH` lines).

Deliberately not here: anything a scheduler alone knows (partitions, images, volumes: `slurm.py`, `k8s.py`).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from tirl.core.errors import TirlError

STAGES = ("rl", "sft")
# the keys the launch sets on the trainer's command line for an RL run: an override of one would fight the layout
MANAGED_KEYS = (
    "rollout.engine",
    "rollout.urls",
    "rollout.vllm.sync_host",
    "sandbox.backend",
    "sandbox.urls",
    "sandbox.auth_token_file",
)
_OVERRIDE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*=")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
WAIT_TIMEOUT_S = (
    1800  # how long a train node waits for every server to answer /health (a large model loads slowly)
)


class LaunchError(TirlError):
    """A launch option that cannot give working files; the message names the option and the value."""


@dataclass(frozen=True)
class Layout:
    """One run's nodes, ports and command-line values (module docstring). `vllm_nodes`/`sandbox_node` None: the
    stage's default (rl: 1 vLLM node and a sandbox node; sft: neither)."""

    stage: str
    run_dir: str
    python: str
    train_nodes: int = 1
    gpus_per_node: int = 0
    vllm_nodes: int | None = None
    servers_per_node: int = 1
    sandbox_node: bool | None = None
    model: str = ""
    config: str | None = None
    rdzv_port: int = 29500
    vllm_port: int = 8000
    sandbox_port: int = 8080
    overrides: tuple[str, ...] = ()
    vllm_args: tuple[str, ...] = ()
    name: str = "tirl"

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise LaunchError(f"--stage {self.stage!r}: choose one of {', '.join(STAGES)}")
        rl = self.stage == "rl"
        if self.vllm_nodes is None:
            object.__setattr__(self, "vllm_nodes", 1 if rl else 0)
        if self.sandbox_node is None:
            object.__setattr__(self, "sandbox_node", rl)
        self._check_counts()
        self._check_ports()
        self._check_values()

    def _check_counts(self) -> None:
        if self.train_nodes < 1:
            raise LaunchError(f"--train-nodes must be >= 1, got {self.train_nodes}")
        if self.gpus_per_node < 0:
            raise LaunchError(f"--gpus-per-node must be >= 0 (0: CPU only), got {self.gpus_per_node}")
        if self.servers_per_node < 1:
            raise LaunchError(f"--servers-per-node must be >= 1, got {self.servers_per_node}")
        if self.stage == "sft":
            if self.vllm_nodes:
                raise LaunchError(
                    f"--vllm-nodes {self.vllm_nodes} with --stage sft: SFT samples nothing, so it runs no vLLM "
                    "servers; drop --vllm-nodes"
                )
            if self.sandbox_node:
                raise LaunchError("--sandbox-node with --stage sft: SFT runs no tools; drop --sandbox-node")
            return
        if self.vllm_nodes < 1:
            raise LaunchError(
                f"--vllm-nodes must be >= 1 for --stage rl (it samples from them), got {self.vllm_nodes}"
            )
        if self.gpus_per_node % self.servers_per_node:
            raise LaunchError(
                f"--gpus-per-node {self.gpus_per_node} does not split evenly over --servers-per-node "
                f"{self.servers_per_node}: each vLLM server gets the same share of a node's GPUs"
            )
        if not self.model:
            raise LaunchError(
                "--model is required for --stage rl: the model the vLLM servers load (the trainer reloads "
                "model.path's weights into them as the run starts); give it, or model.path=... as an override"
            )

    def _check_ports(self) -> None:
        named = [("--rdzv-port", self.rdzv_port)]
        if self.stage == "rl":
            named += [("--vllm-port", self.vllm_port), ("--sandbox-port", self.sandbox_port)]
        for option, port in named:
            if not 1 <= port <= 65535:
                raise LaunchError(f"{option} must be a port, 1-65535, got {port}")
        if self.stage == "sft":
            return
        if self.vllm_port + self.servers_per_node - 1 > 65535:
            raise LaunchError(
                f"--vllm-port {self.vllm_port} with --servers-per-node {self.servers_per_node} runs past port 65535"
            )
        first, last = self.vllm_ports[0], self.vllm_ports[-1]
        for option, port in named[::2]:  # the rendezvous and the sandbox against the servers' range
            if port in self.vllm_ports:
                raise LaunchError(
                    f"{option} {port} collides with the vLLM servers' ports ({f'{first}-{last}' if last > first else first}) "
                    "(--vllm-port, --servers-per-node): choose another"
                )
        if self.sandbox_port == self.rdzv_port:
            raise LaunchError(f"--sandbox-port and --rdzv-port are both {self.rdzv_port}: choose two ports")

    def _check_values(self) -> None:
        for option, value in (
            ("--run-dir", self.run_dir),
            ("--python", self.python),
            ("--model", self.model),
            ("--config", self.config or ""),
            ("--name", self.name),
        ):
            if _CONTROL.search(value):
                raise LaunchError(
                    f"{option} {value!r} holds a control character (a newline, a tab): remove it"
                )
        if not self.python:
            raise LaunchError("--python is empty: name the interpreter every node runs tirl with")
        if not posixpath.isabs(self.run_dir) or posixpath.normpath(self.run_dir) == "/":
            raise LaunchError(
                f"--run-dir {self.run_dir!r} must be an absolute path below / on storage every node sees "
                "(each node starts in its own working directory)"
            )
        if '"' in self.run_dir or "\\" in self.run_dir:
            raise LaunchError(f'--run-dir {self.run_dir!r} holds a " or a \\: choose a path without them')
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,28}[a-z0-9])?", self.name):
            raise LaunchError(
                f"--name {self.name!r} must be 1-30 lower-case letters, digits or '-', starting with a letter "
                "(it names the Slurm job and the Kubernetes objects)"
            )
        for item in self.overrides:
            check_override(item)
            if self.stage == "rl" and item.split("=", 1)[0] in MANAGED_KEYS:
                raise LaunchError(
                    f"override {item!r}: the launch sets {item.split('=', 1)[0]} itself (from the layout: "
                    f"{', '.join(MANAGED_KEYS)}); drop it"
                )
        for arg in self.vllm_args:
            if _CONTROL.search(arg):
                raise LaunchError(f"--vllm-arg {arg!r} holds a control character: remove it")

    @property
    def nodes(self) -> int:
        """How many nodes the job asks for."""
        return self.train_nodes + self.vllm_nodes + (1 if self.sandbox_node else 0)

    @property
    def vllm_ports(self) -> tuple[int, ...]:
        """The ports of one vLLM node's servers."""
        return tuple(self.vllm_port + k for k in range(self.servers_per_node))

    @property
    def sandbox_index(self) -> int | None:
        """The node that runs the sandbox: its own (the last), else the first vLLM node; None for SFT."""
        if self.stage == "sft":
            return None
        return self.nodes - 1 if self.sandbox_node else self.train_nodes

    @property
    def gpus_per_server(self) -> int:
        return self.gpus_per_node // self.servers_per_node

    def roles(self) -> tuple[str, ...]:
        """Each node's role by index: "train", "vllm", "vllm+sandbox" or "sandbox"."""
        out = ["train"] * self.train_nodes + ["vllm"] * self.vllm_nodes
        if self.sandbox_node:
            out.append("sandbox")
        elif self.stage == "rl":
            out[self.train_nodes] = "vllm+sandbox"
        return tuple(out)

    @property
    def token_file(self) -> str:
        """The sandbox token on the shared run directory (Slurm; Kubernetes keeps it in a Secret)."""
        return posixpath.join(self.run_dir, ".launch", "sandbox.token")


def check_override(item: str) -> None:
    """Refuse an override that is not `dotted.key=value` or holds a control character."""
    if not _OVERRIDE.match(item):
        raise LaunchError(
            f"override {item!r} must have the form dotted.key=value (e.g. rl.steps=100), as tirl rl takes it"
        )
    if _CONTROL.search(item):
        raise LaunchError(f"override {item!r} holds a control character (a newline, a tab): remove it")


def model_from(overrides: tuple[str, ...], config_text: str | None) -> str:
    """The model the vLLM servers load when `--model` is not given: the last `model.path=` override, else
    `model.path` of the config file's text (YAML, read as every config is: `tirl.core.yamlread`), else ""."""
    from tirl.core.yamlread import load_yaml

    for item in reversed(overrides):
        key, _, value = item.partition("=")
        if key.strip() == "model.path":
            parsed = load_yaml(value) if value.strip() else ""
            return str(parsed) if parsed is not None else ""
    if config_text:
        data = load_yaml(config_text)
        model = data.get("model") if isinstance(data, dict) else None
        if isinstance(model, dict) and model.get("path"):
            return str(model["path"])
    return ""
