"""`trajectories.html`: an offline viewer of evaluated trajectories, with data loaded lazily beside the page.

Layout on disk: `trajectories.html` (page, style and script inline), `trajectories-data/index.js` (one small row
per sample, for filtering) and `trajectories-data/chunk-NNNN.js` (full trajectories, `chunk_size` per file). The
page injects `<script src>` tags to load them, JSONP style, because browsers refuse fetch()/XHR on file:// URLs;
only the chunks of the page on screen are loaded, so a run with 100k samples stays usable.

Each response is shown as spans of trained tokens (loss_mask 1) and masked tool-output tokens (loss_mask 0). When
the run's tokenizer is known, the spans are decoded from `response_ids` and `loss_mask` themselves (exactly what
the trainer saw); otherwise they are rebuilt from `turn_texts` and the tool responses (a verl dump: from the
output text split at `<tool_response>`); the page says which, per trajectory.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tirl.core.io import atomic_write_text
from tirl.eval.samples import Run, Sample
from tirl.tools import show_call

_TOOL_RESPONSE = re.compile(r"(<tool_response>.*?(?:</tool_response>|$))", re.S)
DATA_DIR = "trajectories-data"


def load_tokenizer(path: str | None) -> Any | None:
    """The `tokenizers` tokenizer of a model directory or of a Hub id the run recorded (from the cache, never
    fetched: `tirl.models.hub.cached_file`), fast and without importing transformers; None if neither has one."""
    if not path:
        return None
    found = Path(path) / "tokenizer.json"
    if not found.is_file():
        from tirl.models.hub import cached_file

        found = cached_file(path, "tokenizer.json")
    if found is None:
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(found))


def mask_spans(ids: Sequence[int], mask: Sequence[int], decode) -> list[dict[str, Any]]:
    """Runs of equal loss_mask, decoded: [{"m": 1 or 0, "t": text}] (m=1 trained, m=0 tool output)."""
    if len(ids) != len(mask):
        raise ValueError(f"response_ids ({len(ids)}) and loss_mask ({len(mask)}) differ in length")
    spans, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            spans.append({"m": int(mask[start]), "t": decode(list(ids[start:i]))})
            start = i
    return spans


def text_spans(sample: Sample) -> list[dict[str, Any]]:
    """The fallback: spans from the stored texts (assistant turns / tool responses)."""
    if sample.trajectory is not None:
        t = sample.trajectory
        by_turn: dict[int, list[str]] = {}
        for c in t.get("tool_calls") or []:
            by_turn.setdefault(int(c.get("turn", 0)), []).append(c.get("response", ""))
        spans = []
        for j, text in enumerate(t.get("turn_texts") or [], 1):
            spans.append({"m": 1, "t": text})
            spans += [{"m": 0, "t": r} for r in by_turn.get(j, [])]
        return spans
    parts = _TOOL_RESPONSE.split(sample.raw_output or "")
    return [{"m": 0 if p.startswith("<tool_response>") else 1, "t": p} for p in parts if p]


def _shown(call: dict[str, Any]) -> str | None:
    """A recorded call as its tool shows it (the code interpreter: its code); a record without arguments (an older
    run) shows its `code`."""
    if call.get("arguments") is None:
        return call.get("code")
    return show_call(call.get("name"), call["arguments"])


def _entry(i: int, s: Sample, decode) -> dict[str, Any]:
    t = s.trajectory or {}
    if decode is not None and t.get("response_ids") is not None:
        spans, source = mask_spans(t["response_ids"], t["loss_mask"], decode), "tokenizer"
    else:
        spans, source = text_spans(s), "turn_texts" if s.trajectory is not None else "output text"
    calls = [
        {
            "turn": c.get("turn"),
            "code": _shown(c),
            "status": c.get("status"),
            "response": c.get("response"),
        }
        for c in t.get("tool_calls") or []
    ]
    return {
        "i": i,
        "gt": s.ground_truth,
        "q": s.question,
        "spans": spans,
        "mask_from": source,
        "calls": calls,
    }


def _row(i: int, s: Sample, chunk: int) -> list[Any]:
    r = s.record
    return [
        i, r.model, r.problem_id, r.data_source, r.temperature, r.sample_index, int(r.correct), r.score,
        r.pred, r.num_tool_calls, r.num_tool_errors, r.turns, r.response_tokens, r.stop_reason, chunk,
    ]  # fmt: skip


INDEX_COLUMNS = [
    "i", "model", "problem", "source", "temperature", "sample", "correct", "score", "pred",
    "calls", "errors", "turns", "tokens", "stop", "chunk",
]  # fmt: skip


def _jsonp(call: str, *args: Any) -> str:
    body = ",".join(json.dumps(a, ensure_ascii=False) for a in args).replace("</", "<\\/")
    return f"{call}({body});\n"


def write_viewer(runs: Sequence[Run], out_dir: str | Path, *, chunk_size: int = 200) -> Path:
    """Write trajectories.html and its data files; returns the page's path."""
    out = Path(out_dir)
    data = out / DATA_DIR
    rows: list[list[Any]] = []
    chunk: list[dict[str, Any]] = []
    num_chunks = 0

    def flush() -> None:
        nonlocal chunk, num_chunks
        if chunk:
            atomic_write_text(
                data / f"chunk-{num_chunks:04d}.js", _jsonp("tirlViewer.chunk", num_chunks, chunk)
            )
            num_chunks += 1
            chunk = []

    for run in runs:
        tok = load_tokenizer(run.tokenizer_path)
        decode = (lambda ids, tok=tok: tok.decode(ids, skip_special_tokens=False)) if tok else None
        for s in run.samples:
            if s.trajectory is None and s.raw_output is None:
                continue
            i = len(rows)
            rows.append(_row(i, s, num_chunks))
            chunk.append(_entry(i, s, decode))
            if len(chunk) >= chunk_size:
                flush()
    flush()
    atomic_write_text(data / "index.js", _jsonp("tirlViewer.index", INDEX_COLUMNS, rows))
    for stale in data.glob("chunk-*.js"):  # left by an earlier, larger analysis in the same directory
        if not stale.stem[6:].isdigit() or int(stale.stem[6:]) >= num_chunks:
            stale.unlink()
    page = out / "trajectories.html"
    atomic_write_text(page, _PAGE.replace("__DATA_DIR__", DATA_DIR))
    return page


_PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tirl trajectories</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1em 2em;color:#222}
#filters{position:sticky;top:0;background:#fafafa;border-bottom:1px solid #ddd;padding:.5em 0;z-index:1}
#filters label{margin-right:1em}
.card{border:1px solid #ccc;border-radius:6px;margin:1em 0;padding:.6em .8em}
.card.ok{border-left:6px solid #2a2}.card.bad{border-left:6px solid #c33}
.head{font-weight:600}.meta{color:#555;font-size:12px}
.question{white-space:pre-wrap;margin:6px 0;padding:4px 6px;border-left:3px solid #5b7bd5;background:#f3f6fd}
.span{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:12.5px;padding:2px 4px;margin:2px 0;border-radius:3px}
.m1{background:#fff;border:1px dashed #9bc}.m0{background:#e4e4e4;color:#444;border:1px solid #bbb}
.list .m0::before{content:"tool output (loss_mask 0, not trained) ";font-size:10px;color:#777;display:block}
.call{background:#fff5d6}
table.calls{border-collapse:collapse;font-size:12px;margin-top:.4em}table.calls td,table.calls th{border:1px solid #ddd;padding:2px 6px;vertical-align:top}
pre{margin:0;white-space:pre-wrap}
.legend span{padding:1px 6px;margin-right:1em}
</style></head><body>
<h1>Trajectories</h1>
<p class="legend"><span class="span m1">trained tokens (loss_mask 1)</span><span class="span m0">tool output, masked (loss_mask 0)</span><span class="span call">tool call</span></p>
<div id="filters">
<label>model <select id="f-model"><option value="">all</option></select></label>
<label>source <select id="f-source"><option value="">all</option></select></label>
<label>problem <input id="f-problem" size="14" placeholder="id contains"></label>
<label>result <select id="f-correct"><option value="">all</option><option value="1">correct</option><option value="0">incorrect</option></select></label>
<label>tool use <select id="f-tool"><option value="">all</option><option value="used">used the tool</option><option value="none">no tool call</option><option value="error">a tool error</option></select></label>
<button id="prev">&larr;</button> <span id="status">loading...</span> <button id="next">&rarr;</button>
</div>
<div id="list" class="list"></div>
<script>
"use strict";
const DATA = "__DATA_DIR__/", PAGE = 20;
const tirlViewer = window.tirlViewer = {cols: null, rows: [], chunks: {}, waiting: {}, page: 0};
const $ = id => document.getElementById(id);
const esc = s => String(s == null ? "" : s).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
function load(src) { const el = document.createElement("script"); el.src = DATA + src; document.head.appendChild(el); }
tirlViewer.index = function (cols, rows) {
  tirlViewer.cols = cols;
  tirlViewer.rows = rows.map(r => Object.fromEntries(cols.map((c, i) => [c, r[i]])));
  for (const key of ["model", "source"]) {
    const vals = [...new Set(tirlViewer.rows.map(r => r[key]))].sort();
    for (const v of vals) $("f-" + key).insertAdjacentHTML("beforeend", `<option>${esc(v)}</option>`);
  }
  readHash(); render();
};
tirlViewer.chunk = function (id, entries) {
  tirlViewer.chunks[id] = Object.fromEntries(entries.map(e => [e.i, e]));
  (tirlViewer.waiting[id] || []).forEach(f => f()); delete tirlViewer.waiting[id];
};
function ensureChunk(id, then) {
  if (tirlViewer.chunks[id]) return then();
  if (!tirlViewer.waiting[id]) { tirlViewer.waiting[id] = []; load(`chunk-${String(id).padStart(4, "0")}.js`); }
  tirlViewer.waiting[id].push(then);
}
const FILTERS = ["model", "source", "problem", "correct", "tool"];
function readHash() {
  const h = new URLSearchParams(location.hash.slice(1));
  for (const f of FILTERS) if (h.has(f)) $("f-" + f).value = h.get(f);
  tirlViewer.page = +(h.get("page") || 0);
}
function writeHash() {
  const h = new URLSearchParams();
  for (const f of FILTERS) if ($("f-" + f).value) h.set(f, $("f-" + f).value);
  if (tirlViewer.page) h.set("page", tirlViewer.page);
  history.replaceState(null, "", "#" + h.toString());
}
function selected() {
  const v = Object.fromEntries(FILTERS.map(f => [f, $("f-" + f).value]));
  return tirlViewer.rows.filter(r =>
    (!v.model || r.model === v.model) && (!v.source || r.source === v.source) &&
    (!v.problem || String(r.problem).includes(v.problem)) && (v.correct === "" || String(r.correct) === v.correct) &&
    (!v.tool || (v.tool === "used" ? r.calls > 0 : v.tool === "none" ? r.calls === 0 : r.errors > 0)));
}
function spanHtml(s) {
  let t = esc(s.t);
  if (s.m) t = t.replace(/(&lt;tool_call&gt;[\s\S]*?(&lt;\/tool_call&gt;|$))/g, '<span class="call">$1</span>');
  return `<div class="span m${s.m}">${t}</div>`;
}
function cardHtml(r, e) {
  const calls = e.calls.length ? `<table class="calls"><tr><th>turn</th><th>status</th><th>code</th><th>sandbox output</th></tr>` +
    e.calls.map(c => `<tr><td>${esc(c.turn)}</td><td>${esc(c.status)}</td><td><pre>${esc(c.code)}</pre></td><td><pre>${esc(c.response)}</pre></td></tr>`).join("") + "</table>" : "";
  const how = e.mask_from === "tokenizer" ? "spans decoded from response_ids / loss_mask with the run's tokenizer"
    : `spans rebuilt from ${e.mask_from} (no tokenizer available)`;
  return `<div class="card ${r.correct ? "ok" : "bad"}" data-model="${esc(r.model)}" data-correct="${r.correct}" data-problem="${esc(r.problem)}" data-calls="${r.calls}">
  <div class="head">${esc(r.model)} &middot; problem ${esc(r.problem)} &middot; sample ${r.sample} &middot; ${r.correct ? "correct" : "incorrect"} (reward ${esc(r.score)})</div>
  <div class="meta">${esc(r.source)} &middot; T=${esc(r.temperature)} &middot; answer ${esc(r.pred)} &middot; ground truth ${esc(e.gt)} &middot;
  ${r.calls} tool calls, ${r.errors} errors &middot; ${r.turns} turns &middot; ${esc(r.tokens)} tokens &middot; stop: ${esc(r.stop)} &middot; ${how}</div>
  ${e.q == null ? "" : `<div class="question">${esc(e.q)}</div>`}
  ${e.spans.map(spanHtml).join("")}${calls}</div>`;
}
function render() {
  writeHash();
  const rows = selected(), pages = Math.max(1, Math.ceil(rows.length / PAGE));
  tirlViewer.page = Math.min(Math.max(0, tirlViewer.page), pages - 1);
  const shown = rows.slice(tirlViewer.page * PAGE, (tirlViewer.page + 1) * PAGE);
  $("status").textContent = rows.length ? `${tirlViewer.page * PAGE + 1}-${tirlViewer.page * PAGE + shown.length} of ${rows.length} (page ${tirlViewer.page + 1}/${pages})` : "no trajectory matches";
  const token = tirlViewer.token = {};
  const list = $("list"); list.innerHTML = "";
  let left = new Set(shown.map(r => r.chunk));
  const done = () => {
    if (tirlViewer.token !== token) return;  // filters changed meanwhile
    list.innerHTML = shown.map(r => cardHtml(r, tirlViewer.chunks[r.chunk][r.i])).join("");
    list.setAttribute("data-rendered", shown.length);
  };
  if (!left.size) return done();
  for (const c of [...left]) ensureChunk(c, () => { left.delete(c); if (!left.size) done(); });
}
for (const f of FILTERS) $("f-" + f).addEventListener(f === "problem" ? "input" : "change", () => { tirlViewer.page = 0; render(); });
$("prev").onclick = () => { tirlViewer.page--; render(); };
$("next").onclick = () => { tirlViewer.page++; render(); };
load("index.js");
</script></body></html>
"""
