"""The device a profile runs on (`plan profile`): its array module and name, its free memory, the
environment a reader needs to trust the numbers, and quick probes of its matmul rate and copy
bandwidth, from which the profiler estimates how long a measurement takes."""

from __future__ import annotations

import math
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.core.errors import PlanInputError
from planner.profiling.clock import Clock

PEAK_SIZES_CPU = (512, 1024, 2048)
PEAK_SIZES_GPU = (2048, 4096, 8192)
PEAK_MAX_S = 0.1  # the longest single matmul the peak measurement runs (by the probe's estimate)
CUPY_MISSING = ("CuPy is not installed: pip install 'plan3d[gpu]' on a machine with an NVIDIA "
                "GPU, or use --device cpu")
ATTENTION_FLOPS_NOTE = ("causal attention computes the full s x s scores and masks them; its FLOPs "
                        "count the full matrix (4·s²·d per head forward)")


def array_backend(device: str):
    """(xp, dtype name) for 'cpu' (numpy, float32: numpy has no fast 16-bit matmul) or 'gpu'
    (cupy, float16: CuPy has no bfloat16 dtype; fp16 and bf16 run at the same tensor-core rate)."""
    if device == "cpu":
        return np, "float32"
    if device == "gpu":
        try:
            import cupy
        except ImportError:
            raise PlanInputError(CUPY_MISSING) from None
        try:
            cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # no driver / no device
            raise PlanInputError(f"CuPy found no usable NVIDIA GPU ({e}); use --device cpu")
        return cupy, "float16"
    raise PlanInputError(f"--device must be cpu or gpu, got {device!r}")


def device_name(xp) -> str:
    if xp is not np:
        name = xp.cuda.runtime.getDeviceProperties(0)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def free_memory_bytes(xp) -> float:
    """Memory a measurement may use: free device memory, or MemAvailable on the CPU."""
    if xp is not np:
        return float(xp.cuda.runtime.memGetInfo()[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 4.0 * 1024**3


def environment(xp, dtype: str) -> dict:
    """Threads, BLAS and library versions: what a reader needs to trust or reproduce the numbers."""
    env: dict = {"python": sys.version.split()[0], "numpy": np.__version__,
                 "platform": platform.platform(), "cpu_count": os.cpu_count(), "dtype": dtype,
                 "attention_flops": ATTENTION_FLOPS_NOTE,
                 "thread_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                         "MKL_NUM_THREADS") if k in os.environ}}
    try:
        from planner.core.version import __version__
        env["plan3d"] = __version__
    except ImportError:
        pass
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        env["blas"] = {k: blas.get(k) for k in ("name", "version", "openblas configuration")
                       if blas.get(k)}
    except Exception:
        env["blas"] = {}
    try:
        import threadpoolctl
        env["threadpools"] = [{k: p.get(k) for k in ("internal_api", "num_threads", "version",
                                                     "threading_layer")}
                              for p in threadpoolctl.threadpool_info()]
    except ImportError:
        pass
    if xp is not np:
        env["cupy"] = xp.__version__
        env["cuda_runtime"] = xp.cuda.runtime.runtimeGetVersion()
    return env


@dataclass(frozen=True)
class Speed:
    """Quick probe of the device: achieved matmul FLOP/s and copy bandwidth (bytes/s)."""

    flops_per_s: float
    bytes_per_s: float

    def seconds(self, flops: float, nbytes: float) -> float:
        return flops / self.flops_per_s + nbytes / self.bytes_per_s


def probe_speed(xp=np, dtype="float32", n: int = 1024) -> Speed:
    """A ~0.2 s probe: an n x n matmul and a 32 MiB copy, best of a few."""
    clock = Clock(xp)
    a = xp.ones((n, n), dtype=dtype)
    big = xp.ones(8 * 1024 * 1024, dtype=np.float32)
    out = xp.empty_like(big)
    best_mm = best_cp = math.inf
    for _ in range(4):
        clock.start("mm")
        xp.matmul(a, a)
        clock.stop("mm")
        clock.start("cp")
        xp.copyto(out, big)
        clock.stop("cp")
        r = clock.read()
        best_mm, best_cp = min(best_mm, r["mm"]), min(best_cp, r["cp"])
    return Speed(2.0 * n**3 / max(best_mm, 1e-9), 2.0 * big.nbytes / max(best_cp, 1e-9))


def measured_peak_flops(xp=np, dtype="float32", speed: Speed | None = None,
                        runs: int = 3) -> float:
    """The best square-matmul rate over a few sizes, best of ``runs`` each (FLOP/s): this
    device's achieved peak, what its MFU is measured against (a CPU has no datasheet number the
    planner knows; ``plan profile --calibrate`` measures the same way over more shapes). Sizes
    whose matmul ``speed`` (the probe) expects to take over PEAK_MAX_S are skipped (when all
    would, the one size that takes about that long), so the measurement stays around a second."""
    clock = Clock(xp)
    best = 0.0
    sizes = PEAK_SIZES_CPU if xp is np else PEAK_SIZES_GPU
    if speed is not None:
        sizes = ([n for n in sizes if 2.0 * n**3 / speed.flops_per_s <= PEAK_MAX_S]
                 or [max(16, int((PEAK_MAX_S * speed.flops_per_s / 2.0) ** (1 / 3)))])
    for n in sizes:
        a = xp.ones((n, n), dtype=dtype)
        xp.matmul(a, a)  # warm-up
        for _ in range(runs):
            clock.start("mm")
            xp.matmul(a, a)
            clock.stop("mm")
            best = max(best, 2.0 * n**3 / max(clock.read()["mm"], 1e-9))
    return best
