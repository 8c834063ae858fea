"""The multi-turn agent loop: generate, parse the tool call, run it in the sandbox, append the result, repeat.

Every step works on the whole batch: one `generate` call for all live trajectories, one sandbox batch for all their
tool calls. Token-in/token-out: sampled ids are appended as they came, tool results as ids rendered by the chat
renderer; the history is never decoded and re-tokenized.

A trajectory stops when a turn has no tool call ("answer"), after `max_turns` assistant turns ("max_turns"), when
the response budget (model and tool tokens together) is spent or the tool response would not fit ("budget"), or
when a turn runs into the per-turn token cap without a call ("turn_length"). The trajectory always ends on model
tokens. Up to `max_calls_per_turn` calls of a turn run (the recipe's max_parallel_calls=1: only the first; more,
and a turn no longer stops at `</tool_call>`); the task's tools (`tirl.tools.ToolSet`, default: the code
interpreter alone) check each call and run them, the sandboxed ones in one batch for the whole step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tirl.chat.template import ChatRenderer
from tirl.chat.tool_formats import ToolCall
from tirl.rollout.agent.config import AgentConfig
from tirl.rollout.engines.base import Engine
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Generation, Origin, ToolCallRecord, Trajectory
from tirl.sandbox.types import Sandbox
from tirl.tools.base import ToolOutput, ToolSet
from tirl.tools.code_interpreter import default_tools
from tirl.tools.registry import recorded_code


def stop_token_ids(renderer: ChatRenderer, config: AgentConfig) -> list[int]:
    """Token ids the engine should stop a turn at besides EOS (`</tool_call>` when configured, single-token, and
    a turn runs one call)."""
    end = renderer.tool_call_end_id
    one_call = config.max_calls_per_turn == 1
    return [end] if config.stop_at_tool_call_end and one_call and end is not None else []


class AgentLoop:
    """Runs batches of prompts to finished trajectories."""

    # a trajectory is its problem's prompt re-rendered plus the loop's turns (what the RL step's token check
    # re-renders); an agent program writes its own prompts (`tirl.rollout.gateway.program`)
    builds_from_problem = True

    def __init__(
        self,
        engine: Engine,
        renderer: ChatRenderer,
        sandbox: Sandbox,
        config: AgentConfig,
        *,
        tools: ToolSet | None = None,
    ) -> None:
        self.engine = engine
        self.renderer = renderer
        self.sandbox = sandbox
        self.config = config
        self.tools = (tools or ToolSet(default_tools())).configured(config)  # agent.auto_print, say

    def stop_ids(self) -> list[int]:
        return stop_token_ids(self.renderer, self.config)

    def new_trajectories(
        self, prompts: Sequence[Sequence[dict[str, Any]]], origins: Sequence[Origin] | None
    ) -> list[Trajectory]:
        """An empty trajectory per prompt (chat messages rendered to ids), of its origin."""
        if origins is not None and len(origins) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(origins)} origins: give one origin per prompt")
        return [
            Trajectory.start(self.renderer.prompt_ids(m), origins[i] if origins else None)
            for i, m in enumerate(prompts)
        ]

    def run(
        self,
        prompts: Sequence[Sequence[dict[str, Any]]],
        params: SamplingParams,
        *,
        origins: Sequence[Origin] | None = None,
        generator: torch.Generator | None = None,
    ) -> list[Trajectory]:
        """One trajectory per prompt (a list of chat messages), each of its origin (problem, sample, group)."""
        cfg = self.config
        trajs = self.new_trajectories(prompts, origins)
        live = list(range(len(trajs)))
        while live:
            ctx = [trajs[i].prompt_ids + trajs[i].response_ids for i in live]
            budget = [turn_budget(trajs[i], cfg) for i in live]
            gens = self.engine.generate(ctx, params, max_new_tokens=budget, generator=generator)
            pending: list[
                tuple[int, list[ToolCall], bool]
            ] = []  # (trajectory, its calls, turn closed by EOS)
            for i, g in zip(live, gens, strict=True):
                calls = apply_turn(trajs[i], g, self.renderer, cfg, self.tools.schemas)
                if calls:
                    pending.append((i, calls, g.finish_reason == "eos"))
            outputs = iter(self._execute([c for _, calls, _ in pending for c in calls]))
            live = []
            for i, calls, closed in pending:
                results = [next(outputs) for _ in calls]
                if apply_tool_results(trajs[i], calls, results, closed, self.renderer, cfg):
                    live.append(i)
        for t in trajs:
            t.check()
        return trajs

    def episode_metrics(self) -> dict[str, float]:
        """Counts of the last `run`'s episodes for the RL step's metrics (none for tirl's own loop: its
        trajectories say everything)."""
        return {}

    def close(self) -> None:
        """What the loop itself holds (an agent program's endpoint); the engine is closed by its owner."""

    def _execute(self, calls: list[ToolCall]) -> list[ToolOutput]:
        return execute_tool_calls(self.tools, self.sandbox, calls, self.config)


def turn_budget(t: Trajectory, cfg: AgentConfig) -> int:
    """New tokens the next turn may sample: the per-turn cap, or what is left of the response budget."""
    return min(cfg.max_tokens_per_turn, cfg.max_response_tokens - t.response_length)


def apply_turn(
    t: Trajectory,
    g: Generation,
    renderer: ChatRenderer,
    cfg: AgentConfig,
    schemas: Sequence[dict[str, Any]] = (),
) -> list[ToolCall]:
    """Append a sampled turn (ids, mask 1, log-probs); return its calls (at most `max_calls_per_turn`, read in the
    renderer's tool format and typed by the tools' `schemas`) if the trajectory goes on, else [] with
    `t.stop_reason` set (the stop rules of the module docstring)."""
    t.response_ids += g.token_ids
    t.loss_mask += [1] * len(g.token_ids)
    t.logprobs += g.logprobs
    t.token_versions += g.versions()
    t.turn_texts.append(renderer.tokenizer.decode(g.token_ids, skip_special_tokens=False))
    t.weight_versions.append(g.weight_version)
    calls = turn_calls(t.turn_texts[-1], renderer, cfg, schemas)
    spent = t.response_length >= cfg.max_response_tokens
    if not calls:
        # with malformed_calls="drop", a turn stopped at </tool_call> whose calls were all dropped ends as an answer
        closed = g.finish_reason == "eos" or (g.finish_reason == "stop" and cfg.malformed_calls == "drop")
        t.stop_reason = "answer" if closed else ("budget" if spent else "turn_length")
    elif spent:
        t.stop_reason = "budget"
    elif t.turns >= cfg.max_turns:
        t.stop_reason = "max_turns"
    else:
        return calls
    return []


def turn_calls(
    text: str, renderer: ChatRenderer, cfg: AgentConfig, schemas: Sequence[dict[str, Any]] = ()
) -> list[ToolCall]:
    """The calls of a turn that run, at most `max_calls_per_turn`; with `malformed_calls="drop"` the ones that do
    not parse are dropped first, as verl's Hermes parser does. A parser that raises (a format's bug: every
    registered format turns what it cannot read into an error call) makes a turn that opens a call one malformed
    call naming the exception, and any other turn an answer, so no text a model writes can end a rollout."""
    try:
        calls = renderer.parse_calls(text, schemas)
    except Exception as e:  # noqa: BLE001 - the last guard between a model's text and the run
        error = f"Error: the tool call could not be read ({type(e).__name__})."
        calls = [ToolCall(raw=text, error=error)] if renderer.tool_format.start in text else []
    if cfg.malformed_calls == "drop":
        calls = [c for c in calls if c.error is None]
    return calls[: cfg.max_calls_per_turn]


def apply_tool_results(
    t: Trajectory,
    calls: Sequence[ToolCall],
    outputs: Sequence[ToolOutput],
    closed: bool,
    renderer: ChatRenderer,
    cfg: AgentConfig,
) -> bool:
    """Record a turn's calls and append their results as one masked tool turn; False (stop reason "budget") when it
    would not fit, so the trajectory ends on model tokens. `closed`: the turn ended at EOS."""
    ids = renderer.tool_response_ids(
        [o.text for o in outputs], assistant_closed=closed, newline=cfg.token_stream == "tirl"
    )
    for c, o in zip(calls, outputs, strict=True):
        code = recorded_code(c.name, c.arguments)  # the named tool's `Tool.recorded_code`
        t.tool_calls.append(
            ToolCallRecord(t.turns, code, o.text, o.status, o.exec_result, c.name, c.arguments)
        )
    if t.response_length + len(ids) >= cfg.max_response_tokens:
        t.stop_reason = "budget"
        for record in t.tool_calls[-len(calls) :]:  # none of this turn's results was seen
            record.result_seen = False
        return False
    t.response_ids += ids
    t.loss_mask += [0] * len(ids)
    t.logprobs += [0.0] * len(ids)
    t.token_versions += [-1] * len(ids)
    return True


def execute_tool_calls(
    tools: ToolSet, sandbox: Sandbox, calls: list[ToolCall], cfg: AgentConfig
) -> list[ToolOutput]:
    """One batch of calls through the task's tools (sandboxed ones in one sandbox batch); malformed calls, unknown
    tools and bad arguments get their error text without running."""
    return tools.execute(
        calls, sandbox, max_chars=cfg.max_tool_response_chars, truncate_side=cfg.truncate_side
    )
