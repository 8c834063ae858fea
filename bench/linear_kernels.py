"""One Linear's product through each kernel the torch engine can use, on the shapes of its decode and pre-fill.

Kernels: PyTorch's own `F.linear` in fp32 (MKL's sgemm on a CPU build with MKL: what the trainer and the unpacked
engine run), oneDNN's fp32 linear over a weight packed once (`torch.ops.mkldnn._reorder_linear_weight` and
`_linear_pointwise`: the engine's fp32 path under `rollout.torch.pack`), the same in bf16, and bf16 `F.linear` under
autocast (oneDNN reordering the weight at every call). Shapes: SmolLM2-135M's projections and LM head and the demo
model's, at the rows of a decode step (16, 64) and of a pre-fill. Each timed call reads a different copy of the
weight (enough copies to pass 256 MB), so the weights come from memory as in a decode step, not from cache.
Also a 2048^2 fp32 matmul through both fp32 paths (GFLOP/s against the CPU's vector width) and the memory read
bandwidth (a sum over 512 MB), against which a decode step's weight reads are measured.

Reports microseconds per call (the best of 3 rounds), the speed-up of each kernel over fp32 `F.linear`, and the
largest difference of each fp32 kernel from a float64 reference. Environment: BENCH_THREADS (default all cores).
Writes bench/results/linear_kernels.json, or `--out`.
"""

from __future__ import annotations

import os
import time

import torch

from bench.common import cli as common_cli

# (name, in_features, out_features, rows)
SHAPES = [
    ("smollm2 gate/up", 576, 1536, 16),
    ("smollm2 gate/up", 576, 1536, 64),
    ("smollm2 down", 1536, 576, 16),
    ("smollm2 down", 1536, 576, 64),
    ("smollm2 q/o", 576, 576, 16),
    ("smollm2 k/v", 576, 192, 16),
    ("smollm2 lm head", 576, 49152, 16),
    ("smollm2 gate/up pre-fill", 576, 1536, 1308),
    ("demo mlp", 192, 576, 16),
    ("demo mlp", 192, 576, 64),
    ("demo lm head", 192, 1024, 64),
]
COPY_BYTES = 256 * 2**20
ROUNDS = 3


def best_us(fns: list, calls: int) -> float:
    """Best of ROUNDS rounds of `calls` calls, cycling through `fns` (one per weight copy), in microseconds."""
    fns[0]()
    best = float("inf")
    for _ in range(ROUNDS):
        t = time.perf_counter()
        for i in range(calls):
            fns[i % len(fns)]()
        best = min(best, (time.perf_counter() - t) / calls)
    return best * 1e6


def kernels(k: int, n: int, m: int) -> dict:
    copies = max(1, min(64, COPY_BYTES // (k * n * 4)))
    torch.manual_seed(0)
    ws = [torch.randn(n, k) / k**0.5 for _ in range(copies)]
    x = torch.randn(m, k)
    fp32 = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in ws]
    bf16 = [torch.ops.mkldnn._reorder_linear_weight(w.bfloat16(), None) for w in ws]
    xb = x.bfloat16()
    lin = torch.nn.functional.linear
    pw = torch.ops.mkldnn._linear_pointwise

    def autocast_linear(w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return lin(x, w)

    calls = max(4, min(200, int(2e9 / (2 * m * k * n))))
    us = {
        "torch_fp32": best_us([lambda w=w: lin(x, w) for w in ws], calls),
        "onednn_fp32_packed": best_us([lambda w=w: pw(x, w, None, "none", [], "") for w in fp32], calls),
        "onednn_bf16_packed": best_us([lambda w=w: pw(xb, w, None, "none", [], "") for w in bf16], calls),
        "torch_bf16_autocast": best_us([lambda w=w: autocast_linear(w) for w in ws], calls),
    }
    ref = lin(x.double(), ws[0].double())
    err = {
        "torch_fp32": float((lin(x, ws[0]) - ref).abs().max()),
        "onednn_fp32_packed": float((pw(x, fp32[0], None, "none", [], "") - ref).abs().max()),
    }
    return {
        "us": us,
        "speedup_over_torch_fp32": {
            key: us["torch_fp32"] / v for key, v in us.items() if key != "torch_fp32"
        },
        "weight_gb_per_s": {key: n * k * (2 if "bf16" in key else 4) / v / 1e3 for key, v in us.items()},
        "max_abs_error_vs_float64": err,
        "weight_copies": copies,
    }


def square_gflops(size: int = 2048) -> dict:
    a, b = torch.randn(size, size), torch.randn(size, size)
    packed = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), None)
    flop = 2 * size**3
    out = {}
    for name, fn in (
        ("torch_fp32", lambda: a @ b),
        ("onednn_fp32_packed", lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], "")),
    ):
        out[name] = flop / best_us([fn], 5) / 1e3
    return out


def read_gb_per_s(size_bytes: int = 512 * 2**20) -> float:
    """How fast the cores read memory: a sum over a buffer far larger than the caches."""
    a = torch.ones(size_bytes // 4)
    return size_bytes / best_us([a.sum], 5) / 1e3


def main() -> dict:
    threads = int(os.environ.get("BENCH_THREADS", "0")) or os.cpu_count() or 1
    torch.set_num_threads(threads)
    config = torch.__config__.show()
    res: dict = {
        "load_average_at_start": os.getloadavg()[0],
        "torch_threads": threads,
        "torch": torch.__version__,
        "blas": next(
            (ln.strip(" -") for ln in config.splitlines() if "Math Kernel Library" in ln), "not MKL"
        ),
        "onednn": next(
            (ln.strip(" -") for ln in config.splitlines() if "MKL-DNN" in ln or "oneDNN" in ln), ""
        ),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "square_2048_gflop_per_s": square_gflops(),
        "memory_read_gb_per_s": read_gb_per_s(),
        "shapes": [],
    }
    print(f"2048^2 GFLOP/s: {res['square_2048_gflop_per_s']}", flush=True)
    for name, k, n, m in SHAPES:
        row = {"name": name, "in": k, "out": n, "rows": m} | kernels(k, n, m)
        res["shapes"].append(row)
        speed = ", ".join(f"{key} {v:.2f}x" for key, v in row["speedup_over_torch_fp32"].items())
        print(f"{name} {k}->{n} x{m}: torch fp32 {row['us']['torch_fp32']:.0f} us; {speed}", flush=True)
    return res


def cli(argv: list[str] | None = None) -> None:
    common_cli(
        "linear_kernels", __doc__, lambda args: main(), argv, shown=lambda r: r["square_2048_gflop_per_s"]
    )


if __name__ == "__main__":
    cli()
