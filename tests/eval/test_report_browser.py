"""`tirl analyze` end to end: report.json, a self-contained report.html and the viewer, checked in headless Chromium.

The browser part is skipped (with the reason) where no Chromium is installed; `make install` installs it.
"""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tirl.cli import main
from tirl.data.records import ProblemRow
from tirl.eval.evaluate import SampleRecord, write_eval
from tirl.eval.samples import load_run
from tirl.eval.viewer import write_viewer
from tirl.rollout.types import ToolCallRecord, Trajectory

BROWSER = next(
    (shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None
)
needs_browser = pytest.mark.skipif(
    BROWSER is None, reason="no chromium/chrome binary on PATH (make install adds it)"
)


def _traj(tokenizer, pid: str, k: int, ok: bool, answer: str) -> Trajectory:
    call = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'
    tool = "<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    final = f"6 * 7 = 42, so the answer is \\boxed{{{answer}}}.<|im_end|>"
    parts = [(call, 1), (tool, 0), (final, 1)]
    ids, mask = [], []
    for text, m in parts:
        piece = tokenizer.encode(text, add_special_tokens=False)
        ids += piece
        mask += [m] * len(piece)
    return Trajectory([1], ids, mask, [0.0] * len(ids), [call, final], [ToolCallRecord(1, "print(6 * 7)", "42\n", "ok")],
                      "answer", ProblemRow(pid, "", [{"role": "user", "content": f"Question {pid}: what is 6 * 7?"}], "42"),
                      sample=k)  # fmt: skip


def write_run(tokenizer, path: Path, label: str, rates: list[int], n: int = 4) -> Path:
    recs, trajs = [], []
    for i, c in enumerate(rates):
        for k in range(n):
            ok = k < c
            answer = "42" if ok else "41"
            recs.append(SampleRecord(label, f"q{i:02d}", "toy", k, 1.0, 1.0, ok, 1.0 if ok else -1.0, answer,
                                     1, 0, 2, 30, "answer"))  # fmt: skip
            trajs.append(_traj(tokenizer, f"q{i:02d}", k, ok, answer))
    write_eval(path, recs, trajs, {})
    return path


@pytest.fixture(scope="module")
def analysed(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("analyze")
    tokenizer.save_pretrained(root / "tok")
    a = write_run(tokenizer, root / "a", "x", [1, 2, 0, 4, 1, 0, 3, 2])
    b = write_run(tokenizer, root / "b", "y", [4, 4, 0, 4, 0, 0, 4, 4])
    out = root / "out"
    args = [
        "analyze",
        str(a),
        str(b),
        "--labels",
        "base,rl",
        "--out",
        str(out),
        "--tokenizer",
        str(root / "tok"),
    ]
    assert main([*args, "--bootstrap", "200"]) == 0
    return root, out


def test_report_files_and_numbers(analysed) -> None:
    _, out = analysed
    report = json.loads((out / "report.json").read_text())
    (c,) = report["sources"]["toy"]["comparisons"]
    assert c["solvable"]["base_only"] == ["q04"] and c["solvable"]["neither"] == ["q02", "q05"]
    assert report["audit"]["rl"]["answer_source"]["tool"] == 1.0  # 42 appears in the tool output
    assert report["tool_use"]["base"]["toy"]["correct/responses"] == 13
    assert {p.name for p in out.glob("*.png")} == {"passk-toy.png", "majk-cover-toy.png", "hist-toy.png"}
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "solved only by base" in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), (
        "report.html must not load external assets"
    )


def test_cli_errors_are_clear(tmp_path, capsys) -> None:
    assert main(["analyze", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "not a tirl eval directory" in capsys.readouterr().err
    assert main(["analyze", str(tmp_path), str(tmp_path), "--labels", "a", "--out", str(tmp_path / "o")]) == 2
    assert "--labels gives 1 names for 2 runs" in capsys.readouterr().err


def dom(page: Path, fragment: str = "", screenshot: Path | None = None) -> str:
    url = page.resolve().as_uri() + fragment
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000"]
    if screenshot is not None:
        subprocess.run(
            [*cmd, "--window-size=1200,1600", f"--screenshot={screenshot}", url],
            capture_output=True,
            timeout=120,
            check=True,
        )
    return subprocess.run(
        [*cmd, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=True
    ).stdout


def cards(html: str) -> list[dict[str, str]]:
    """The rendered cards (the list sits before the page's own script, whose template would also match)."""
    listed = html[html.index('<div id="list"') : html.index("<script>")]
    return [
        dict(re.findall(r'data-(\w+)="([^"]*)"', m)) for m in re.findall(r'<div class="card[^>]*>', listed)
    ]


@needs_browser
@pytest.mark.slow
def test_report_renders_in_chromium(analysed) -> None:
    _, out = analysed
    shot = out / "report-screenshot.png"
    html = dom(out / "report.html", screenshot=shot)
    assert "Findings" in html and ("overtakes" in html or "no crossover" in html)
    assert shot.stat().st_size > 10_000


@needs_browser
@pytest.mark.slow
def test_viewer_loads_chunks_lazily_and_filters(analysed) -> None:
    root, out = analysed
    runs = [load_run(root / "a", "base"), load_run(root / "b", "rl")]
    runs[0].tokenizer_path = str(root / "tok")  # rl has none: its spans come from turn_texts
    write_viewer(runs, root / "viewer", chunk_size=2)  # 32 chunks; the next call must drop the extra 19
    page = write_viewer(runs, root / "viewer", chunk_size=5)  # 64 samples -> 13 chunk files
    assert len(list((root / "viewer" / "trajectories-data").glob("chunk-*.js"))) == 13

    html = dom(page, "#model=rl&correct=0", screenshot=root / "viewer.png")
    got = cards(html)
    assert "1-12 of 12" in html and len(got) == 12  # rl fails all 4 samples of q02, q04 and q05
    assert all(c["model"] == "rl" and c["correct"] == "0" for c in got)
    assert "spans rebuilt from turn_texts" in html
    assert (root / "viewer.png").stat().st_size > 10_000

    html = dom(page, "#model=base&problem=q06&page=0")
    got = cards(html)
    assert len(got) == 4 and {c["problem"] for c in got} == {"q06"}
    assert "Question q06: what is 6 * 7?" in html  # the prompt is shown above the response
    assert "decoded from response_ids" in html and 'class="span m0"' in html and "tool_response" in html

    html = dom(page, "#page=2")  # rows 41-60: loaded from chunks 8..11 only when that page is shown
    assert "41-60 of 64" in html and len(cards(html)) == 20
