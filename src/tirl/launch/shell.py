"""The bash both renderers write: quoting, and the command lines of each role (trainer, vLLM servers, sandbox).

A command is a list of words: a plain `str` is a literal and is quoted with `shlex.quote` (a run directory with a
space or a `'` reaches the program unchanged); an `Sh` is shell text written as is, for the expansions a node fills
in (`"$NODE_ADDR"`, `"$TIRL_VLLM_URLS"`). Everything known at render time is a literal; only what a node learns at
start (its address, the job's hosts, the rendezvous id) is an expansion, and each is double-quoted.

The scripts define, before these lines run: `PY` (the interpreter), `RUN` (the run directory), `NODE_ADDR` (this
node's address), `NODE_RANK` (its index among the train nodes), `log` (a line to stderr), and for an RL run
`TIRL_VLLM_URLS` (comma-separated) and `TIRL_SANDBOX_URL`.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from tirl.launch.layout import WAIT_TIMEOUT_S, Layout


class Sh(str):
    """Shell text written as is (an expansion), never quoted."""


Word = str | Sh


def quote(word: Word) -> str:
    return str(word) if isinstance(word, Sh) else shlex.quote(word)


def command(words: Sequence[Word], indent: str = "  ", width: int = 110) -> list[str]:
    """`words` as one command over as many lines as it takes, each continued with a backslash; an option stays on
    the line of its value (`--port 8000`)."""
    units: list[str] = []
    for word in map(quote, words):
        option = units[-1] if units else ""
        if option.startswith("--") and " " not in option and "=" not in option and not word.startswith("-"):
            units[-1] = f"{option} {word}"
        else:
            units.append(word)
    lines, line = [], indent
    for unit in units:
        if line.strip() and len(line) + 1 + len(unit) > width - 2:
            lines.append(line + " \\")
            line = indent + "    "
        line += ("" if not line.strip() else " ") + unit
    return lines + [line]


def assignment(name: str, value: str) -> str:
    return f"{name}={shlex.quote(value)}"


GPU_FUNCTIONS = """\
# the node's GPUs: those the scheduler gave (CUDA_VISIBLE_DEVICES), else 0..G-1; each vLLM server takes a share
GPUS=()
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  IFS=, read -r -a GPUS <<< "$CUDA_VISIBLE_DEVICES"
else
  for (( g = 0; g < GPUS_PER_NODE; g++ )); do GPUS+=("$g"); done
fi
if (( ${#GPUS[@]} < GPUS_PER_NODE )); then
  log "this node has ${#GPUS[@]} GPU(s) (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}), the layout $GPUS_PER_NODE"
  exit 1
fi
gpu_share() {  # the GPUs of server $1, comma-separated
  local IFS=,
  echo "${GPUS[*]:$(( $1 * GPUS_PER_SERVER )):GPUS_PER_SERVER}"
}
"""


def gpu_block(layout: Layout) -> list[str]:
    """GPU bookkeeping for the servers; nothing without GPUs."""
    if not layout.gpus_per_node:
        return []
    return [
        f"GPUS_PER_NODE={layout.gpus_per_node}",
        f"GPUS_PER_SERVER={layout.gpus_per_server}",
        *GPU_FUNCTIONS.splitlines(),
    ]


def trainer_words(layout: Layout, *, rdzv_id: Word, token_file: bool) -> list[Word]:
    """torchrun over the train nodes, then `tirl STAGE` with the layout's keys and the user's overrides."""
    words: list[Word] = [
        Sh('"$PY"'),
        "-m",
        "torch.distributed.run",
        f"--nnodes={layout.train_nodes}",
        f"--nproc_per_node={layout.gpus_per_node or 1}",
        "--rdzv_backend=c10d",
        Sh('--rdzv_endpoint="$TIRL_RDZV_ENDPOINT"'),
        Sh(f"--rdzv_id={rdzv_id}") if isinstance(rdzv_id, Sh) else f"--rdzv_id={rdzv_id}",
        Sh('--rdzv_conf=is_host="$IS_HOST"'),
        "--max_restarts=0",
        Sh('--local_addr="$NODE_ADDR"'),
        "-m",
        "tirl",
        layout.stage,
    ]
    words += ["--config", layout.config] if layout.config else []
    words += ["--out", Sh('"$RUN"'), "--resume", "auto"]
    if layout.stage == "rl":
        words += [
            "rollout.engine=vllm",
            Sh('"rollout.urls=[$TIRL_VLLM_URLS]"'),
            Sh('"rollout.vllm.sync_host=$NODE_ADDR"'),
            "sandbox.backend=remote",
            Sh('"sandbox.urls=[$TIRL_SANDBOX_URL]"'),
        ]
        # YAML-quoted: tirl parses an override's value as YAML, and a path may hold ": " or " #"
        words += [Sh('"sandbox.auth_token_file=\\"$RUN/.launch/sandbox.token\\""')] if token_file else []
    words += ["model.device=cuda"] if layout.gpus_per_node else []
    return words + list(layout.overrides)


def train_function(
    layout: Layout, *, rdzv_id: Word, token_file: bool, finish: str | None, before: Sequence[str] = ()
) -> list[str]:
    """`train()`: wait for the servers (RL), then torchrun. `finish`: the shell function that gets the exit code
    (of the wait when it fails, else of torchrun) and ends the node; None: torchrun replaces the shell (`exec`: a
    pod's PID 1 gets the kubelet's SIGTERM) and a failed wait ends the script (`set -e`)."""
    lines = [
        "train() {  # torchrun: one c10d rendezvous over the train nodes, hosted by train node 0",
        *before,
    ]
    lines += [
        f"  local IS_HOST=0{' rc=0' if finish else ''}",
        "  if (( NODE_RANK == 0 )); then IS_HOST=1; fi",
    ]
    if layout.gpus_per_node:
        every = ",".join(str(g) for g in range(layout.gpus_per_node))
        lines.append(f'  export CUDA_VISIBLE_DEVICES="${{CUDA_VISIBLE_DEVICES:-{every}}}"')
    if layout.stage == "rl":
        wait: list[Word] = [Sh('"$PY"'), "-m", "tirl.launch.wait", "--timeout", str(WAIT_TIMEOUT_S)]
        wait += [Sh('"${VLLM_URLS[@]}"'), "--sandbox", Sh('"$TIRL_SANDBOX_URL"')]
        wait += ["--sandbox-token-file", Sh('"$RUN/.launch/sandbox.token"')] if token_file else []
        lines += [
            "  local VLLM_URLS",
            '  IFS=, read -r -a VLLM_URLS <<< "$TIRL_VLLM_URLS"',
            '  log "waiting for the servers to answer: $TIRL_VLLM_URLS $TIRL_SANDBOX_URL"',
            *command([*wait, *([Sh(f'|| {finish} "$?"')] if finish else [])]),
        ]
    trainer = trainer_words(layout, rdzv_id=rdzv_id, token_file=token_file)
    lines.append('  log "starting torchrun (rendezvous host: $IS_HOST)"')
    if finish is None:
        return [*lines, *command([Sh("exec"), *trainer]), "}"]
    return [*lines, *command([*trainer, Sh("|| rc=$?")]), f'  {finish} "$rc"', "}"]


def server_lines(layout: Layout, *, vllm: bool, sandbox: bool, token_file: bool) -> list[str]:
    """Start this node's K vLLM servers and the sandbox (each when asked) in the background, each pid in PIDS."""
    lines = ["  PIDS=()"]
    for k, port in enumerate(layout.vllm_ports if vllm else ()):
        words: list[Word] = [Sh('"$PY"'), "-m", "tirl", "serve-vllm", layout.model]
        words += ["--host", Sh('"$NODE_ADDR"'), "--port", str(port)]
        words += [f"--vllm-arg={arg}" for arg in layout.vllm_args]  # one each: a value may start with -
        gpus = [Sh(f'CUDA_VISIBLE_DEVICES="$(gpu_share {k})"')] if layout.gpus_per_node else []
        lines += [f'  log "vLLM server {k} on $NODE_ADDR:{port}"', *command([*gpus, *words, Sh("&")])]
        lines.append('  PIDS+=("$!")')
    if sandbox:
        lines += [f'  log "the sandbox service on $NODE_ADDR:{layout.sandbox_port}"']
        lines += [*command([*sandbox_words(layout, token_file=token_file), Sh("&")]), '  PIDS+=("$!")']
    return lines


def sandbox_words(layout: Layout, *, token_file: bool) -> list[Word]:
    """`tirl sandbox serve` on this node's address with the run's token, then `sandbox_tail`."""
    words: list[Word] = [Sh('"$PY"'), "-m", "tirl", "sandbox", "serve", "--host", Sh('"$NODE_ADDR"')]
    words += ["--port", str(layout.sandbox_port)]
    words += ["--auth-token-file", Sh('"$RUN/.launch/sandbox.token"')] if token_file else []
    return words + sandbox_tail(layout)


def sandbox_tail(layout: Layout) -> list[str]:
    """The sandbox server's settings: the run's config and its `sandbox.*` overrides (the limits and the isolation
    are the server's, not the client's)."""
    tail = ["--config", layout.config] if layout.config else []
    return tail + [o for o in layout.overrides if o.startswith("sandbox.")]
