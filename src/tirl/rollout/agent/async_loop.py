"""The asynchronous agent loop: every trajectory advances on its own.

The lock-step `AgentLoop` waits, at each turn, for the slowest generation and then for the slowest tool call of the
whole batch. Here each trajectory runs in its own worker (at most `concurrency` at once): it generates a turn (one
prompt per `generate` request), runs its tool call, appends the result and goes on, so one trajectory's sandbox call
overlaps other trajectories' generation, and a finished trajectory frees its slot for the next prompt at once. That
pays off most with server engines (vLLM, OpenAI-compatible), which batch concurrent requests themselves; with the
in-process torch engine each request is its own decode loop on a thread (bench/rollout_async.py measures both).

Threads, not asyncio: `Engine.generate` and `Sandbox.run_batch` are blocking calls that release the GIL (HTTP, torch
ops, subprocess pipes). The stop rules, budgets, token-in/token-out and loss masks are the lock-step loop's own
functions (`apply_turn`, `apply_tool_results`, `execute_tool_calls`). A trajectory that runs past `timeout_s` (a hung
request or tool) is returned with stop reason "error", cut back to its last model tokens; its worker is abandoned
(a daemon thread: it cannot block exit) and replaced, so the run never hangs.

Timing decides nothing else: trajectories come back in prompt order, and each request is seeded by its
trajectory's seed (drawn in prompt order) and turn, so the order in which requests and tool calls finish changes no
bit of the result (the torch engine keeps each worker's KV prefixes apart for the same reason, `KeptPrefixes`).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from tirl.chat.template import ChatRenderer
from tirl.rollout.agent.loop import (
    AgentConfig,
    AgentLoop,
    apply_tool_results,
    apply_turn,
    execute_tool_calls,
    turn_budget,
)
from tirl.rollout.capabilities import capabilities_of
from tirl.rollout.engines.base import Engine
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Origin, Trajectory
from tirl.sandbox.types import Sandbox
from tirl.tools.base import ToolSet


class _Cancelled(Exception):
    """Raised inside an abandoned worker so that it stops touching its trajectory."""


def end_on_model_tokens(t: Trajectory) -> Trajectory:
    """Drop a trailing tool response (its result was never followed by a model turn), as the budget rule does."""
    n = len(t.loss_mask)
    while n and t.loss_mask[n - 1] == 0:
        n -= 1
    if n < len(t.loss_mask):
        del t.response_ids[n:], t.loss_mask[n:], t.logprobs[n:], t.token_versions[n:]
        for record in t.tool_calls:  # the dropped tool turn held the results of the last turn's calls
            if record.turn == t.turns:
                record.result_seen = False
    return t


def _seed_kwargs(engine: Engine, seed: int) -> dict[str, Any]:
    """A per-request seed, or for an engine without them a generator on its device (one request per call here, so
    the same thing)."""
    return capabilities_of(engine).seed_kwargs(seed, engine.device)


class AsyncAgentLoop(AgentLoop):
    """Runs batches of prompts to finished trajectories, each on its own (same interface as `AgentLoop.run`)."""

    def __init__(
        self,
        engine: Engine,
        renderer: ChatRenderer,
        sandbox: Sandbox,
        config: AgentConfig,
        *,
        tools: ToolSet | None = None,
        concurrency: int = 64,
        timeout_s: float = 600.0,
    ) -> None:
        if concurrency < 1 or timeout_s <= 0:
            raise ValueError(f"concurrency must be >= 1 and timeout_s > 0, got {concurrency}, {timeout_s}")
        super().__init__(engine, renderer, sandbox, config, tools=tools)
        self.concurrency, self.timeout_s = concurrency, timeout_s

    def run(
        self,
        prompts: Sequence[Sequence[dict[str, Any]]],
        params: SamplingParams,
        *,
        origins: Sequence[Origin] | None = None,
        generator: torch.Generator | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Trajectory]:
        """One trajectory per prompt, in prompt order. `generator` draws one integer seed per trajectory (as
        `draw_seeds` does), which seeds each of its requests (`EngineCapabilities.seed_kwargs`); `seeds` gives
        them instead (the streaming trainer draws a step's seeds at once and runs them group by group)."""
        trajs = self.new_trajectories(prompts, origins)
        seeds = draw_seeds(len(trajs), generator) if seeds is None else list(seeds)
        if len(seeds) != len(trajs):
            raise ValueError(f"{len(trajs)} prompts but {len(seeds)} seeds: give one seed per prompt")
        return _Run(self, trajs, params, seeds).wait()


def draw_seeds(n: int, generator: torch.Generator | None) -> list[int]:
    """`n` request seeds from `generator`: what `AsyncAgentLoop.run` draws for `n` prompts."""
    return torch.randint(0, 2**31 - 1, (n,), generator=generator).tolist()


class _Run:
    """One `run` call: a queue of trajectory indices, `concurrency` daemon workers, a watchdog for timeouts."""

    def __init__(
        self, loop: AsyncAgentLoop, trajs: list[Trajectory], params: SamplingParams, seeds: list[int]
    ):
        self.loop, self.trajs, self.params, self.seeds = loop, trajs, params, seeds
        self.cond = threading.Condition()
        self.next = 0
        self.started: dict[int, float] = {}  # index -> start time, while running
        self.result: dict[int, Trajectory | BaseException] = {}
        self.cancelled: set[int] = set()
        for _ in range(min(loop.concurrency, len(trajs))):
            self._spawn()

    def _spawn(self) -> None:
        threading.Thread(target=self._worker, daemon=True, name="tirl-async-rollout").start()

    def _worker(self) -> None:
        while True:
            with self.cond:
                if self.next >= len(self.trajs):
                    return
                i, self.next = self.next, self.next + 1
                self.started[i] = time.monotonic()
            try:
                out: Trajectory | BaseException = self._advance(i)
            except _Cancelled:
                return  # the watchdog already returned this trajectory and started a replacement worker
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                out = e
            with self.cond:
                if i in self.cancelled:
                    return
                self.started.pop(i, None)
                self.result[i] = out
                self.cond.notify_all()

    def _guard(self, i: int) -> None:
        with self.cond:
            if i in self.cancelled:
                raise _Cancelled

    def _advance(self, i: int) -> Trajectory:
        """One trajectory from its prompt to a stop reason: the lock-step loop's steps, one request at a time.
        Mutations happen under the lock so that the watchdog's snapshot is always consistent."""
        lp, t, cfg = self.loop, self.trajs[i], self.loop.config
        while True:
            g = lp.engine.generate(
                [t.prompt_ids + t.response_ids],
                self.params,
                max_new_tokens=[turn_budget(t, cfg)],
                **_seed_kwargs(lp.engine, self.seeds[i] + t.turns),
            )[0]
            with self.cond:
                self._guard(i)
                calls = apply_turn(t, g, lp.renderer, cfg, lp.tools.schemas)
            if not calls:
                return t
            outs = execute_tool_calls(lp.tools, lp.sandbox, calls, cfg)
            with self.cond:
                self._guard(i)
                if not apply_tool_results(t, calls, outs, g.finish_reason == "eos", lp.renderer, cfg):
                    return t

    def wait(self) -> list[Trajectory]:
        timeout = self.loop.timeout_s
        with self.cond:
            while len(self.result) < len(self.trajs):
                now = time.monotonic()
                for i, t0 in list(self.started.items()):
                    if now - t0 >= timeout:
                        self._abandon(i)
                deadlines = [t0 + timeout - now for t0 in self.started.values()]
                self.cond.wait(timeout=max(0.01, min(deadlines)) if deadlines else 1.0)
        for i in range(len(self.trajs)):
            if isinstance(self.result[i], BaseException):
                raise RuntimeError(f"rollout of trajectory {i} failed: {self.result[i]}") from self.result[i]
        trajs = [self.result[i] for i in range(len(self.trajs))]
        for t in trajs:
            t.check()
        return trajs  # type: ignore[return-value]

    def _abandon(self, i: int) -> None:
        """Called with the lock held: return a copy of trajectory i as an "error" and give its slot to a new
        worker."""
        self.cancelled.add(i)
        del self.started[i]
        t = end_on_model_tokens(copy.deepcopy(self.trajs[i]))
        t.stop_reason = "error"
        t.error = f"timed out after {self.loop.timeout_s:g} s"
        self.result[i] = t
        self._spawn()
