"""`python -m tirl.launch.wait`: block until every server a run needs answers `GET /health` with 200.

A train node runs it before torchrun, so that the trainer's own start-up checks meet servers that are up rather
than fail on a vLLM server still loading its model. vLLM URLs get the run's key (`$TIRL_VLLM_API_KEY`, when set) and
`--sandbox` URLs the sandbox's token (`--sandbox-token-file`, else `$TIRL_SANDBOX_TOKEN`), as tirl's own clients
send them, so a server that guards /health answers too. A progress line goes to stderr every `--progress-s`
seconds; exit 0 once all answer, 1 at `--timeout` naming each URL that did not and what it last said, 2 for a
bad argument.

Deliberately not here: any check beyond /health (the trainer's start-up checks run the sandbox and load the weights).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import httpx

KEY_ENV, TOKEN_ENV = "TIRL_VLLM_API_KEY", "TIRL_SANDBOX_TOKEN"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tirl.launch.wait", description="wait until every URL answers GET /health with 200"
    )
    p.add_argument("urls", nargs="*", help=f"vLLM server URLs (sent ${KEY_ENV} when set)")
    p.add_argument("--sandbox", action="append", default=[], help="a sandbox service URL (sent its token)")
    p.add_argument("--sandbox-token-file", default=None, help=f"the sandbox's token (default: ${TOKEN_ENV})")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before giving up (default 1800)")
    p.add_argument("--every", type=float, default=2.0, help="seconds between rounds (default 2)")
    p.add_argument(
        "--progress-s", type=float, default=60.0, help="seconds between progress lines (default 60)"
    )
    return p


def bearer(secret: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"} if secret else {}


def sandbox_token(path: str | None) -> str | None:
    if path:
        return Path(path).read_text(encoding="utf-8").strip()
    return os.environ.get(TOKEN_ENV) or None


def probe(client: httpx.Client, url: str, headers: dict[str, str]) -> str | None:
    """None when `url`/health answers 200, else what it said (a status, or the connection's error)."""
    try:
        response = client.get(url.rstrip("/") + "/health", headers=headers)
    except httpx.HTTPError as e:
        return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return None if response.status_code == 200 else f"HTTP {response.status_code}"


def wait(
    targets: dict[str, dict[str, str]],
    *,
    timeout: float,
    every: float,
    progress_s: float,
    out: TextIO | None = None,
) -> dict[str, str]:
    """Poll each URL of `targets` (URL -> headers) until it answers 200 or `timeout` passes; returns the URLs that
    never did, with what each said last. Lines go to `out` (default: stderr)."""
    out = out or sys.stderr
    start = last_note = time.monotonic()
    pending = {url: "not tried" for url in targets}
    # trust_env=False: a cluster's HTTP proxy must not carry requests meant for the nodes themselves
    with httpx.Client(timeout=min(5.0, max(timeout, 0.1)), trust_env=False) as client:
        while True:
            for url in list(pending):
                if (said := probe(client, url, targets[url])) is None:
                    del pending[url]
                    print(f"tirl.launch.wait: {url} answers", file=out, flush=True)
                else:
                    pending[url] = said
            elapsed = time.monotonic() - start
            if not pending or elapsed >= timeout:
                return pending
            if time.monotonic() - last_note >= progress_s:
                last_note = time.monotonic()
                waiting = ", ".join(f"{u} ({s})" for u, s in pending.items())
                print(
                    f"tirl.launch.wait: {len(targets) - len(pending)} of {len(targets)} answer after "
                    f"{elapsed:.0f} s of {timeout:g}; waiting for {waiting}",
                    file=out,
                    flush=True,
                )
            time.sleep(min(every, max(timeout - elapsed, 0.0)))


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    every_url = [*args.urls, *args.sandbox]
    if not every_url:
        parser().error("name at least one URL")
    bad = [u for u in every_url if not u.startswith(("http://", "https://"))]
    if bad:
        parser().error(f"not an http(s) URL: {', '.join(bad)}")
    if not (args.timeout >= 0 and args.every > 0 and args.progress_s > 0):
        parser().error("--timeout must be >= 0, --every and --progress-s > 0")
    try:
        token = sandbox_token(args.sandbox_token_file)
    except (OSError, UnicodeDecodeError) as e:
        parser().error(f"--sandbox-token-file {args.sandbox_token_file}: {e}")
    targets = {u: bearer(os.environ.get(KEY_ENV)) for u in args.urls}
    targets |= {u: bearer(token) for u in args.sandbox}
    missing = wait(targets, timeout=args.timeout, every=args.every, progress_s=args.progress_s)
    if missing:
        print(
            f"tirl.launch.wait: after {args.timeout:g} s, {len(missing)} of {len(targets)} did not answer GET "
            f"/health with 200: " + "; ".join(f"{u} ({s})" for u, s in missing.items()),
            file=sys.stderr,
            flush=True,
        )
        return 1
    print(f"tirl.launch.wait: all {len(targets)} answer", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
