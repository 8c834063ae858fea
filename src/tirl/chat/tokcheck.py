"""The token check behind `tirl check-tokens` and `tirl data sample`: re-render stored conversations and compare
token ids and loss masks with what was stored.

Mask and re-tokenization drift is the most reported bug in peer frameworks' trackers; this makes it a CI check.
  - Rollout files (eval's trajectories.jsonl): the conversation is rebuilt from the prompt messages (stored in
    meta["prompt"], or looked up by problem id in --data), each sampled turn's text and each tool response, and
    rendered whole; ids and masks must equal the stored prompt_ids + response_ids and loss_mask. A sampled turn
    whose ids are not the tokenizer's own encoding of its text shows up as drift too: that is what a trainer
    that re-tokenizes text would train on instead.
  - Both token streams of the agent loop: tirl's (a newline before each tool turn, as the chat template renders
    it) and verl's (`<|im_end|><|im_start|>user`), from the run's agent.token_stream or --stream.
  - SFT files: rows that store `input_ids` and `loss_mask` are compared with the piecewise render; rows without
    them are checked for the drift a whole-text pipeline would see: piecewise ids vs the tokenizer's encoding of
    the full rendered text, with the mask recovered from character offsets.
The comparison functions are pure (ids in, `Divergence` out); reading files and printing is the command's part
(`tirl.commands.tokcheck`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from tirl.chat.pieces import verbatim_parts
from tirl.chat.template import ChatRenderer

CONTEXT_TOKENS = 8


@dataclass(frozen=True)
class Divergence:
    row: int  # 1-based row in the file
    what: str  # "ids" | "mask" | "length"
    index: int  # first differing position in the full sequence (prompt + response)
    stored: list[int]  # stored ids (or mask bits) around `index`
    expected: list[int]  # re-rendered ids (or mask bits) around `index`
    context: tuple[str, str] = ("", "")  # decoded text around index: (stored, re-rendered)
    token: str = ""  # for mask divergences: the token whose mask bit differs

    def describe(self) -> str:
        s, e = self.context
        head = f"row {self.row}: first {self.what} divergence at token {self.index}"
        if self.token:
            head += f" ({self.token!r})"
        return f"{head}\n  stored      : {self.stored}  {s!r}\n  re-rendered : {self.expected}  {e!r}"


def first_divergence(
    row: int,
    ids: Sequence[int],
    mask: Sequence[int],
    exp_ids: Sequence[int],
    exp_mask: Sequence[int],
    decode: Any,
) -> Divergence | None:
    """The first position where ids differ (else where masks differ), with decoded context from both sides."""
    lo = lambda i: max(0, i - CONTEXT_TOKENS)  # noqa: E731
    hi = lambda i: i + CONTEXT_TOKENS + 1  # noqa: E731
    n = min(len(ids), len(exp_ids))
    for i in range(n):
        if ids[i] != exp_ids[i]:
            s, e = list(ids[lo(i) : hi(i)]), list(exp_ids[lo(i) : hi(i)])
            return Divergence(row, "ids", i, s, e, (decode(s), decode(e)))
    if len(ids) != len(exp_ids):
        s, e = list(ids[lo(n) : hi(n)]), list(exp_ids[lo(n) : hi(n)])
        return Divergence(row, "length", n, s, e, (decode(s), decode(e)))
    if len(mask) != len(ids):  # a mask that does not cover its ids (or overruns them) is a mask error
        m = min(len(mask), len(ids))
        s, e = list(mask[lo(m) : hi(m)]), list(exp_mask[lo(m) : hi(m)])
        text = decode(list(ids[lo(m) : hi(m)]))
        return Divergence(row, "length", m, s, e, (text, text))
    for i in range(len(mask)):
        if mask[i] != exp_mask[i]:
            s, e = list(mask[lo(i) : hi(i)]), list(exp_mask[lo(i) : hi(i)])
            text = decode(list(ids[lo(i) : hi(i)]))
            return Divergence(row, "mask", i, s, e, (text, text), decode([ids[i]]))
    return None


def _segment_divergence(
    row: int,
    offset: int,
    stored: Sequence[int],
    expected: Sequence[int],
    what: str,
    decode: Any,
    ids: Sequence[int] = (),
) -> Divergence | None:
    """First difference of a segment that must match exactly (`what`: ids, or mask with the segment's `ids`)."""
    for i in range(max(len(stored), len(expected))):
        a = stored[i] if i < len(stored) else None
        b = expected[i] if i < len(expected) else None
        if a != b:
            s = list(stored[max(0, i - CONTEXT_TOKENS) : i + CONTEXT_TOKENS + 1])
            e = list(expected[max(0, i - CONTEXT_TOKENS) : i + CONTEXT_TOKENS + 1])
            kind = what if a is not None and b is not None else "length"
            if what == "ids":
                return Divergence(row, kind, offset + i, s, e, (decode(s), decode(e)))
            text = decode(list(ids[max(0, i - CONTEXT_TOKENS) : i + CONTEXT_TOKENS + 1]))
            token = decode([ids[i]]) if i < len(ids) else ""
            return Divergence(row, kind, offset + i, s, e, (text, text), token)
    return None


def _sampled_span(stored: Sequence[int], start: int, text: str, canonical: int, decode: Any) -> int | None:
    """Length of the stored span from `start` that decodes to `text` (a model may sample a non-canonical split).

    The longest such span: a turn cut inside a character ends in byte tokens that decode to one U+FFFD together,
    so a shorter span can decode to the same text; the template tokens after a turn always add text."""
    for n in range(1, min(len(stored) - start, 4 * canonical + 8) + 1):
        if decode(stored[start : start + n]) == text:
            while start + n < len(stored) and decode(stored[start : start + n + 1]) == text:
                n += 1
            return n
    return None


def check_rollout(
    renderer: ChatRenderer,
    row: int,
    prompt: Sequence[dict[str, Any]],
    traj: dict[str, Any],
    *,
    stream: str = "tirl",
) -> tuple[Divergence | None, int]:
    """(first divergence, number of sampled turns whose ids are not the canonical encoding of their text).

    Template tokens (prompt, tool-response turns, headers) must equal the re-render exactly and carry mask 0;
    each sampled turn must decode to its stored text and carry mask 1. `stream` is the token stream the rollouts
    were built with (agent.token_stream): verl's has no newline between `<|im_end|>` and a tool turn.
    """
    decode = lambda ids: renderer.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    ids = list(traj["prompt_ids"]) + list(traj["response_ids"])
    mask = [0] * len(traj["prompt_ids"]) + list(traj["loss_mask"])
    exp = renderer.prompt_ids(prompt)
    if d := _segment_divergence(row, 0, ids[: len(exp)], exp, "ids", decode):
        return d, 0
    pos, drift = len(exp), 0
    turns = traj.get("turn_texts") or []
    responses: dict[int, list[str]] = {}  # turn -> the responses of its calls, in order (several per turn)
    for c in traj.get("tool_calls") or []:
        responses.setdefault(c["turn"], []).append(c["response"])
    for k, text in enumerate(turns):
        canon = renderer.encode(text)
        if ids[pos : pos + len(canon)] == canon:
            n = len(canon)
        else:
            n = _sampled_span(ids, pos, text, len(canon), decode)
            if n is None:
                return _segment_divergence(row, pos, ids[pos : pos + len(canon)], canon, "ids", decode), drift
            drift += 1
        if d := _segment_divergence(
            row, pos, mask[pos : pos + n], [1] * n, "mask", decode, ids[pos : pos + n]
        ):
            return d, drift
        pos += n
        if k + 1 in responses and k + 1 < len(turns):  # the last turn's result was never appended
            tool = renderer.tool_response_ids(
                responses[k + 1], assistant_closed=text.endswith(renderer.eos_text), newline=stream == "tirl"
            )
            if d := _segment_divergence(row, pos, ids[pos : pos + len(tool)], tool, "ids", decode):
                return d, drift
            seg = slice(pos, pos + len(tool))
            if d := _segment_divergence(row, pos, mask[seg], [0] * len(tool), "mask", decode, ids[seg]):
                return d, drift
            pos += len(tool)
    if pos != len(ids):
        return _segment_divergence(row, pos, ids[pos:], [], "ids", decode), drift
    if len(mask) != len(ids):  # loss_mask longer than response_ids: bits for tokens that do not exist
        return _segment_divergence(row, pos, mask[pos:], [], "mask", decode), drift
    return None, drift


def sft_expected(renderer: ChatRenderer, row: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Whole-text tokenization of the rendered conversation, mask from the trainable pieces' character spans (a
    tool output holding a special token's text encoded on its own with special tokens as text, as the pieces
    encode it: `tirl.chat.pieces`)."""
    pieces = renderer.pieces(row["messages"], tools=row.get("tools"))
    spans, verbatim, pos = [], [], 0
    for p in pieces:
        if p.trainable:
            spans.append((pos, pos + len(p.text)))
        verbatim += [(pos + a, pos + b) for a, b in p.verbatim]
        pos += len(p.text)
    text = "".join(p.text for p in pieces)
    ids, offsets = [], []
    for a, b, split in verbatim_parts(renderer.tokenizer, text, verbatim):
        kw = {"split_special_tokens": True} if split else {}
        enc = renderer.tokenizer(text[a:b], add_special_tokens=False, return_offsets_mapping=True, **kw)
        ids += enc["input_ids"]
        offsets += [(a + s, a + e) for s, e in enc["offset_mapping"]]
    mask = [int(any(a <= s and e <= b for a, b in spans)) for s, e in offsets]
    return list(ids), mask


@dataclass
class CheckResult:
    rows: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    noncanonical_turns: int = 0  # sampled turns whose ids are a valid but non-canonical split of their text

    def ok(self, *, strict: bool = False) -> bool:
        return not self.divergences and not (strict and self.noncanonical_turns)


def check_rows(
    renderer: ChatRenderer,
    rows: Iterator[tuple[int, dict[str, Any]]],
    prompts: dict[str, Any] | None = None,
    *,
    stream: str = "tirl",
) -> CheckResult:
    """Check every (row number, row) pair of a rollout or SFT file (rollouts built with token stream `stream`)."""
    decode = lambda ids: renderer.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    result = CheckResult()
    for num, row in rows:
        result.rows += 1
        needed: tuple[str, ...] = ()
        if "response_ids" in row:
            needed = ("prompt_ids", "loss_mask")
        elif "input_ids" in row:
            needed = ("loss_mask",)
        for key in needed:
            if key not in row:
                raise ValueError(f"row {num}: missing {key!r} (a stored row needs ids and its loss mask)")
        if "response_ids" in row:
            prompt = (row.get("meta") or {}).get("prompt")
            if prompt is None:
                key = str((row.get("meta") or {}).get("id"))
                if prompts is None or key not in prompts:
                    raise ValueError(
                        f"row {num}: the trajectory stores no prompt messages (meta.prompt); pass --data with "
                        "the evaluated rows so they can be found by problem id"
                    )
                prompt = prompts[key]
            try:
                d, drift = check_rollout(renderer, num, prompt, row, stream=stream)
            except (AttributeError, TypeError, KeyError, IndexError) as e:  # a field of the wrong shape
                raise ValueError(
                    f"row {num}: not a trajectory as tirl writes one (prompt_ids, response_ids, loss_mask, "
                    f"turn_texts, tool_calls, meta.prompt): {type(e).__name__}: {e}"
                ) from e
            result.noncanonical_turns += drift
            if d is not None:
                result.divergences.append(d)
            continue
        if "messages" in row:
            if "input_ids" in row:
                ids, mask = list(row["input_ids"]), list(row["loss_mask"])
                exp_ids, exp_mask = renderer.render(row["messages"], tools=row.get("tools"))
            else:
                ids, mask = renderer.render(row["messages"], tools=row.get("tools"))
                exp_ids, exp_mask = sft_expected(renderer, row)
        else:
            raise ValueError(f"row {num}: neither a trajectory (response_ids) nor an SFT row (messages)")
        d = first_divergence(num, ids, mask, exp_ids, exp_mask, decode)
        if d is not None:
            result.divergences.append(d)
    return result
