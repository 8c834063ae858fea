"""The multi-turn agent loop: generate, parse the tool call, run it in the sandbox, append the result, repeat.

Every step works on the whole batch: one `generate` call for all live trajectories, one sandbox batch for all their
tool calls. Token-in/token-out: sampled ids are appended as they came, tool results as ids rendered by the chat
renderer; the history is never decoded and re-tokenized.

A trajectory stops when a turn has no tool call ("answer"), after `max_turns` assistant turns ("max_turns"), when
the response budget (model and tool tokens together) is spent or the tool response would not fit ("budget"), or
when a turn runs into the per-turn token cap without a call ("turn_length"). The trajectory always ends on model
tokens. Only the first call of a turn runs (the recipe's max_parallel_calls=1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from tirl.chat.hermes import format_tool_output, parse_tool_call, prepare_code, truncate_middle
from tirl.chat.template import ChatRenderer
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Engine, Generation, ToolCallRecord, Trajectory
from tirl.sandbox.types import ExecResult, Sandbox


@dataclass
class AgentConfig:
    max_turns: int = 16
    max_response_tokens: int = 512  # all turns together, tool tokens included (the recipe's response length)
    max_tokens_per_turn: int = 256
    max_tool_response_chars: int = 256
    truncate_side: Literal["middle", "right"] = "middle"
    auto_print: bool = True  # print a bare final expression, as the recipe's tool does
    stop_at_tool_call_end: bool = True  # end a turn at </tool_call> instead of waiting for EOS

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_response_tokens", "max_tokens_per_turn"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def stop_token_ids(renderer: ChatRenderer, config: AgentConfig) -> list[int]:
    """Token ids the engine should stop a turn at besides EOS (`</tool_call>` when configured and single-token)."""
    end = renderer.tool_call_end_id
    return [end] if config.stop_at_tool_call_end and end is not None else []


class AgentLoop:
    """Runs batches of prompts to finished trajectories."""

    def __init__(self, engine: Engine, renderer: ChatRenderer, sandbox: Sandbox, config: AgentConfig) -> None:
        self.engine = engine
        self.renderer = renderer
        self.sandbox = sandbox
        self.config = config

    def stop_ids(self) -> list[int]:
        return stop_token_ids(self.renderer, self.config)

    def run(
        self,
        prompts: Sequence[Sequence[dict[str, Any]]],
        params: SamplingParams,
        *,
        metas: Sequence[dict[str, Any]] | None = None,
        generator: torch.Generator | None = None,
    ) -> list[Trajectory]:
        """One trajectory per prompt (a list of chat messages); `metas` are copied into each trajectory."""
        cfg = self.config
        trajs = [
            Trajectory(self.renderer.prompt_ids(m), [], [], [], meta=dict(metas[i]) if metas else {})
            for i, m in enumerate(prompts)
        ]
        live = list(range(len(trajs)))
        while live:
            ctx = [trajs[i].prompt_ids + trajs[i].response_ids for i in live]
            budget = [turn_budget(trajs[i], cfg) for i in live]
            gens = self.engine.generate(ctx, params, max_new_tokens=budget, generator=generator)
            pending: list[tuple[int, Any, bool]] = []  # (trajectory index, ToolCall, turn closed by EOS)
            for i, g in zip(live, gens, strict=True):
                call = apply_turn(trajs[i], g, self.renderer, cfg)
                if call is not None:
                    pending.append((i, call, g.finish_reason == "eos"))
            outputs = self._execute([c for _, c, _ in pending])
            live = [
                i
                for (i, call, closed), out in zip(pending, outputs, strict=True)
                if apply_tool_result(trajs[i], call, out, closed, self.renderer, cfg)
            ]
        for t in trajs:
            t.check()
        return trajs

    def _execute(self, calls: list[Any]) -> list[ToolOutput]:
        return execute_tool_calls(self.sandbox, calls, self.config)


def turn_budget(t: Trajectory, cfg: AgentConfig) -> int:
    """New tokens the next turn may sample: the per-turn cap, or what is left of the response budget."""
    return min(cfg.max_tokens_per_turn, cfg.max_response_tokens - t.response_length)


def apply_turn(t: Trajectory, g: Generation, renderer: ChatRenderer, cfg: AgentConfig) -> Any | None:
    """Append a sampled turn (ids, mask 1, log-probs); return its tool call if the trajectory goes on, else None
    with `t.stop_reason` set (the stop rules of the module docstring)."""
    t.response_ids += g.token_ids
    t.loss_mask += [1] * len(g.token_ids)
    t.logprobs += g.logprobs
    t.turn_texts.append(renderer.tokenizer.decode(g.token_ids, skip_special_tokens=False))
    call = parse_tool_call(t.turn_texts[-1])
    spent = t.response_length >= cfg.max_response_tokens
    if call is None:
        t.stop_reason = "answer" if g.finish_reason == "eos" else ("budget" if spent else "turn_length")
    elif spent:
        t.stop_reason = "budget"
    elif t.turns >= cfg.max_turns:
        t.stop_reason = "max_turns"
    else:
        return call
    return None


def apply_tool_result(
    t: Trajectory, call: Any, out: ToolOutput, closed: bool, renderer: ChatRenderer, cfg: AgentConfig
) -> bool:
    """Record a tool call and append its result as masked ids; False (stop reason "budget") when it would not fit,
    so the trajectory ends on model tokens. `closed`: the turn ended at EOS (the renderer closes the turn)."""
    response, status, result = out
    ids = renderer.tool_response_ids([response], assistant_closed=closed)
    t.tool_calls.append(
        ToolCallRecord(t.turns, call.code, response, status, result.to_dict() if result else None)
    )
    if t.response_length + len(ids) >= cfg.max_response_tokens:
        t.stop_reason = "budget"
        t.tool_calls[-1].result_seen = False
        return False
    t.response_ids += ids
    t.loss_mask += [0] * len(ids)
    t.logprobs += [0.0] * len(ids)
    return True


ToolOutput = tuple[str, str, "ExecResult | None"]  # (text the model sees, status, the sandbox result)


def execute_tool_calls(sandbox: Sandbox, calls: list[Any], cfg: AgentConfig) -> list[ToolOutput]:
    """Run the valid calls as one sandbox batch; malformed ones get their error text without running."""
    runnable = [k for k, c in enumerate(calls) if c.error is None]
    results = sandbox.run_batch([prepare_code(calls[k].code, auto_print=cfg.auto_print) for k in runnable])
    by_call = dict(zip(runnable, results, strict=True))
    out: list[tuple[str, str, ExecResult | None]] = []
    for k, c in enumerate(calls):
        if c.error is not None:
            out.append((c.error, "parse_error", None))
            continue
        r = by_call[k]
        text = format_tool_output(r.stdout, r.stderr, timed_out=r.timed_out)
        if r.sandbox_error:
            text = f"Error: the sandbox failed: {r.sandbox_error}"
        if cfg.truncate_side == "middle":
            text = truncate_middle(text, cfg.max_tool_response_chars)
        elif len(text) > cfg.max_tool_response_chars:
            text = text[: cfg.max_tool_response_chars] + "...(truncated)"
        out.append((text, r.status, r))
    return out
