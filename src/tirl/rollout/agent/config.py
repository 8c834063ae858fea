"""`agent:` of a run's config: the agent loop's turn and token limits, how tool calls and results enter the token
stream, checked when loaded. The loop that reads it is `tirl.rollout.agent.loop`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tirl.core.config import MAX_CHARS, MAX_COUNT, MAX_TOKENS, check_counts


@dataclass
class AgentConfig:
    max_turns: int = 16
    max_response_tokens: int = 512  # all turns together, tool tokens included (the recipe's response length)
    max_tokens_per_turn: int = 256
    max_tool_response_chars: int = 256
    truncate_side: Literal["middle", "right"] = "middle"
    auto_print: bool = True  # print a bare final expression, as the recipe's tool does (the tool reads it)
    stop_at_tool_call_end: bool = (
        True  # end a turn at </tool_call> instead of waiting for EOS (one call per turn)
    )
    max_calls_per_turn: int = 1  # calls of one turn that run (the recipe: 1); later ones are ignored
    # RL drops prompts longer than this at start-up (verl's filter_overlong_prompts); 0 = no limit. `tirl plan`
    # sizes sequences as this plus max_response_tokens.
    max_prompt_tokens: int = 0
    # tirl: a newline between an assistant turn's <|im_end|> and the tool turn (the chat template's own stream);
    # verl: none, as verl's agent loop appends the tool turn right after the sampled EOS
    token_stream: Literal["tirl", "verl"] = "tirl"
    # feedback: a malformed call gets its error text as the tool response (tirl); drop: it is dropped as verl does,
    # and a turn with no valid call left ends the trajectory (stop reason "answer")
    malformed_calls: Literal["feedback", "drop"] = "feedback"

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_response_tokens", "max_tokens_per_turn", "max_calls_per_turn"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.token_stream not in ("tirl", "verl") or self.malformed_calls not in ("feedback", "drop"):
            raise ValueError(
                f"agent.token_stream must be tirl or verl and agent.malformed_calls feedback or drop, got "
                f"{self.token_stream!r}, {self.malformed_calls!r}"
            )
        if self.max_prompt_tokens < 0:
            raise ValueError(f"max_prompt_tokens must be >= 0 (0 = no limit), got {self.max_prompt_tokens}")
        check_counts(self, "agent", {
            "max_turns": (1, MAX_COUNT), "max_response_tokens": (1, MAX_TOKENS),
            "max_tokens_per_turn": (1, MAX_TOKENS), "max_tool_response_chars": (0, MAX_CHARS),
            "max_calls_per_turn": (1, MAX_COUNT), "max_prompt_tokens": (0, MAX_TOKENS),
        })  # fmt: skip
