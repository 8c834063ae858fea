"""The typed records a rollout produces and the engine seam: the contract between engines, the agent loop, rewards,
trainers and evaluation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from tirl.rollout.capabilities import EngineCapabilities
    from tirl.rollout.sampling import SamplingParams


@dataclass
class Generation:
    """One sampled continuation: `token_ids` and their `logprobs` (same length), why it stopped, and the version of
    the policy weights that sampled it (bumped by `Engine.sync_weights`)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "eos" | "stop" (a stop token such as </tool_call>) | "length" | "error"
    weight_version: int = 0


class Engine(Protocol):
    """The rollout engine seam: token ids in; sampled ids, their log-probs and a finish reason out.

    Log-probs are those of the sampled token under the temperature-scaled distribution (what the trainer
    recomputes). `max_new_tokens` may differ per prompt (budgets); `seeds`, one per prompt, make a request's
    sampling reproducible on engines that take a seed per request. `sync_weights(model)` is called by the RL
    trainer after every optimizer update: an engine that serves a copy of the policy must load the new weights
    (and drop its prefix cache) before it samples again; the in-process torch engine shares the module, so for it
    only the version changes. `capabilities` says what the engine can do (the rules that depend on it live in
    `tirl.rollout.capabilities`); `check(tokenizer)` fails before any rollout when the engine and the tokenizer do
    not belong together (a server serving another model, a tokenizer with ids the model has no embedding for).
    """

    capabilities: EngineCapabilities
    weight_version: int

    def check(self, tokenizer: Any) -> None: ...

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | int | None = None,
        generator: torch.Generator | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]: ...

    def sync_weights(self, model: torch.nn.Module) -> None: ...

    def close(self) -> None: ...


@dataclass
class ToolCallRecord:
    """One tool call: what ran (code_interpreter's code, or another tool's name and arguments; or the error that
    was sent back instead) and what the model saw."""

    turn: int
    code: str | None
    response: str  # the text fed back to the model, after truncation
    status: str  # "ok", sandbox statuses ("runtime_error", "timeout", ...), "tool_error", or "parse_error" (not run)
    exec_result: dict[str, Any] | None = None
    name: str | None = "code_interpreter"  # None: the call was too malformed to name a tool
    arguments: dict[str, Any] | None = None
    result_seen: bool = True  # False when the result did not fit the budget and was never appended

    @property
    def is_error(self) -> bool:
        return self.status != "ok"


@dataclass
class Trajectory:
    """One multi-turn rollout, token-in/token-out.

    All per-token lists have the same length R = len(response_ids): everything after the prompt, model tokens and
    tool-response tokens alike. `loss_mask[t]` is 1 exactly where the token was sampled by the model, 0 on tool
    tokens; `logprobs[t]` is the sampling log-prob there and 0.0 on tool tokens.
    """

    prompt_ids: list[int]  # (P,)
    response_ids: list[int]  # (R,)
    loss_mask: list[int]  # (R,)
    logprobs: list[float]  # (R,)
    turn_texts: list[str] = field(
        default_factory=list
    )  # decoded assistant turns, for grading and viewing only
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    stop_reason: str = ""  # "answer" | "max_turns" | "budget" | "turn_length"
    meta: dict[str, Any] = field(default_factory=dict)  # problem id, sample index, ground truth, ...

    @property
    def turns(self) -> int:
        return len(self.turn_texts)

    @property
    def response_length(self) -> int:
        return len(self.response_ids)

    @property
    def num_tool_calls(self) -> int:
        """Calls the model made, malformed ones included."""
        return len(self.tool_calls)

    @property
    def num_executed_calls(self) -> int:
        """Calls whose code ran and whose result the model saw: what the tool-call reward counts (a malformed
        call, or one whose result did not fit the budget, earns nothing)."""
        return sum(1 for c in self.tool_calls if c.status != "parse_error" and c.result_seen)

    @property
    def num_tool_errors(self) -> int:
        return sum(1 for c in self.tool_calls if c.is_error)

    @property
    def assistant_text(self) -> str:
        return "".join(self.turn_texts)

    def check(self) -> None:
        """Raise if the per-token lists disagree in length (a broken trajectory must never reach the trainer)."""
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"trajectory lists differ: ids {n}, mask {len(self.loss_mask)}, logprobs {len(self.logprobs)}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        d["tool_calls"] = [ToolCallRecord(**c) for c in d.get("tool_calls", [])]
        return cls(**d)
