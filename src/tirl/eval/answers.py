"""The one adapter between the analysis and the verifiers: answer extraction and answer equivalence for maj@k.

Both come from the verifier a data source routes to (`tirl.rewards.registry`): math answers are the last
\\boxed{} and two are the same vote when one grades correct against the other (math-verify, numbers fast-pathed);
multiple choice votes on the letter; a verifier registered from outside tirl brings its own `extract` and
`equivalent`. With no data source, the math verifier's rules apply (the records of older runs name no source).
"""

from __future__ import annotations

from collections.abc import Sequence

from tirl.rewards.registry import Verifier, get_verifier, verifier_for


def _verifier(data_source: str | None) -> Verifier:
    return verifier_for(data_source) if data_source else get_verifier("math")


def extract_answer(text: str, data_source: str | None = None) -> str | None:
    """The final answer a response commits to, as its verifier sees it (math: the last \\boxed{})."""
    return _verifier(data_source).extract(text)


def equivalent(a: str, b: str, data_source: str | None = None) -> bool:
    """True if answers `a` and `b` are one vote for maj@k under the data source's verifier."""
    return a == b or _verifier(data_source).equivalent(a, b)


def canonical_answers(answers: Sequence[str | None], data_source: str | None = None) -> list[str | None]:
    """Each answer replaced by the first-seen member of its equivalence class (None stays None).

    Classes are built greedily in order of first appearance: an answer joins the first representative it is
    equivalent to. For a transitive verifier this is exactly the partition into equivalence classes.
    """
    same = _verifier(data_source).equivalent
    reps: list[str] = []
    mapping: dict[str, str] = {}
    out: list[str | None] = []
    for a in answers:
        if a is None:
            out.append(None)
            continue
        key = a.strip()
        if key not in mapping:
            mapping[key] = next((r for r in reps if r == key or same(r, key)), key)
            if mapping[key] == key:
                reps.append(key)
        out.append(mapping[key])
    return out
