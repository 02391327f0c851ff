"""How lean are the profiler's kernels? Kernel FLOP/s against bare numpy.matmul in the same run.

  PYTHONPATH=. python benchmarks/bench_kernels.py [--repeats 5] [--skip-profile]

1. The large matmuls of a 2048-hidden GPT block at b·s = 2048 tokens (fused QKV, output
   projection, MLP up and down), each pass (forward, input gradient, weight gradient) through
   planner.profiling.kernels against the bare ``a @ b`` of the same operands. Target: ratio >= 0.8.
2. The attention core (16 heads of 128, s = 2048, causal) forward + backward against a bare
   matmul-only attention (the same six matmuls, no mask, no softmax). Both are rated by the same
   matmul FLOPs, so the ratio is bare time / kernel time. Target: ratio >= 0.5.
3. Wall time of ``profile_model`` on the default model (llama3-8b, micro-batch 1, its seq 8192).

Runs alternate kernel and bare so that noise from other processes hits both alike; the ratio is the
median over repeats.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from planner.profiling import kernels as K


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _compare(kernel, bare, repeats: int) -> tuple[float, float, float]:
    """(median kernel s, median bare s, median of per-repeat ratios bare/kernel)."""
    kernel(), bare()
    ks, bs = [], []
    for _ in range(repeats):
        ks.append(_seconds(kernel))
        bs.append(_seconds(bare))
    ratios = [b / k for k, b in zip(ks, bs)]
    return statistics.median(ks), statistics.median(bs), statistics.median(ratios)


def bench_matmuls(repeats: int, table: Table) -> list[float]:
    rng = np.random.default_rng(0)
    tokens, h = 2048, 2048
    shapes = {"qkv": (h, 3 * h), "proj": (h, h), "mlp up": (h, 4 * h), "mlp down": (4 * h, h)}
    ratios = []
    for name, (k, n) in shapes.items():
        x = rng.standard_normal((1, tokens, k), dtype=np.float32)
        w = rng.standard_normal((k, n), dtype=np.float32)
        dy = rng.standard_normal((1, tokens, n), dtype=np.float32)
        x2, dy2 = x.reshape(tokens, k), dy.reshape(tokens, n)
        flops = 2.0 * tokens * k * n
        passes = {
            "fwd": (lambda: K.linear_fwd(x, w), lambda: x2 @ w),
            "bwd-input": (lambda: K.linear_bwd_input(dy, w), lambda: dy2 @ w.T),
            "bwd-weight": (lambda: K.linear_bwd_weight(x, dy), lambda: x2.T @ dy2),
        }
        for phase, (kern, bare) in passes.items():
            tk, tb, ratio = _compare(kern, bare, repeats)
            ratios.append(ratio)
            table.add_row(f"{name} {phase}", f"{tokens}x{k}x{n}", f"{flops / tk / 1e9:.1f}",
                          f"{flops / tb / 1e9:.1f}", f"{ratio:.2f}")
    return ratios


def bench_attention(repeats: int, table: Table) -> float:
    rng = np.random.default_rng(1)
    b, s, heads, d = 1, 2048, 16, 128
    qkv = rng.standard_normal((b, s, 3 * heads, d), dtype=np.float32)
    q, k, v = qkv[:, :, :heads], qkv[:, :, heads:2 * heads], qkv[:, :, 2 * heads:]
    dout = rng.standard_normal((b, s, heads * d), dtype=np.float32)
    mask = K.causal_mask_bias(s, np, np.float32)
    dqkv = np.empty_like(qkv)

    def kernel():
        out, cache = K.attention_fwd(q, k, v, mask)
        K.attention_bwd(dout, cache, dqkv)

    qh, kh, vh = (np.ascontiguousarray(t.transpose(0, 2, 1, 3)) for t in (q, k, v))
    doh = np.ascontiguousarray(dout.reshape(b, s, heads, d).transpose(0, 2, 1, 3))

    def bare():  # the same six matmuls, nothing else
        p = qh @ kh.swapaxes(-1, -2)
        p @ vh
        p.swapaxes(-1, -2) @ doh
        dp = doh @ vh.swapaxes(-1, -2)
        dp @ kh
        dp.swapaxes(-1, -2) @ qh

    flops = 12.0 * b * heads * s * s * d
    tk, tb, ratio = _compare(kernel, bare, repeats)
    table.add_row("attention fwd+bwd", f"b{b} s{s} {heads}x{d}", f"{flops / tk / 1e9:.1f}",
                  f"{flops / tb / 1e9:.1f}", f"{ratio:.2f}")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-profile", action="store_true")
    args = parser.parse_args()
    console = Console()
    table = Table(title="planner.profiling.kernels vs bare numpy.matmul (float32, same run)")
    for col in ("kernel", "shape", "kernel GFLOP/s", "bare GFLOP/s", "ratio"):
        table.add_column(col, justify="left" if col in ("kernel", "shape") else "right")
    mm = bench_matmuls(args.repeats, table)
    attn = bench_attention(args.repeats, table)
    console.print(table)
    console.print(f"block matmuls: worst ratio {min(mm):.2f}, median {statistics.median(mm):.2f} "
                  f"(target >= 0.80); attention ratio {attn:.2f} (target >= 0.50)")
    if not args.skip_profile:
        from planner.model.presets import DEFAULT_MODEL
        from planner.model.load import load_model
        from planner.profiling.profiler import profile_model

        spec = load_model(DEFAULT_MODEL)
        t0 = time.perf_counter()
        prof = profile_model(spec)
        wall = time.perf_counter() - t0
        block = prof.layers[1]
        console.print(f"profile_model({DEFAULT_MODEL}, micro_batch 1, seq {prof.seq_len}): "
                      f"{wall:.1f} s wall (target < 60 s); block measured at {block.measured_at}, "
                      f"scaled ×{block.scaled:.1f}; attention {100 * block.attention_fwd_s / block.fwd_s:.0f}% "
                      "of the block forward")


if __name__ == "__main__":
    main()
