"""Measure how long each distinct layer of a model takes on this machine: ``plan profile``.

Every distinct :class:`~planner.model.spec.Layer` (layers are frozen and hashable, so the 32 identical
blocks of Llama-3-8B are one measurement) is run with the numpy kernels (CuPy on a GPU) for its
forward, backward-input and backward-weight passes, with warm-up runs, several timed repeats, the
median and the spread (min/max) kept.

**Scaling.** A full layer can be too slow to time on a small machine (a Llama-3-8B block at
s = 8192 in fp32 is about a TFLOP per pass). From the layer's FLOPs and bytes and a quick probe of
this device's matmul rate and memory bandwidth the profiler estimates the measuring time; when it
exceeds ``budget_s`` it measures a reduced shape and scales each part by its own FLOP ratio:

* the *dense* part of a layer (norms, projections, MLP, embedding, logits) does work proportional to
  the tokens b·s, so it is measured at fewer tokens (batch first, then sequence; not below
  ``MIN_TOKENS``, where GEMMs get too skinny to be representative) and, for the output head, a
  slice of the vocabulary;
* the *attention core* does work proportional to heads · b · s², so it is measured at the **full
  sequence length** with fewer heads (one KV group, then a single head); only if even one head is
  memory-starved is the sequence shortened. Keeping s keeps the per-head score matrix, the part
  whose cost grows with s, at its real size, so the attention share of a block stays honest.

Reductions that would make the measurement unrepresentative (fewer than MIN_TOKENS tokens, a
shorter attention sequence) are taken only when memory demands it; when a representative shape is
still slower than the budget, the number of timed repeats is cut instead (to 3 at least), so a
profile can take longer than ``budget_s`` per layer rather than measure a toy shape.

Scaling assumes a part's FLOP rate does not change with the reduced dimension. Checked on a 2-core
CPU (a 1024-hidden SwiGLU block and a 32k-vocabulary head at s = 2048, full vs scaled from 256
tokens and one head): block forward and backward-input agreed within ~15%; the block's
backward-weight came out ~2x slower when scaled (its GEMMs reduce over only 256 tokens); the
head's forward came out ~40% faster (a smaller cross-entropy working set stays in cache). Prefer
a larger ``budget_s`` where the time is available.

A scaled entry carries ``scaled`` = full FLOPs / measured FLOPs (1.0 when measured at full size)
and ``measured_at`` saying what was run. The FLOPs recorded are always those of the full shape, so
``flops / seconds`` is the achieved rate the cost model uses.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from planner.core.arguments import number
from planner.core.errors import PlanInputError
from planner.core.limits import MAX_BUDGET_S
from planner.profiling.executors import (PHASES, AttentionExecutor, PhaseCosts, attention_costs,
                                build_executor, layer_costs, shard_dims, working_set_bytes)
from planner.model.spec import Layer, ModelSpec
from planner.profiling.clock import Clock
from planner.profiling.record import LayerTiming, Profile

MIN_TOKENS = 256  # dense parts are not measured below this many tokens (GEMMs too skinny)
MIN_VOCAB = 4096  # nor the output head below this vocabulary slice
MIN_ATTENTION_SEQ = 128
MIN_REPEATS = 3  # a median of fewer is a mean, and one slow run moves it
PEAK_SIZES_CPU = (512, 1024, 2048)
PEAK_SIZES_GPU = (2048, 4096, 8192)
PEAK_MAX_S = 0.1  # the longest single matmul the peak measurement runs (by the probe's estimate)
CUPY_MISSING = ("CuPy is not installed: pip install 'plan3d[gpu]' on a machine with an NVIDIA "
                "GPU, or use --device cpu")
ATTENTION_FLOPS_NOTE = ("causal attention computes the full s x s scores and masks them; its FLOPs "
                        "count the full matrix (4·s²·d per head forward)")

Progress = Callable[[int, int, str], None]


# --- device -----------------------------------------------------------------------------------

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


# --- measuring ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Runs:
    """Seconds per phase per timed repeat, and the attention section inside each."""

    phase_s: dict
    attention_s: dict


def _time_executor(ex, clock: Clock, warmup: int, repeats: int, budget_s: float) -> _Runs:
    """Warm up, then time each phase ``repeats`` times (fewer if one run already eats the budget)."""
    methods = {"fwd": ex.forward, "bwd_input": ex.backward_input, "bwd_weight": ex.backward_weight}
    phase_s = {p: [] for p in PHASES}
    attn_s = {p: [] for p in PHASES}
    run = 0
    while run < warmup + repeats:
        t0 = time.perf_counter()
        for phase in PHASES:
            clock.read()
            clock.start(phase)
            methods[phase]()
            clock.stop(phase)
            r = clock.read()
            if run >= warmup:
                phase_s[phase].append(r[phase])
                attn_s[phase].append(r.get("attention", 0.0))
        run += 1
        if run == max(warmup, 1):  # cap the repeats by what the budget allows
            one = time.perf_counter() - t0
            repeats = max(min(repeats, MIN_REPEATS),
                          min(repeats, int(budget_s / max(one, 1e-9))))
    return _Runs(phase_s, attn_s)


def _stats(values: list[float], factor: float) -> tuple[float, float, float]:
    return (statistics.median(values) * factor, min(values) * factor, max(values) * factor)


def _reductions(b: int, s: int, floor_tokens: int):
    """(b', s') candidates from full size down: halve the batch first, then the sequence."""
    out = [(b, s)]
    while b > 1 and b * s // 2 >= floor_tokens:
        b = max(1, b // 2)
        out.append((b, s))
    while s > 1 and b * s // 2 >= floor_tokens:
        s = max(1, s // 2)
        out.append((b, s))
    return out


def _ratio(full: PhaseCosts, measured: PhaseCosts, phase: str) -> float:
    f, m = full.phase(phase).flops, measured.phase(phase).flops
    return f / m if m > 0 else 1.0


def _measure(layer: Layer, b: int, s: int, tp: int, xp, dtype: str, speed: Speed, warmup: int,
             repeats: int, budget_s: float, mem_bytes: float) -> LayerTiming:
    itemsize = np.dtype(dtype).itemsize if dtype != "bfloat16" else 2
    runs = warmup + repeats
    full = layer_costs(layer, b, s, tp, itemsize)
    full_all = full["dense"] + full.get("attention", PhaseCosts())

    def fits(costs: PhaseCosts, ws: float, share: float = 1.0, n: int = runs) -> bool:
        return n * speed.seconds(costs.flops, costs.bytes) <= budget_s * share and ws <= mem_bytes

    clock = Clock(xp)
    base = dict(kind=layer.kind, shape=_shape_label(layer, tp))
    if fits(full_all, working_set_bytes(layer, b, s, tp, itemsize)):
        ex = build_executor(layer, b, s, tp, xp, dtype, clock)
        r = _time_executor(ex, clock, warmup, repeats, budget_s)
        return _timing(base, full, r, {p: 1.0 for p in PHASES}, None, None, 1.0, f"b{b} s{s}")

    # Dense part: fewer tokens down to MIN_TOKENS, then (head) a vocabulary slice; below that only
    # when memory demands it (time is then bounded by cutting repeats). The whole layer is run.
    heads_split = layer.kind == "block"
    share = 0.5 if heads_split else 1.0

    def dense_fits(candidate: Layer, sb: int, ss: int, n: int = runs) -> bool:
        c = layer_costs(candidate, sb, ss, tp, itemsize)["dense"]
        return fits(c, working_set_bytes(candidate, sb, ss, tp, itemsize), share, n)

    steps = [(layer, sb, ss) for sb, ss in _reductions(b, s, min(MIN_TOKENS, b * s))]
    small, sb, ss = steps[-1]
    while layer.kind == "head" and small.vocab_size // 2 >= MIN_VOCAB * tp:
        small = replace(small, vocab_size=small.vocab_size // 2)
        steps.append((small, sb, ss))
    last = [(small, rb, rs) for rb, rs in _reductions(sb, ss, 1)[1:]]
    chosen = next((st for st in steps if dense_fits(*st)), None)
    if chosen is None:
        chosen = next((st for st in steps[-1:] + last if dense_fits(*st, n=0)), (steps + last)[-1])
    small, sb, ss = chosen
    measured = layer_costs(small, sb, ss, tp, itemsize)
    ex = build_executor(small, sb, ss, tp, xp, dtype, clock)
    dense_runs = _time_executor(ex, clock, warmup, repeats, budget_s * share)
    del ex
    where = f"b{sb} s{ss}" + (f" vocab {small.vocab_size}" if small is not layer else "")
    dense_factor = {p: _ratio(full["dense"], measured["dense"], p) for p in PHASES}
    if not heads_split:
        return _timing(base, full, dense_runs, dense_factor, None, None,
                       full_all.flops / measured["dense"].flops, where)

    # Attention core: full sequence, fewer heads (one KV group, then one head), then shorter s.
    dims = shard_dims(layer, tp)
    group = dims.heads // dims.kv_heads
    options = [(dims.heads, dims.kv_heads, b, s)]
    options += [(group * k, k, b, s) for k in (dims.kv_heads // 2, 1) if 0 < k < dims.kv_heads]
    options += [(1, 1, b, s)]
    shorter = [(1, 1, ab, a_s) for ab, a_s in _reductions(b, s, MIN_ATTENTION_SEQ)[1:]]

    def attn_fits(heads: int, kv: int, ab: int, a_s: int, n: int = runs) -> bool:
        cost = attention_costs(ab, a_s, heads, kv, dims.head_dim, itemsize)
        return fits(cost, itemsize * ab * heads * a_s * a_s * 3, 0.5, n)

    pick = next((o for o in options if attn_fits(*o)), None)
    if pick is None:
        pick = next((o for o in options[-1:] + shorter if attn_fits(*o, n=0)),
                    (options + shorter)[-1])
    heads, kv, ab, a_s = pick
    a_cost = attention_costs(ab, a_s, heads, kv, dims.head_dim, itemsize)
    attn_ex = AttentionExecutor(ab, a_s, heads, kv, dims.head_dim, xp, dtype, clock)
    attn_runs = _time_executor(attn_ex, clock, warmup, repeats, budget_s * 0.5)
    attn_factor = {p: _ratio(full["attention"], a_cost, p) for p in PHASES}
    where += f"; attention b{ab} s{a_s} heads {heads}/{kv}"
    measured_flops = measured["dense"].flops + a_cost.flops
    return _timing(base, full, dense_runs, dense_factor, attn_runs, attn_factor,
                   full_all.flops / measured_flops, where)


def _timing(base: dict, full: dict, dense: _Runs, dense_factor: dict, attn: _Runs | None,
            attn_factor: dict | None, scaled: float, where: str) -> LayerTiming:
    """Combine runs into a LayerTiming. Without a separate attention run the attention section
    measured inside the block is reported as the attention share; with one, the block run's own
    attention section is subtracted and the separately measured (scaled) attention added."""
    values: dict = {}
    attn_cost = full.get("attention", PhaseCosts())
    for phase in PHASES:
        if attn is None:
            t = _stats(dense.phase_s[phase], dense_factor[phase])
            a = statistics.median(dense.attention_s[phase]) * dense_factor[phase]
        else:
            rest = [x - y for x, y in zip(dense.phase_s[phase], dense.attention_s[phase])]
            d = _stats(rest, dense_factor[phase])
            at = _stats(attn.phase_s[phase], attn_factor[phase])
            t = tuple(x + y for x, y in zip(d, at))
            a = at[0]
        cost = full["dense"].phase(phase) + attn_cost.phase(phase)
        values[f"{phase}_s"], values[f"{phase}_min_s"], values[f"{phase}_max_s"] = t
        values[f"{phase}_flops"] = cost.flops
        values[f"{phase}_bytes"] = cost.bytes
        if phase != "bwd_weight":
            values[f"attention_{phase}_s"] = a
            values[f"attention_{phase}_flops"] = attn_cost.phase(phase).flops
    return LayerTiming(**base, **values, scaled=scaled, measured_at=where)


def _shape_label(layer: Layer, tp: int) -> str:
    d = shard_dims(layer, tp)
    if layer.kind == "block":
        return (f"h{d.hidden} heads {d.heads}/{d.kv_heads}x{d.head_dim} ffn {d.ffn} "
                f"{layer.mlp} {layer.norm}")
    if layer.kind in ("embedding", "head"):
        return f"h{d.hidden} vocab {d.vocab}"
    return f"{d.hidden}->{d.out_features}"


def profile_model(spec: ModelSpec, *, device: str = "cpu", tp: int = 1, micro_batch: int = 1,
                  seq_len: int | None = None, repeats: int = 5, warmup: int = 1,
                  budget_s: float = 10.0, progress: Progress | None = None) -> Profile:
    """Time every distinct layer of ``spec`` on ``device`` at (micro_batch, seq_len, tp).

    ``budget_s`` bounds the time spent measuring one distinct layer (warm-up and repeats, all
    phases); bigger layers are measured reduced and scaled (see the module docstring).
    ``progress(done, total, label)`` is called before each layer and once at the end.
    """
    moe = next((layer for layer in spec.layers if layer.is_moe or layer.is_mla), None)
    if moe is not None:
        what = "mixture-of-experts" if moe.is_moe else "multi-head latent attention"
        raise PlanInputError(f"{spec.name}: plan profile measures dense blocks; its {what} "
                             "blocks are not measured (plan them analytically, without --profile)")
    xp, dtype = array_backend(device)
    s = seq_len or spec.seq_length
    for name, value in (("--micro-batch", micro_batch), ("--seq-len", s), ("--tp", tp),
                        ("repeats", repeats)):
        if value < 1:
            raise PlanInputError(f"{name} must be at least 1, got {value}")
    if warmup < 0:
        raise PlanInputError(f"warmup must be >= 0, got {warmup}")
    number("budget_s", budget_s, low=0, low_open=True, high=MAX_BUDGET_S)
    for layer in dict.fromkeys(spec.layers):
        shard_dims(layer, tp)  # fail on a bad --tp before measuring anything
    report = progress or (lambda done, total, label: None)
    distinct = list(dict.fromkeys(spec.layers))
    total = len(distinct) + 1
    report(0, total, "probing device speed")
    speed = probe_speed(xp, dtype)
    peak_before = measured_peak_flops(xp, dtype, speed)
    mem = 0.4 * free_memory_bytes(xp)
    measured: dict[Layer, LayerTiming] = {}
    for i, layer in enumerate(distinct, start=1):
        count = sum(1 for x in spec.layers if x == layer)
        report(i, total, f"{layer.kind}" + (f" x{count}" if count > 1 else ""))
        measured[layer] = _measure(layer, micro_batch, s, tp, xp, dtype, speed, warmup, repeats,
                                   budget_s, mem)
    peak_after = measured_peak_flops(xp, dtype, speed)
    report(total, total, "done")
    env = environment(xp, dtype)
    env["probe"] = {"matmul_tflops": speed.flops_per_s / 1e12,
                    "copy_gbps": speed.bytes_per_s / 1e9}
    env["peak"] = {"matmul_tflops": max(peak_before, peak_after) / 1e12,
                   "drift": peak_after / peak_before - 1 if peak_before else 0.0,
                   "source": "best square matmul (sizes "
                             f"{', '.join(map(str, PEAK_SIZES_CPU if xp is np else PEAK_SIZES_GPU))},"
                             " best of 3) at the start and at the end of the profile; drift = "
                             "end / start - 1"}
    env.update(repeats=repeats, warmup=warmup, budget_s=budget_s, statistic="median")
    return Profile(model_name=spec.name, device=device, device_name=device_name(xp), dtype=dtype,
                   tp=tp, micro_batch=micro_batch, seq_len=s,
                   layers=tuple(measured[layer] for layer in spec.layers), environment=env)
