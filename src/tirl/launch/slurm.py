"""`tirl launch slurm`: `tirl.sbatch` (the job: nodes, addresses, keys, one `srun` step, requeue on the time-limit
notice) and `tirl-node.sh` (what every node of that step runs: its role by `$SLURM_NODEID`).

The step's tasks end together: a train node records its exit code in `RUN/.launch/job-ID.RESTART/`, and the server
nodes stop their servers once every train node has (else a finished run would hold its nodes until the time
limit); a server that dies first fails its node, and `--kill-on-bad-exit` ends the step. On SIGTERM (preemption,
`scancel`, the notice) Slurm signals every process of the step; a train node's shell keeps waiting while the
trainer writes its checkpoint.

Rendering also prepares the run directory, which must exist before Slurm opens the job's log there: it is
checked as `tirl STAGE --out` checks it, created, marked as the stage's (so the log and `.launch/` beside the run
are no foreign files to it) and given `.launch/` (0700).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from tirl import __version__
from tirl.core.io import atomic_write_text, check_output_path
from tirl.core.rundir import check_out, mark
from tirl.launch.layout import LaunchError, Layout
from tirl.launch.shell import Sh, assignment, gpu_block, server_lines, train_function

SBATCH, NODE = "tirl.sbatch", "tirl-node.sh"
_TIME = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}")  # Slurm's forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_NAME = re.compile(r"[A-Za-z0-9_.,+-]+")


@dataclass(frozen=True)
class SlurmOptions:
    """What only Slurm asks: where the job runs and for how long; `notice_s`: how long before the time limit the
    job is told to checkpoint and requeue."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    notice_s: int = 300

    def __post_init__(self) -> None:
        for option, value in (("--partition", self.partition), ("--account", self.account)):
            if value is not None and not _NAME.fullmatch(value):
                raise LaunchError(f"{option} {value!r} is not a Slurm name (letters, digits, _ . , + -)")
        if self.time is not None and not _TIME.fullmatch(self.time):
            raise LaunchError(
                f"--time {self.time!r} is not a Slurm time limit: HH:MM:SS, D-HH:MM:SS or minutes"
            )
        if not 10 <= self.notice_s <= 86400:
            raise LaunchError(f"--notice-s must be 10-86400 seconds, got {self.notice_s}")


def sbatch_value(value: str) -> str:
    """A value for an `#SBATCH` line, which Slurm reads with its own rules: `"` groups, `\\` escapes."""
    if re.fullmatch(r"[A-Za-z0-9_./:@%,+=-]+", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def header(layout: Layout, opts: SlurmOptions) -> list[str]:
    # the log beside the run; in Slurm's file names %j is the job id and %% a literal %
    log = os.path.join(layout.run_dir.replace("%", "%%"), "slurm-%j.out")
    lines = [
        f"--job-name={layout.name}",
        f"--nodes={layout.nodes}",
        "--ntasks-per-node=1",
        *([f"--gpus-per-node={layout.gpus_per_node}"] if layout.gpus_per_node else []),
        *([f"--partition={opts.partition}"] if opts.partition else []),
        *([f"--account={opts.account}"] if opts.account else []),
        *([f"--time={opts.time}"] if opts.time else []),
        "--requeue",
        "--open-mode=append",
        sbatch_value(f"--output={log}"),
        f"--signal=B:USR1@{opts.notice_s}",  # to the batch shell only: it decides what the step gets
    ]
    return ["#!/bin/bash", *(f"#SBATCH {line}" for line in lines)]


def describe(layout: Layout) -> list[str]:
    """Comment lines: which node does what."""
    t, m = layout.train_nodes, layout.vllm_nodes
    first, last = layout.vllm_ports[0], layout.vllm_ports[-1]
    ports = f"{first}-{last}" if last > first else str(first)
    nodes = "node 0" if t == 1 else f"nodes 0-{t - 1}"
    out = [
        f"#   {nodes}: train (torchrun, {layout.gpus_per_node or 1} process(es) each; rendezvous on node 0:"
        f"{layout.rdzv_port})"
    ]
    if layout.stage == "rl":
        vnodes = f"node {t}" if m == 1 else f"nodes {t}-{t + m - 1}"
        out.append(f"#   {vnodes}: vLLM, {layout.servers_per_node} server(s) each on ports {ports}")
        where = (
            f"node {layout.sandbox_index}" if layout.sandbox_node else f"node {t}, beside its vLLM servers"
        )
        out.append(f"#   the sandbox service: {where}, port {layout.sandbox_port}")
    return out


SBATCH_BODY = r"""
mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
if (( ${#HOSTS[@]} != NODES )); then
  echo "tirl.sbatch: the job has ${#HOSTS[@]} nodes (${HOSTS[*]}), this script was rendered for $NODES" >&2
  exit 1
fi
export TIRL_HOSTS="${HOSTS[*]}"
export TIRL_RDZV_ENDPOINT="${HOSTS[0]}:$RDZV_PORT"
"""

SBATCH_SERVERS = r"""
URLS=()
for (( n = TRAIN_NODES; n < TRAIN_NODES + VLLM_NODES; n++ )); do
  for (( k = 0; k < SERVERS_PER_NODE; k++ )); do URLS+=("http://${HOSTS[n]}:$(( VLLM_PORT + k ))"); done
done
TIRL_VLLM_URLS=$(IFS=,; echo "${URLS[*]}")
export TIRL_VLLM_URLS
export TIRL_SANDBOX_URL="http://${HOSTS[SANDBOX_NODE]}:$SANDBOX_PORT"
# the vLLM servers' key: yours when set, else a new one for this job (servers and trainers get it from srun)
if [[ -z "${TIRL_VLLM_API_KEY:-}" ]]; then
  TIRL_VLLM_API_KEY=$("$PY" -c 'import secrets; print(secrets.token_urlsafe(32))')
fi
export TIRL_VLLM_API_KEY
# the sandbox's token: a file on the shared run directory, private to you, made once and kept across requeues
TOKEN_FILE="$RUN/.launch/sandbox.token"
if [[ ! -s "$TOKEN_FILE" ]]; then
  (umask 077 && mkdir -p "$RUN/.launch" \
    && "$PY" -c 'import secrets; print(secrets.token_urlsafe(32))' > "$TOKEN_FILE.$$.tmp" \
    && mv -f "$TOKEN_FILE.$$.tmp" "$TOKEN_FILE")
fi
chmod 600 "$TOKEN_FILE"
echo "tirl.sbatch: vLLM $TIRL_VLLM_URLS; sandbox $TIRL_SANDBOX_URL" >&2
"""

SBATCH_STEP = r"""
# where the train nodes record their exit codes, so that the server nodes know when to stop
mkdir -p "$RUN/.launch/job-$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}"
echo "tirl.sbatch: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on ${HOSTS[*]}" >&2

# shellcheck disable=SC2317  # reached from the trap below
on_notice() {  # USR1 (--signal): the time limit is near
  echo "tirl.sbatch: time limit near: SIGTERM to the step (the trainer checkpoints), then requeue" >&2
  kill -TERM "$STEP" 2>/dev/null || true
  wait "$STEP" || true
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
}
# shellcheck disable=SC2317  # reached from the trap below
on_term() {  # preemption or scancel: Slurm signals the step as well; give the trainer its checkpoint
  echo "tirl.sbatch: SIGTERM: waiting for the step to stop" >&2
  kill -TERM "$STEP" 2>/dev/null || true
  wait "$STEP" || true
  exit 143
}
trap on_notice USR1
trap on_term TERM

srun --kill-on-bad-exit=1 --nodes="$NODES" --ntasks="$NODES" --ntasks-per-node=1 bash "$NODE_SCRIPT" &
STEP=$!
rc=0
wait "$STEP" || rc=$?
exit "$rc"
"""


def render_sbatch(layout: Layout, opts: SlurmOptions, node_script: str) -> str:
    lines = header(layout, opts)
    lines += [
        "#",
        f"# One tirl {layout.stage} run on {layout.nodes} nodes, rendered by `tirl launch slurm` (tirl {__version__});",
        "# read and edit it freely. Submit: sbatch THIS_FILE. Every node runs tirl-node.sh in one srun step:",
        *describe(layout),
        f"# {opts.notice_s} s before the time limit the trainer checkpoints (SIGTERM) and the job requeues itself;",
        "# a requeued job resumes from the newest checkpoint (--resume auto).",
        "set -euo pipefail",
        "",
        *([assignment("PY", layout.python)] if layout.stage == "rl" else []),  # it makes the key
        assignment("RUN", layout.run_dir),
        assignment("NODE_SCRIPT", node_script),
        f"NODES={layout.nodes}",
        f"RDZV_PORT={layout.rdzv_port}",
    ]
    if layout.stage == "rl":
        lines += [
            f"TRAIN_NODES={layout.train_nodes}",
            f"VLLM_NODES={layout.vllm_nodes}",
            f"SERVERS_PER_NODE={layout.servers_per_node}",
            f"VLLM_PORT={layout.vllm_port}",
            f"SANDBOX_NODE={layout.sandbox_index}",
            f"SANDBOX_PORT={layout.sandbox_port}",
        ]
    body = SBATCH_BODY + (SBATCH_SERVERS if layout.stage == "rl" else "") + SBATCH_STEP
    return "\n".join(lines) + "\n" + body


NODE_HEAD = r"""
read -r -a HOSTS <<< "${TIRL_HOSTS:?is set by tirl.sbatch: the hosts of the job, space-separated}"
NODE_ID=${SLURM_NODEID:?is set by srun: the index of this node in the job}
NODE_ADDR=${HOSTS[NODE_ID]}
NODE_RANK=$NODE_ID  # train nodes come first
DONE_DIR="$RUN/.launch/job-${SLURM_JOB_ID:?is set by Slurm}.${SLURM_RESTART_COUNT:-0}"
log() { echo "tirl-node $NODE_ID ($NODE_ADDR): $*" >&2; }
"""

NODE_SERVE = r"""
trained() {  # every train node has recorded its exit code
  local codes=("$DONE_DIR"/train-*.exit)
  [[ -e "${codes[0]}" ]] && (( ${#codes[@]} >= TRAIN_NODES ))
}
stop_servers() {
  kill -TERM "${PIDS[@]}" 2>/dev/null || true
  wait || true
}
serve_until_trained() {  # the servers run in the background (PIDS); stop them once training is over
  trap 'log "SIGTERM: stopping the servers"; stop_servers; exit 143' TERM
  ( until trained; do sleep "$POLL_S"; done ) &
  PIDS+=("$!")
  local rc=0
  wait -n || rc=$?
  if trained; then
    log "training is over: stopping the servers"
    stop_servers
    exit 0
  fi
  log "a server exited with code $rc before training was over"
  stop_servers
  exit $(( rc == 0 ? 1 : rc ))
}
"""

NODE_FINISH = r"""
finish() {  # record this train node's exit code (the server nodes stop once every train node has one); exit with it
  mkdir -p "$DONE_DIR"
  local done_file="$DONE_DIR/train-$NODE_ID.exit"
  echo "$1" > "$done_file.$$" && mv -f "$done_file.$$" "$done_file"
  log "exiting with code $1"
  exit "$1"
}
"""


def render_node(layout: Layout) -> str:
    lines = [
        "#!/bin/bash",
        f"# tirl-node.sh: every node of the tirl {layout.stage} job runs it (srun, from tirl.sbatch); its role comes",
        "# from $SLURM_NODEID, its address from $TIRL_HOSTS, and every server binds that address:",
        *describe(layout),
        "set -euo pipefail",
        "",
        assignment("PY", layout.python),
        assignment("RUN", layout.run_dir),
        *NODE_HEAD.strip("\n").splitlines(),
        *gpu_block(layout),
        "",
    ]
    before = ["  trap 'log \"SIGTERM: the trainer writes a checkpoint and stops\"' TERM"]
    lines += NODE_FINISH.strip("\n").splitlines()
    lines += train_function(
        layout, rdzv_id=Sh('"$SLURM_JOB_ID"'), token_file=True, finish="finish", before=before
    )
    if layout.stage == "rl":
        lines += ["", f"TRAIN_NODES={layout.train_nodes}", "POLL_S=${TIRL_LAUNCH_POLL_S:-10}  # seconds"]
        lines += NODE_SERVE.strip("\n").splitlines()
        for role in sorted({r for r in layout.roles() if r != "train"}):
            lines += [f"{role.replace('+', '_')}() {{"]
            lines += server_lines(layout, vllm="vllm" in role, sandbox="sandbox" in role, token_file=True)
            lines += ["  serve_until_trained", "}"]
    return "\n".join(lines) + "\n\n" + dispatch(layout)


def dispatch(layout: Layout) -> str:
    """Run this node's role: consecutive nodes of one role share a test on $NODE_ID."""
    roles, lines, start = layout.roles(), [], 0
    while start < len(roles):
        end = start
        while end + 1 < len(roles) and roles[end + 1] == roles[start]:
            end += 1
        test = f"NODE_ID == {start}" if start == end else f"NODE_ID <= {end}"
        lines.append(f"{'if' if not lines else 'elif'} (( {test} )); then {roles[start].replace('+', '_')}")
        start = end + 1
    lines += [f'else log "no role: the job has {len(roles)} nodes (0-{len(roles) - 1})"; exit 1', "fi"]
    return "\n".join(lines) + "\n"


def write(layout: Layout, opts: SlurmOptions, out: str | Path) -> list[Path]:
    """Check and prepare the run directory, then write both files (atomically, 0755); returns their paths."""
    out = Path(os.path.abspath(check_output_path(out)))
    if out.exists() and not out.is_dir():
        raise LaunchError(f"--out {out} is a file: name a directory for {SBATCH} and {NODE}")
    run = Path(layout.run_dir)
    check_out(check_output_path(run, "--run-dir"), layout.stage)
    (run / ".launch").mkdir(mode=0o700, parents=True, exist_ok=True)
    mark(run, layout.stage)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / SBATCH, out / NODE]
    for path, text in zip(
        paths, (render_sbatch(layout, opts, str(paths[1])), render_node(layout)), strict=True
    ):
        atomic_write_text(path, text)
        path.chmod(0o755)
    return paths
