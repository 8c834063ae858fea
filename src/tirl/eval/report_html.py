"""`report.html`: the analysis as one self-contained offline page (plots inlined as base64 PNG, no external assets).

Reads only the report dict and the PNG files; every number on the page is also in report.json.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from tirl.eval.comparison import crossover_sentence
from tirl.eval.metrics import default_ks
from tirl.eval.selection_report import render_sections

_CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:1em 2em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:.5em 0 1em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}img{max-width:100%;border:1px solid #eee}
.ids{font-family:ui-monospace,monospace;font-size:12px;word-break:break-all}code{background:#f3f3f3;padding:0 3px}
li{margin:.2em 0}"""


def _e(x) -> str:
    return html.escape(str(x))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _ci(curve: dict, j: int) -> str:
    return f"{_pct(curve['mean'][j])} <small>[{_pct(curve['lo'][j])}, {_pct(curve['hi'][j])}]</small>"


def _table(head: list[str], rows: list[list[str]]) -> str:
    h = "".join(f"<th>{c}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def _img(path: Path, title: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{_e(title)}" src="data:image/png;base64,{data}"><figcaption>{_e(title)}</figcaption></figure>'


def _model_tables(entry: dict) -> str:
    parts = []
    for label, m in entry["models"].items():
        for tkey, b in sorted(m["temperatures"].items()):
            ks = default_ks(b["n"])
            rows = [[f"pass@{k}", _ci(b["pass@k"], k - 1)] for k in ks]
            rows += [[f"maj@{k}", _ci(b["maj@k"], j)] for j, k in enumerate(b["maj_ks"])]
            rows += [[f"Cover@{t:g}", _ci(b["cover"], j)] for j, t in enumerate(b["cover"]["taus"])]
            v = b["verl_bootstrap"]
            rows += [
                [f"bootstrap_best@{k} (verl)", _pct(x)] for k, x in zip(v["ks"], v["best@k"], strict=True)
            ]
            rows += [[f"bootstrap_maj@{k} (verl)", _pct(x)] for k, x in zip(v["ks"], v["maj@k"], strict=True)]
            parts.append(
                f"<h4>{_e(label)}, T={_e(tkey)}: {b['num_problems']} problems &times; {b['n']} samples, "
                f"avg@n {_pct(b['avg@n'])}%</h4>" + _table(["metric", "% [95% CI]"], rows)
            )
        if "envelope" in m:
            e = m["envelope"]
            ks = default_ks(e["n"])
            rows = [[f"pass@{k}", e["best_temperature"][k - 1], _ci(e["pass@k"], k - 1)] for k in ks]
            parts.append(
                f"<h4>{_e(label)}: best temperature per k on the test set (envelope: an upper bound, not a verdict)</h4>"
                + _table(["k", "best T", "pass@k %"], rows)
            )
    return "".join(parts)


def _comparison(c: dict) -> str:
    if not c.get("num_problems"):
        return f"<p>{_e(c['base'])} vs {_e(c['other'])} ({_e(c['condition'])}): no shared problems.</p>"
    ks = default_ks(c["n"])
    rows = [[f"k={k}", _ci(c["diff"], k - 1), f"{100 * c['share_other_better'][k - 1]:.0f}%"] for k in ks]
    s = c["solvable"]
    sets = "".join(
        f"<details><summary>{_e(name)}: {s[key + '_count']}</summary><div class='ids'>{_e(', '.join(s[key]))}</div></details>"
        for key, name in (
            ("base_only", f"solved only by {c['base']}"),
            ("other_only", f"solved only by {c['other']}"),
            ("both", "solved by both"),
            ("neither", "solved by neither"),
        )
    )
    return (
        f"<h4>{_e(c['other'])} &minus; {_e(c['base'])}, {_e(c['condition'])} ({c['num_problems']} shared problems, "
        f"not shared: {_e(', '.join(f'{k} {v}' for k, v in c['dropped'].items()))})</h4>"
        + f"<p>{_e(crossover_sentence(c))}</p>"
        + _table(["k", "difference of pass@k, points [95% CI]", "bootstrap share other > base"], rows)
        + f"<p>Solvable sets (solved at least once within n={c['n']}):</p>{sets}"
    )


def _tool_table(tool_use: dict) -> str:
    keys = [
        "responses",
        "tool_calls_per_response",
        "tool_error_rate",
        "no_tool_share",
        "turns",
        "response_tokens",
        "budget_share",
    ]
    rows = []
    for label, by_src in tool_use.items():
        for src, st in by_src.items():
            for part in ("", "correct/", "incorrect/"):
                cells = [f"{st[part + k]:.3g}" if part + k in st else "" for k in keys]
                rows.append([f"{_e(label)} &middot; {_e(src)} &middot; {part.rstrip('/') or 'all'}", *cells])
    return _table(["model / source / split", *keys], rows)


def _audit(audit: dict) -> str:
    if not audit:
        return "<p>No run carries response text, so the audit did not run.</p>"
    rows, examples = [], []
    for label, a in audit.items():
        src = a["answer_source"]
        rows.append(
            [
                _e(label),
                str(a["correct_answers"]),
                str(a["with_statements"]),
                str(a["statements"]),
                f"{_pct(a['false_share'])}% ({a['with_false_statement']})",
                f"{_pct(src['tool'])}%",
                f"{_pct(src['text'])}%",
                f"{_pct(src['n/a'])}%",
            ]
        )
        examples += [
            f"<li>{_e(label)}, problem {_e(x['problem_id'])} sample {x['sample_index']}: <code>{_e(x['statement'])}</code> "
            f"(sides evaluate to {_e(', '.join(x['values']))}; final answer {_e(x['answer'])})</li>"
            for x in a["examples"]
        ]
    head = [
        "model",
        "correct answers",
        "with arithmetic",
        "statements",
        "with a false statement",
        "final number from tool",
        "in text",
        "not a number",
    ]
    ex = (
        f"<p>Examples of false statements in correct answers:</p><ul>{''.join(examples)}</ul>"
        if examples
        else "<p>No false statement found in any correct answer.</p>"
    )
    return _table(head, rows) + ex


def render_report(report: dict, figures: dict[str, list[tuple[str, Path]]], *, viewer: str | None) -> str:
    meta = report["meta"]
    runs = "".join(
        f"<li><b>{_e(r['label'])}</b>: {_e(r['path'])} ({_e(r['kind'])}, {r['samples']} samples; tokenizer "
        f"{_e(r['tokenizer'] or 'unknown')}){''.join(' &mdash; ' + _e(n) for n in r['notes'])}</li>"
        for r in meta["runs"]
    )
    cfg = meta["config"]
    body = [
        f"<h1>tirl analyze: {' vs '.join(_e(m) for m in report['models'])}</h1>",
        f"<p>Created {_e(meta['created'])}. Baseline: <b>{_e(meta['baseline'])}</b>. Intervals: {cfg['level']:.0%} "
        f"percentile bootstrap over problems, {cfg['num_resamples']} replicates, seed {cfg['seed']}. pass@k is the "
        "unbiased estimator; maj@k the exact expectation over k-subsets (Monte Carlo where noted in report.json); "
        "bootstrap_best@k / bootstrap_maj@k are verl's estimators (1,000 draws with replacement, seed 42), what a verl "
        "run reports as pass@k / maj@k, shown for comparison (docs/fidelity.md).</p>",
        f"<ul>{runs}</ul>",
        f'<p><a href="{_e(viewer)}">Open the trajectory viewer</a> (trajectories.html, beside this page).</p>'
        if viewer
        else "",
        "<h2>Findings</h2><ul>" + "".join(f"<li>{_e(f)}</li>" for f in report["findings"]) + "</ul>",
        render_sections(report),  # validation-chosen temperatures, pooled seeds (when asked for)
    ]
    for src, entry in report["sources"].items():
        body.append(f"<h2>Data source {_e(src)}</h2>")
        body += [_img(p, t) for t, p in figures.get(src, [])]
        body.append("<h3>Comparisons</h3>" + "".join(_comparison(c) for c in entry["comparisons"]))
        body.append("<h3>Curves per model</h3>" + _model_tables(entry))
    body.append("<h2>Tool use</h2>" + _tool_table(report["tool_use"]))
    body.append(
        "<h2>Lucky-guess audit</h2><p>Arithmetic statements in the written reasoning of correct answers, checked "
        "exactly (see tirl/eval/audit.py for what counts as a statement), and whether the final number appears in "
        "a successful tool output.</p>" + _audit(report["audit"])
    )
    return f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>tirl analyze</title><style>{_CSS}</style></head><body>{"".join(body)}</body></html>\n'
