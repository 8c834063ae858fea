"""The user's agent program as the rollout, against the policy endpoint (docs/agents.md).

`ProgramLoop.run` has the agent loop's signature, so `tirl rl`, `tirl eval` and `tirl data sample` use it
unchanged. For each sample it opens an episode and hands it to the program (`agent.program.command`, no shell, in
its own process group; `tirl.rollout.gateway.processes`), whose environment holds `OPENAI_API_KEY`, `TIRL_BASE_URL`
and `TIRL_PROGRAM_MODE`:

- `mode: episode`: one process per episode, with `OPENAI_BASE_URL` the episode's base URL and `TIRL_EPISODE_ID`,
  and on its stdin one JSON object `{"episode": ID, "messages": [...]}`; its last stdout line is the answer (plain
  text or `{"answer": ...}`);
- `mode: worker`: `concurrency` long-lived processes, each taking one such object per line with the episode's
  `base_url` added, and answering each with a line `{"episode": ID, "answer": ...}`.

The messages are the problem's prompt, never its ground truth; the task's verifier grades the answer (a program may
also post `{"answer": ...}` to `/episodes/ID/report`). A program past `agent.program.timeout_s` has its process
group killed; one that exits non-zero has crashed; one that never called the model gave nothing: each ends its
episode with that status and trains nothing (`tirl.rollout.gateway.episode`).
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from tirl.chat.template import ChatRenderer
from tirl.rollout.agent.config import AgentConfig, ProgramConfig
from tirl.rollout.agent.loop import AgentLoop
from tirl.rollout.engines.base import Engine
from tirl.rollout.gateway.episode import Episode, trajectories
from tirl.rollout.gateway.processes import Worker, run_once
from tirl.rollout.gateway.server import Gateway, Served, app_of
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Origin, Trajectory
from tirl.sandbox.types import Sandbox
from tirl.tools.base import ToolSet


class ProgramLoop(AgentLoop):
    """Rolls out through the user's agent program; the trajectories are built from the tokens the endpoint sampled."""

    builds_from_problem = False  # the program writes its own prompts: there is no problem prompt to re-render

    def __init__(
        self,
        engine: Engine,
        renderer: ChatRenderer,
        sandbox: Sandbox,
        config: AgentConfig,
        program: ProgramConfig,
        *,
        tools: ToolSet | None = None,
    ) -> None:
        super().__init__(engine, renderer, sandbox, config, tools=tools)
        self.program = program
        self.gateway = Gateway(engine, renderer, config, program)
        self.argv = shlex.split(program.command)
        self.served: Served | None = None
        self.idle: queue.Queue[Worker] = queue.Queue()  # worker mode: the workers not running an episode
        self.counts: dict[str, float] = {}

    @property
    def url(self) -> str:
        """The endpoint's root, started (with the workers, in worker mode) on first use."""
        if self.served is None:
            self.served = Served(app_of(self.gateway), self.program.host, self.program.port)
            if self.program.mode == "worker":
                for _ in range(self.program.concurrency):
                    self.idle.put(Worker(self.argv, self._env(self.served.url)))
        return self.served.url

    def run(
        self,
        prompts: Sequence[Sequence[dict[str, Any]]],
        params: SamplingParams,
        *,
        origins: Sequence[Origin] | None = None,
        generator: torch.Generator | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Trajectory]:
        """The trajectories of one episode per prompt, in order (with on_divergence=split, an RL episode may give
        several, adjacent)."""
        if origins is not None and len(origins) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(origins)} origins: give one origin per prompt")
        url = self.url
        self.gateway.sampler.params, self.gateway.sampler.generator = params, generator
        ids = [uuid.uuid4().hex[:16] for _ in prompts]
        for i, eid in enumerate(ids):
            self.gateway.open(eid, origins[i] if origins else None)
        with ThreadPoolExecutor(self.program.concurrency, thread_name_prefix="tirl-agent-program") as pool:
            episodes = list(pool.map(lambda a: self._episode(url, *a), zip(ids, prompts, strict=True)))
        out: list[Trajectory] = []
        training = bool(origins) and origins[0].group is not None
        for e, messages in zip(episodes, prompts, strict=True):
            prompt_ids = (
                [] if e.calls else self.renderer.prompt_ids(messages)
            )  # only an episode without calls
            out += trajectories(
                e,
                prompt_ids,
                on_divergence=self.program.on_divergence,
                training=training,
                reported=self.program.reward == "program",
            )
        self._count(episodes, len(out))
        return out

    def _episode(self, url: str, eid: str, messages: Sequence[dict[str, Any]]) -> Episode:
        base = f"{url}/episodes/{eid}/v1"
        request = {"episode": eid, "messages": list(messages)}
        timeout = self.program.timeout_s
        if self.program.mode == "worker":
            worker = self.idle.get()
            try:
                done = worker.ask({**request, "base_url": base}, timeout)
            finally:
                self.idle.put(worker)
        else:
            env = self._env(url, TIRL_EPISODE_ID=eid, OPENAI_BASE_URL=base, TIRL_BASE_URL=base)
            done = run_once(self.argv, env, json.dumps(request), timeout)
        e = self.gateway.close(eid)
        e.answer = done.answer if done.answer is not None else e.answer
        e.score = done.score if done.score is not None else e.score
        # how the program ended, except that a spent budget stays "budget" when the program then ended well
        if done.status != "ok" or e.status == "ok":
            e.status, e.detail = done.status, done.detail
        if e.status == "ok" and not e.calls:
            e.status, e.detail = "no_calls", "the program never called the model"
        return e

    def _env(self, url: str, **extra: str) -> dict[str, str]:
        """The program's environment: the endpoint's address, a key the OpenAI client accepts, the mode."""
        env = {**os.environ, "OPENAI_API_KEY": "tirl", "OPENAI_BASE_URL": f"{url}/v1", "TIRL_BASE_URL": url}
        return {**env, "TIRL_PROGRAM_MODE": self.program.mode, **extra}

    def _count(self, episodes: Sequence[Episode], samples: int) -> None:
        """This run's episode outcomes, the RL step's `agent/*` metrics (counts, summed over ranks)."""
        names = (
            "episodes",
            "samples",
            "divergent",
            "refused",
            "budget",
            "timeout",
            "crashed",
            "no_calls",
            "no_score",
        )
        c = self.counts = {f"agent/{s}": 0.0 for s in names}
        c["agent/episodes"], c["agent/samples"] = float(len(episodes)), float(samples)
        refuse = self.program.on_divergence == "refuse"
        for e in episodes:
            c["agent/divergent"] += e.divergences > 0
            c["agent/refused"] += e.status in ("ok", "budget") and e.divergences > 0 and refuse
            if e.status != "ok":
                c[f"agent/{e.status}"] += 1

    def episode_metrics(self) -> dict[str, float]:
        return dict(self.counts)

    def close(self) -> None:
        while not self.idle.empty():
            self.idle.get().close()
        if self.served is not None:
            self.served.stop()
            self.served = None
