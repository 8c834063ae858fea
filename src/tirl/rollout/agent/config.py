"""`agent:` of a run's config: the agent loop's turn and token limits, how tool calls and results enter the token
stream, checked when loaded. The loop that reads it is `tirl.rollout.agent.loop`; `agent.program` replaces that
loop by a user's agent program behind the policy endpoint (`tirl.rollout.gateway`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tirl.core.bounds import MAX_CHARS, MAX_COUNT, MAX_PROCESSES, MAX_TOKENS, check_counts, check_range

DIVERGENCE = ("refuse", "split")


@dataclass
class ProgramConfig:
    """`agent.program:`: the agent program that replaces tirl's own loop (`tirl.rollout.gateway`)."""

    # the command started once per episode (shell words, run without a shell); empty: tirl's own agent loop
    command: str = ""
    # episode: one process per episode; worker: `concurrency` long-lived processes, one JSON line per episode
    mode: Literal["episode", "worker"] = "episode"
    timeout_s: float = 300.0  # per episode; past it the program's process group is killed
    concurrency: int = 4  # episodes whose programs run at once
    # the agent sent a history whose tokens are not the ones sampled (an edited message, a re-rendered template):
    # refuse: the episode trains nothing; split: each unbroken run of calls is its own sample (RL; eval keeps the last)
    on_divergence: Literal["refuse", "split"] = "refuse"
    host: str = "127.0.0.1"  # where the endpoint binds; the programs get http://HOST:PORT/episodes/ID/v1
    port: int = 0  # 0: a free port
    max_calls: int = 64  # completions per episode; the next one is refused
    # verifier: the task's verifier grades the program's answer; program: the score the program reports is the
    # reward (the verifier still says whether the answer is correct, for accuracy and pass@k)
    reward: Literal["verifier", "program"] = "verifier"

    def __post_init__(self) -> None:
        if self.reward not in ("verifier", "program"):
            raise ValueError(f"agent.program.reward must be verifier or program, got {self.reward!r}")
        if self.mode not in ("episode", "worker"):
            raise ValueError(f"agent.program.mode must be episode or worker, got {self.mode!r}")
        if self.on_divergence not in DIVERGENCE:
            raise ValueError(
                f"agent.program.on_divergence must be one of {DIVERGENCE}, got {self.on_divergence!r}"
            )
        check_range("agent.program.timeout_s", self.timeout_s, 0, 7 * 86400, low_open=True)
        bounds = {"concurrency": (1, MAX_PROCESSES), "port": (0, 65535), "max_calls": (1, MAX_COUNT)}
        check_counts(self, "agent.program", bounds)


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
    program: ProgramConfig = field(
        default_factory=ProgramConfig
    )  # a user's agent program instead of this loop

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
