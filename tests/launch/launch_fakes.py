"""Stand-ins for what the launch files call, so that they run on one machine without Slurm, vLLM or torch:

- `fake_python`: a `$PY` that records its argv (one word a line) and environment per call in `FAKE_LOG`, keyed by
  `$SLURM_NODEID`, and plays the role the argv asks for: a server (`tirl serve-vllm`, `tirl sandbox serve`) runs
  until killed (or exits at once with `$FAKE_SERVER_RC`), `tirl.launch.wait` returns once `$FAKE_SERVERS` servers
  have started, torchrun sleeps `$FAKE_TRAIN_S` and exits `$FAKE_TRAIN_RC`; `-c CODE` runs the real Python.
- `fake_slurm`: `scontrol` (prints `$FAKE_HOSTS` one a line; logs `requeue`) and `srun` (runs the last two words,
  `bash SCRIPT`, once per task with SLURM_NODEID/SLURM_PROCID set, each in its own session, forwards SIGTERM to
  every task's process group as slurmstepd does, and exits with the highest exit code).

The "nodes" are loopback addresses 127.0.0.1, 127.0.0.2, ... of this machine.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

FAKE_PYTHON = r"""#!/bin/bash
rec="$FAKE_LOG/node${SLURM_NODEID:-x}.$$"
printf '%s\n' "$@" > "$rec.tmp" && mv "$rec.tmp" "$rec.argv"
{ echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"; echo "TIRL_VLLM_API_KEY=${TIRL_VLLM_API_KEY-unset}"; } > "$rec.env"
case "$1 ${2:-}" in
  "-c "*) exec REAL_PYTHON "$@" ;;
  "-m torch.distributed.run") sleep "${FAKE_TRAIN_S:-0}"; exit "${FAKE_TRAIN_RC:-0}" ;;
  "-m tirl.launch.wait")
    for _ in $(seq "${FAKE_WAIT_TRIES:-200}"); do
      n=$(grep -l -x -e serve-vllm -e sandbox "$FAKE_LOG"/*.argv 2>/dev/null | wc -l)
      if (( n >= ${FAKE_SERVERS:-0} )); then exit 0; fi
      sleep 0.05
    done
    exit 1 ;;
  "-m tirl")
    if [[ -n "${FAKE_SERVER_RC:-}" ]]; then exit "$FAKE_SERVER_RC"; fi
    exec sleep 600 ;;
esac
echo "fake python: unexpected argv: $*" >&2
exit 99
"""

FAKE_SCONTROL = r"""#!/bin/bash
case "$1" in
  show) printf '%s\n' $FAKE_HOSTS ;;
  requeue) echo "requeue $2" >> "$FAKE_LOG/scontrol.log" ;;
  *) exit 1 ;;
esac
"""

FAKE_SRUN = r"""#!/bin/bash
printf '%s\n' "$@" > "$FAKE_LOG/srun.argv"
n=0
for a in "$@"; do [[ "$a" == --ntasks=* ]] && n=${a#--ntasks=}; done
pids=()
for (( i = 0; i < n; i++ )); do
  SLURM_NODEID=$i SLURM_PROCID=$i setsid "${@: -2}" &
  pids+=("$!")
  echo "$!" >> "$FAKE_LOG/srun.pids"
done
trap 'echo TERM >> "$FAKE_LOG/srun.signals"; for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done' TERM
rc=0
for p in "${pids[@]}"; do
  while :; do
    r=0
    wait "$p" || r=$?
    if (( r > 128 )) && kill -0 "$p" 2>/dev/null; then continue; fi
    break
  done
  if (( r > rc )); then rc=$r; fi
done
exit "$rc"
"""


def write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def fake_python(directory: Path) -> Path:
    return write_exe(directory / "fake-python", FAKE_PYTHON.replace("REAL_PYTHON", sys.executable))


def fake_slurm(directory: Path) -> Path:
    """A bin directory with scontrol and srun; put it first on PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    write_exe(directory / "scontrol", FAKE_SCONTROL)
    write_exe(directory / "srun", FAKE_SRUN)
    return directory


def calls(log: Path, node: int) -> list[list[str]]:
    """The argv of every fake Python call node `node` made (real-Python `-c` calls left out), oldest first."""
    found = sorted(log.glob(f"node{node}.*.argv"), key=lambda p: p.stat().st_mtime_ns)
    argvs = [p.read_text().splitlines() for p in found]
    return [a for a in argvs if a[:1] != ["-c"]]


def env_of(log: Path, node: int, first: str) -> dict[str, str]:
    """The recorded environment of node `node`'s call whose argv includes `first`."""
    for p in log.glob(f"node{node}.*.argv"):
        if first in p.read_text().splitlines():
            lines = p.with_suffix(".env").read_text().splitlines()
            return dict(line.split("=", 1) for line in lines)
    raise AssertionError(f"node {node} made no call with {first}")


def kill_sessions(log: Path) -> None:
    """End every fake node the fake srun started (each its own session), by its process group id."""
    pids = log / "srun.pids"
    for pid in pids.read_text().split() if pids.exists() else []:
        try:
            os.killpg(int(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def loopback_hosts(n: int) -> list[str]:
    return [f"127.0.0.{i + 1}" for i in range(n)]
