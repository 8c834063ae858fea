"""`tirl sandbox serve`: argument parsing and the command; the server itself is tirl/sandbox/server.py."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
import sys
from collections.abc import Iterator
from typing import Any

from tirl.commands.args import load_run_config
from tirl.sandbox.auth import TOKEN_ENV


def add_sandbox_parser(sub: Any) -> None:
    """Register `tirl sandbox serve` on the top-level subparsers."""
    p = sub.add_parser("sandbox", help="the code sandbox as an HTTP service (SandboxFusion API)")
    ssub = p.add_subparsers(dest="sandbox_command", required=True)
    s = ssub.add_parser("serve", help="serve POST /run_code, GET /health, GET /metrics from a warm pool")
    s.add_argument(
        "--config", default=None, help="YAML config; its sandbox: section sets limits and isolation"
    )
    s.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    s.add_argument(
        "--workers", type=int, default=None, help="warm workers per tier (default: sandbox.max_workers)"
    )
    s.add_argument("--queue", type=int, default=64, help="requests waiting beyond the workers before 429")
    s.add_argument("--max-body-bytes", type=int, default=4 * 2**20, help="larger request bodies get 413")
    s.add_argument(
        "--read-timeout",
        type=float,
        default=30.0,
        help="seconds a connection has to send a complete request (from its opening or the previous response) "
        "before it is closed (default 30)",
    )
    s.add_argument(
        "--auth-token-file",
        default=None,
        help=f"file holding a shared secret every request must send as `Authorization: Bearer <token>` "
        f"(default: sandbox.auth_token_file, else ${TOKEN_ENV} when set, else no authentication)",
    )
    s.add_argument("overrides", nargs="*", help="dotted overrides, e.g. sandbox.timeout_s=10")
    s.set_defaults(fn=_serve)


def _serve(args: argparse.Namespace) -> int:
    from tirl.sandbox.auth import is_loopback, load_token
    from tirl.sandbox.connections import bind, resolve
    from tirl.sandbox.local import LocalSandbox
    from tirl.sandbox.server import serve

    cfg = load_run_config(args).sandbox
    if args.workers is not None:
        if args.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
        cfg = dataclasses.replace(cfg, max_workers=args.workers)
    if not 0 <= args.port <= 65535:  # before starting the pool: uvicorn would fail later with a traceback
        raise ValueError(f"--port must be 0-65535, got {args.port}")
    if args.queue < 0 or args.max_body_bytes < 1024:
        raise ValueError("--queue must be >= 0 and --max-body-bytes >= 1024")
    if not args.read_timeout > 0:
        raise ValueError(f"--read-timeout must be > 0 seconds, got {args.read_timeout}")
    cfg = dataclasses.replace(cfg, backend="local", max_queue=args.queue)
    token = load_token(args.auth_token_file or cfg.auth_token_file or None)
    resolve(args.host, args.port)  # a host that is no address fails here, not after the warning about it
    if token is None and not is_loopback(args.host):
        print(
            _OPEN_WARNING.format(host=args.host, port=args.port, env=TOKEN_ENV), file=sys.stderr, flush=True
        )
    sock = bind(args.host, args.port)  # before the pool starts and before "serving": a taken port fails here
    # The workers' memory cgroups must hold what a request may ask for, not just the default it gets without asking.
    pool_cfg = dataclasses.replace(cfg, memory_mb=cfg.max_memory_mb)
    try:
        with _interrupt_on_sigterm():
            # LocalSandbox raises SandboxUnavailable (a ConfigError) if the isolation cannot be had
            with sock, LocalSandbox(pool_cfg) as sandbox:
                print(
                    f"tirl sandbox: serving http://{args.host}:{sock.getsockname()[1]} ({sandbox.workers} workers, "
                    f"isolation {cfg.isolation}, limits {cfg.timeout_s:g} s / {cfg.memory_mb} MB by default, "
                    f"at most {cfg.max_timeout_s:g} s / {cfg.max_memory_mb} MB, "
                    f"auth {'bearer token' if token else 'none'})",
                    file=sys.stderr,
                    flush=True,
                )
                stopped_by = serve(
                    sandbox,
                    sock,
                    max_body_bytes=args.max_body_bytes,
                    max_queue=args.queue,
                    auth_token=token,
                    limits=cfg,
                    read_timeout_s=args.read_timeout,
                )
    except KeyboardInterrupt:  # a signal while the pool starts or closes: the `with` closed what it could
        print("tirl sandbox: interrupted", file=sys.stderr, flush=True)
        return 130
    print(
        f"tirl sandbox: stopped ({stopped_by or 'server exit'}); workers closed", file=sys.stderr, flush=True
    )
    return 0


@contextlib.contextmanager
def _interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM outside the serving loop (the pool starting or closing) raises KeyboardInterrupt as SIGINT does, so
    the pool's workers and cgroups are removed either way (the default action would kill the process at once)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


_OPEN_WARNING = """
WARNING: tirl sandbox: binding {host}:{port} WITHOUT a token. Anyone who can reach this port can run code
WARNING: here (in the sandbox, up to its limits). Set --auth-token-file FILE or ${env}, or bind 127.0.0.1
WARNING: behind a reverse proxy. See docs/sandbox-service.md.
"""
