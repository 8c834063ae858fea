"""`tirl serve-policy`: the policy endpoint on its own, for writing and debugging an agent program against it.

It loads the model as `tirl eval` does, serves `/v1/chat/completions` and `/v1/completions`
(`tirl.rollout.gateway.server`) at the run's sampling settings, opens an episode for every new episode id a request
names (`X-Episode-Id`, or the `/episodes/ID/v1` base URL; `default` without either), and on SIGINT or SIGTERM
writes each episode, with the trajectories tirl would train on, to OUT/episodes.jsonl.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from tirl.commands.args import add_config_command, load_run_config
from tirl.core.io import atomic_write_text


def add_serve_policy_parser(sub: Any) -> None:
    p = add_config_command(
        sub,
        "serve-policy",
        "the policy as an OpenAI-compatible endpoint that records tokens (model.path, the run's engine)",
        serve_policy_command,
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one)")
    p.add_argument("--out", default="runs/serve-policy", help="where episodes.jsonl is written on exit")


def serve_policy_command(args: argparse.Namespace) -> int:
    from tirl.commands.stages import inference_agent
    from tirl.rollout.gateway.episode import trajectories
    from tirl.rollout.gateway.server import Gateway, Served, app_of
    from tirl.train.rl.check import sampling_of

    cfg = load_run_config(args, args.config)
    out = Path(args.out)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with inference_agent(cfg, None, out) as agent:
        gateway = Gateway(agent.engine, agent.renderer, cfg.agent, cfg.agent.program, open_on_request=True)
        gateway.sampler.params = sampling_of(cfg.rollout)
        served = Served(app_of(gateway), args.host, args.port)
        if args.host not in ("127.0.0.1", "localhost", "::1"):
            print(
                f"tirl serve-policy: warning: bound to {args.host} without a token: anyone who can reach this port "
                "can sample from the policy",
                file=sys.stderr,
                flush=True,
            )
        print(
            f"tirl serve-policy: {served.url}/v1 (or {served.url}/episodes/ID/v1); Ctrl-C writes {out}",
            flush=True,
        )
        try:
            stop.wait()
        finally:
            served.stop()
            lines = []
            for eid in list(gateway.episodes):
                e = gateway.close(eid)
                trajs = trajectories(e, [], on_divergence=cfg.agent.program.on_divergence, training=True)
                lines.append(
                    json.dumps(
                        {
                            "episode": eid,
                            "status": e.status,
                            "calls": len(e.calls),
                            "divergences": e.divergences,
                            "trajectories": [t.to_dict() for t in trajs],
                        }
                    )
                )
            atomic_write_text(out / "episodes.jsonl", "".join(f"{ln}\n" for ln in lines))
            print(f"tirl serve-policy: {len(lines)} episodes in {out / 'episodes.jsonl'}", flush=True)
    return 0
