"""The typed records a rollout produces: the contract between engines, the agent loop, rewards, trainers and
evaluation (the engine seam itself is `tirl.rollout.engines.base.Engine`).

A trajectory carries its problem (`ProblemRow`) and which sample of it it is as typed fields; on disk
(`trajectories.jsonl`) they are written as one flat `meta` object, the format `tirl check-tokens`, `tirl analyze`
and the viewer read (docs/eval-records.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tirl.data.records import ProblemRow


@dataclass
class Generation:
    """One sampled continuation: `token_ids` and their `logprobs` (same length), why it stopped, and the version of
    the policy weights that sampled it (bumped by `Engine.sync_weights`). A generation interrupted by a sync and
    continued with the new weights (partial rollouts) has `token_versions`, one per token; `weight_version` is then
    its first token's."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "eos" | "stop" (a stop token such as </tool_call>) | "length" | "error"
    weight_version: int = 0
    token_versions: list[int] | None = None  # (len(token_ids),); None: every token is `weight_version`'s

    def versions(self) -> list[int]:
        """The version that sampled each token."""
        if self.token_versions is None:
            return [self.weight_version] * len(self.token_ids)
        return list(self.token_versions)


@dataclass
class ToolCallRecord:
    """One tool call: what ran (its tool's name and arguments, and the code its tool records, `Tool.recorded_code`:
    the code interpreter's code; or the error that was sent back instead) and what the model saw."""

    turn: int
    code: str | None
    response: str  # the text fed back to the model, after truncation
    status: str  # "ok", sandbox statuses ("runtime_error", "timeout", ...), "tool_error", or "parse_error" (not run)
    exec_result: dict[str, Any] | None = None
    # None: the call was too malformed to name a tool; a record without a name (the first trajectory files) is a
    # call of the code interpreter, the one tool those runs had
    name: str | None = "code_interpreter"
    arguments: dict[str, Any] | None = None
    result_seen: bool = True  # False when the result did not fit the budget and was never appended

    @property
    def is_error(self) -> bool:
        return self.status != "ok"


@dataclass(frozen=True)
class Origin:
    """Which sample of which problem a rollout is: the agent loop copies it into the trajectory it starts.
    `group` numbers the RL advantage groups of a step (None in eval); `temperature` is the one it is sampled at."""

    problem: ProblemRow
    sample: int = 0
    group: int | None = None
    temperature: float | None = None


@dataclass(frozen=True)
class Outcome:
    """How a sample was graded: the verifier's verdict and the shaped reward (saved with an eval's trajectories,
    so a stored rollout says how it scored)."""

    correct: bool
    score: float  # the shaped reward
    pred: str | None  # the extracted answer
    verdict: str  # correct | wrong | no_answer | timeout | error


@dataclass
class Trajectory:
    """One multi-turn rollout, token-in/token-out.

    All per-token lists have the same length R = len(response_ids): everything after the prompt, model tokens and
    tool-response tokens alike. `loss_mask[t]` is 1 exactly where the token was sampled by the model, 0 on tool
    tokens; `logprobs[t]` is the sampling log-prob there and 0.0 on tool tokens. `problem` is None (and `sample`
    too) for a bare prompt that no verifier grades.
    """

    prompt_ids: list[int]  # (P,)
    response_ids: list[int]  # (R,)
    loss_mask: list[int]  # (R,)
    logprobs: list[float]  # (R,)
    turn_texts: list[str] = field(
        default_factory=list
    )  # decoded assistant turns, for grading and viewing only
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    stop_reason: str = ""  # "answer" | "max_turns" | "budget" | "turn_length" | "error"
    problem: ProblemRow | None = None  # what was asked and what grades it
    sample: int | None = None  # index among the problem's samples
    group: int | None = None  # RL: the advantage group
    temperature: float | None = None  # the sampling temperature
    # (turns,) the policy version of each sampled turn
    weight_versions: list[int] = field(default_factory=list)
    # (R,) the policy version of each token: -1 on tool tokens; empty in records from before it existed
    token_versions: list[int] = field(default_factory=list)
    error: str | None = None  # why the rollout was abandoned (stop_reason "error")
    outcome: Outcome | None = None  # set once graded
    # the text the verifier grades when it is not the assistant's own turns: an agent program's reported answer
    graded_text: str | None = None
    reported_score: float | None = (
        None  # an agent program's own reward for this sample, used instead of shaping
    )

    def __post_init__(self) -> None:
        if self.problem is not None and not isinstance(self.problem, ProblemRow):
            raise TypeError(
                f"Trajectory.problem must be a ProblemRow or None, got {type(self.problem).__name__}: build one with "
                "ProblemRow(...) or ProblemRow.from_row(row, index); the file form's `meta` dict goes through "
                "Trajectory.from_dict"
            )

    @classmethod
    def start(cls, prompt_ids: list[int], origin: Origin | None) -> Trajectory:
        """An empty trajectory of `origin` (a bare one without)."""
        if origin is None:
            return cls(prompt_ids, [], [], [])
        o = origin
        where = {"problem": o.problem, "sample": o.sample, "group": o.group, "temperature": o.temperature}
        return cls(prompt_ids, [], [], [], **where)

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

    def turn_token_versions(self) -> list[int] | None:
        """Per-token versions as the per-turn list gives them (each turn's model tokens, a run of loss-mask 1, get
        its version; -1 elsewhere); None without a version for every turn that sampled tokens."""
        out, turn, prev = [], -1, 0
        for m in self.loss_mask:
            turn += 1 if m and not prev else 0
            if m and turn >= len(self.weight_versions):
                return None
            out.append(self.weight_versions[turn] if m else -1)
            prev = m
        return out

    @property
    def spans_versions(self) -> bool:
        """Some turn was sampled by more than one policy version (interrupted by a sync, partial rollouts)."""
        return bool(self.token_versions) and self.token_versions != self.turn_token_versions()

    @property
    def assistant_text(self) -> str:
        return "".join(self.turn_texts)

    @property
    def answer_text(self) -> str:
        """What the verifier grades: `graded_text` where set, else the assistant's turns."""
        return self.assistant_text if self.graded_text is None else self.graded_text

    def check(self) -> None:
        """Raise if the per-token lists disagree in length (a broken trajectory must never reach the trainer)."""
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n or len(self.token_versions) not in (0, n):
            raise ValueError(
                f"trajectory lists differ: ids {n}, mask {len(self.loss_mask)}, logprobs {len(self.logprobs)}, "
                f"token versions {len(self.token_versions)}"
            )
        if self.token_versions and any(
            (v < 0) == bool(m) for v, m in zip(self.token_versions, self.loss_mask, strict=True)
        ):
            raise ValueError(
                "trajectory token versions disagree with the loss mask: -1 exactly on tool tokens"
            )

    def meta(self) -> dict[str, Any]:
        """The typed fields as the flat `meta` object of the file format (docs/eval-records.md)."""
        out: dict[str, Any] = {}
        if self.problem is not None:
            p = self.problem
            out.update(
                id=p.problem_id, data_source=p.data_source, ability=p.ability, ground_truth=p.ground_truth
            )
            out["prompt"] = p.prompt
        for name in ("group", "sample", "temperature"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.weight_versions:
            out["weight_versions"] = list(self.weight_versions)
        if self.token_versions:
            out["token_versions"] = list(self.token_versions)
        if self.error is not None:
            out["error"] = self.error
        if self.graded_text is not None:
            out["graded_text"] = self.graded_text
        if self.reported_score is not None:
            out["reported_score"] = self.reported_score
        if self.outcome is not None:
            out.update(asdict(self.outcome))
        return out

    def to_dict(self) -> dict[str, Any]:
        d = {f: getattr(self, f) for f in _RECORD_FIELDS}
        d["tool_calls"] = [asdict(c) for c in self.tool_calls]
        d["meta"] = self.meta()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        """From `to_dict`'s form; a `meta` key the format does not name is ignored."""
        m = d.get("meta") or {}
        problem = None
        if "id" in m:
            gt, prompt = m.get("ground_truth"), m.get("prompt") or []
            problem = ProblemRow(
                str(m["id"]), str(m.get("data_source", "")), prompt, gt, str(m.get("ability", ""))
            )
        outcome = None
        if "verdict" in m:
            outcome = Outcome(bool(m["correct"]), float(m["score"]), m.get("pred"), str(m["verdict"]))
        t = cls(
            **{f: d[f] for f in _RECORD_FIELDS if f in d and f != "tool_calls"},
            tool_calls=[ToolCallRecord(**c) for c in d.get("tool_calls", [])],
            problem=problem,
            sample=m.get("sample"),
            group=m.get("group"),
            temperature=m.get("temperature"),
            weight_versions=list(m.get("weight_versions", [])),
            token_versions=list(m.get("token_versions", [])),
            error=m.get("error"),
            outcome=outcome,
            graded_text=m.get("graded_text"),
            reported_score=m.get("reported_score"),
        )
        return t


# the fields written as they are; the typed fields after them go into `meta`
_RECORD_FIELDS = (
    "prompt_ids",
    "response_ids",
    "loss_mask",
    "logprobs",
    "turn_texts",
    "tool_calls",
    "stop_reason",
)
