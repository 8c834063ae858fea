"""A guard for tests of code that once hung: SIGALRM ends the block with a TimeoutError after `seconds`, so a
regression fails the test instead of stalling the suite (main thread only, as signals are)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def hang_guard(seconds: int, what: str) -> Iterator[None]:
    def stop(*_: object) -> None:
        raise TimeoutError(f"{what} after {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
