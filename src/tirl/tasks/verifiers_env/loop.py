"""An event loop of its own, in a daemon thread, for an environment's coroutines.

verifiers awaits everything (`@vf.reward` methods, `Toolset.setup`, async `@vf.tool` methods), while tirl grades
and calls tools from plain threads. Each `EnvLoop` is one loop that lives as long as the process, so state an
environment ties to its loop (a client opened in `setup`) stays usable from call to call, as it does in the one
process verifiers runs a tool server in. Deliberately not here: `asyncio.run` per call (a new loop each time
would orphan that state) and running on the caller's thread (a blocking coroutine would hold up the trainer).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any


class EnvLoop:
    """Run coroutines on one event loop in a daemon thread, each within a time limit."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout_s: float | None = None) -> Any:
        """The coroutine's result; TimeoutError (the coroutine cancelled) when it takes over `timeout_s`."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"took longer than {timeout_s:g} s") from None
