"""Measure this machine's matmul rate and memory bandwidth and write them as a hardware profile.

``plan profile --calibrate`` uses this to describe the device the profile was taken on in the
format of ``profiles/hardware/*.json``, so the planner can run on a machine it has no datasheet for.
It sweeps square matmuls (256..4096 on the CPU; larger on a GPU) and a few transformer-shaped ones,
and times a large array copy and add (memory-bound), taking the best of a few runs of each.

``peak_tflops`` is the best matmul rate seen (an *achieved* peak, not a datasheet number), so
``matmul_efficiency`` is the median rate of the transformer-shaped GEMMs relative to it, and
``memory_efficiency`` the add kernel's bandwidth relative to the copy's.
"""

from __future__ import annotations

import platform
import socket
import statistics
from datetime import datetime, timezone
from typing import Callable

import numpy as np

from planner.core.units import GIB
from planner.profiling.device import array_backend, device_name
from planner.profiling.clock import Clock

INTER_NODE_PLACEHOLDER_GBPS = 12.5  # 100 Gb/s Ethernet/InfiniBand, one direction

Progress = Callable[[int, int, str], None]


def _best_seconds(clock: Clock, fn, runs: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(runs):
        clock.start("k")
        fn()
        clock.stop("k")
        best = min(best, clock.read()["k"])
    return max(best, 1e-9)


def _transformer_shapes(gpu: bool) -> list[tuple[int, int, int]]:
    """(m, k, n) of block GEMMs: tokens x hidden against QKV / MLP weights (Llama-like widths)."""
    tokens = 8192 if gpu else 1024
    h = 4096 if gpu else 2048
    return [(tokens, h, 3 * h), (tokens, h, 4 * h), (tokens, 4 * h, h), (tokens, h, h)]


def calibrate(device: str = "cpu", progress: Progress | None = None) -> dict:
    """A hardware-profile dict measured on this machine (about 10-20 s on a 2-core CPU)."""
    xp, dtype = array_backend(device)
    gpu = xp is not np
    report = progress or (lambda done, total, label: None)
    clock = Clock(xp)
    squares = [256, 512, 1024, 2048, 4096] + ([8192] if gpu else [])
    shapes = _transformer_shapes(gpu)
    total = len(squares) + len(shapes) + 1
    done = 0
    square_tflops = {}
    for n in squares:
        report(done, total, f"matmul {n}x{n}")
        a = xp.ones((n, n), dtype=dtype)
        runs = 3 if n <= 2048 or gpu else 1
        square_tflops[n] = 2.0 * n**3 / _best_seconds(clock, lambda: xp.matmul(a, a), runs) / 1e12
        done += 1
    shaped = []
    for m, k, n in shapes:
        report(done, total, f"matmul {m}x{k}x{n}")
        a, b = xp.ones((m, k), dtype=dtype), xp.ones((k, n), dtype=dtype)
        shaped.append(2.0 * m * k * n / _best_seconds(clock, lambda: xp.matmul(a, b), 2) / 1e12)
        done += 1
    report(done, total, "memory bandwidth")
    elems = (256 if gpu else 64) * 1024 * 1024 // 4
    x, y = xp.ones(elems, dtype=np.float32), xp.ones(elems, dtype=np.float32)
    out = xp.empty_like(x)
    copy_gbps = 2 * x.nbytes / _best_seconds(clock, lambda: xp.copyto(out, x), 5) / 1e9
    add_gbps = 3 * x.nbytes / _best_seconds(clock, lambda: xp.add(x, y, out=out), 5) / 1e9
    report(total, total, "done")
    peak = max(max(square_tflops.values()), max(shaped))
    bandwidth = max(copy_gbps, add_gbps)
    name = device_name(xp)
    when = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    where = f"{name} on host {socket.gethostname()} ({platform.platform()}), {when}, {dtype}"
    return {
        "name": f"calibrated-{device}",
        "peak_tflops": round(peak, 4),
        "memory_gib": round(_memory_gib(xp), 2),
        "memory_bandwidth_gbps": round(bandwidth, 2),
        "intra_node_gbps": round(bandwidth, 2),
        "inter_node_gbps": INTER_NODE_PLACEHOLDER_GBPS,
        "gpus_per_node": 1,
        "matmul_efficiency": round(min(1.0, statistics.median(shaped) / peak), 4),
        "memory_efficiency": round(min(1.0, add_gbps / bandwidth), 4),
        "sources": {
            "measured": f"plan3d calibrate: {where}",
            "peak_tflops": "best achieved matmul rate over square sizes "
                           f"{squares[0]}..{squares[-1]} and transformer shapes (not a datasheet peak)",
            "matmul_efficiency": "median rate of transformer-shaped GEMMs "
                                 f"{', '.join(f'{m}x{k}x{n}' for m, k, n in shapes)} / peak_tflops",
            "memory_bandwidth_gbps": f"best of copy ({copy_gbps:.1f} GB/s) and add "
                                     f"({add_gbps:.1f} GB/s) over {x.nbytes // 2**20} MiB arrays",
            "memory_efficiency": "add bandwidth / memory_bandwidth_gbps",
            "intra_node_gbps": "one device per node: set to the measured memory bandwidth "
                               "(there is no intra-node link to measure)",
            "inter_node_gbps": f"placeholder {INTER_NODE_PLACEHOLDER_GBPS} GB/s (100 Gb/s "
                               "network) - not measured; edit it to your cluster's link",
            "square_tflops": {str(n): round(v, 4) for n, v in square_tflops.items()},
        },
    }


def _memory_gib(xp) -> float:
    if xp is not np:
        return xp.cuda.runtime.memGetInfo()[1] / GIB
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return 0.0
