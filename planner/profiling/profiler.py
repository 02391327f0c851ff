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

**Memory.** One measurement holds at most :func:`memory_ceiling` bytes: 40% of the free memory,
and on the CPU at most MAX_PROFILE_BYTES (1.5 GiB, planner/core/limits.py), so a profile of any
model peaks under about 2 GiB of resident memory (llama3-405b's block alone holds 24 GiB of
weights and gradients). A layer whose executor would hold more keeps its weights as column
tiles, the fewest (a power of two) that fit, and each pass runs the layer's full work tile by
tile (planner/profiling/tiled.py: the method and its bias, 7-10% slower GEMMs on a 2-core CPU);
an embedding keeps that fraction of its table's rows, the same gather per token. A tiled
measurement is not scaled (it does the full work) and its ``measured_at`` says "in N tiles".
Tiling is chosen for memory only, after the reductions above, which are chosen for time. A
layer over the ceiling even at one token is refused before anything is measured, and so are
more than MAX_PROFILE_TOKENS tokens (micro-batch x sequence).

A scaled entry carries ``scaled`` = full FLOPs / measured FLOPs (1.0 when measured at full size)
and ``measured_at`` saying what was run. The FLOPs recorded are always those of the full shape, so
``flops / seconds`` is the achieved rate the cost model uses.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from planner.core.arguments import number
from planner.core.errors import PlanInputError
from planner.core.limits import MAX_BUDGET_S, MAX_PROFILE_BYTES, MAX_PROFILE_TOKENS
from planner.profiling.executors import (PHASES, AttentionExecutor, PhaseCosts, attention_costs,
                                build_executor, layer_costs, shard_dims, working_set_bytes)
from planner.model.spec import Layer, ModelSpec
from planner.profiling.clock import Clock
from planner.profiling.device import (CUPY_MISSING, PEAK_SIZES_CPU, PEAK_SIZES_GPU, Speed,
                                      array_backend, device_name, environment, free_memory_bytes,
                                      measured_peak_flops, probe_speed)
from planner.profiling.record import LayerTiming, Profile

MIN_TOKENS = 256  # dense parts are not measured below this many tokens (GEMMs too skinny)
MIN_VOCAB = 4096  # nor the output head below this vocabulary slice
MIN_ATTENTION_SEQ = 128
MIN_REPEATS = 3  # a median of fewer is a mean, and one slow run moves it

Progress = Callable[[int, int, str], None]


def memory_ceiling(xp) -> float:
    """Bytes one measurement may hold: 40% of the free memory, and on the CPU (where the profile
    shares the machine's RAM with everything else) at most MAX_PROFILE_BYTES."""
    free = 0.4 * free_memory_bytes(xp)
    return min(free, MAX_PROFILE_BYTES) if xp is np else free


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


def tiles_needed(layer: Layer, b: int, s: int, tp: int, itemsize: int,
                 mem_bytes: float) -> int | None:
    """The fewest column tiles (a power of two) that hold the layer's executor at (b, s) within
    ``mem_bytes``, or None when even one-column tiles do not (its activations alone are over)."""
    most = _widest(layer, tp)
    tiles = 1
    while working_set_bytes(layer, b, s, tp, itemsize, tiles=tiles) > mem_bytes:
        if tiles >= most:
            return None
        tiles = min(2 * tiles, most)
    return tiles


def _widest(layer: Layer, tp: int) -> int:
    """The column count of the layer's widest weight (tiles beyond it hold no less)."""
    d = shard_dims(layer, tp)
    if layer.kind == "block":
        f_in = 2 * d.ffn if layer.mlp == "swiglu" else d.ffn
        return max(d.hidden, (d.heads + 2 * d.kv_heads) * d.head_dim, f_in)
    return max(1, d.out_features if layer.kind == "linear" else d.vocab)


def _tiled(where: str, layer: Layer, tiles: int) -> str:
    if tiles == 1:
        return where
    held = "embedding table" if layer.kind == "embedding" else "weights"
    return f"{where}; {held} in {tiles} tiles (memory ceiling)"


def _measure(layer: Layer, b: int, s: int, tp: int, xp, dtype: str, speed: Speed, warmup: int,
             repeats: int, budget_s: float, mem_bytes: float) -> LayerTiming:
    itemsize = np.dtype(dtype).itemsize if dtype != "bfloat16" else 2
    runs = warmup + repeats
    full = layer_costs(layer, b, s, tp, itemsize)
    full_all = full["dense"] + full.get("attention", PhaseCosts())

    def fits(costs: PhaseCosts, tiles: int | None, share: float = 1.0, n: int = runs) -> bool:
        return (tiles is not None
                and n * speed.seconds(costs.flops, costs.bytes) <= budget_s * share)

    clock = Clock(xp)
    base = dict(kind=layer.kind, shape=_shape_label(layer, tp))
    tiles = tiles_needed(layer, b, s, tp, itemsize, mem_bytes)
    if fits(full_all, tiles):
        ex = build_executor(layer, b, s, tp, xp, dtype, clock, tiles)
        r = _time_executor(ex, clock, warmup, repeats, budget_s)
        return _timing(base, full, r, {p: 1.0 for p in PHASES}, None, None, 1.0,
                       _tiled(f"b{b} s{s}", layer, tiles))

    # Dense part: fewer tokens down to MIN_TOKENS, then (head) a vocabulary slice; below that only
    # when memory demands it (time is then bounded by cutting repeats). The whole layer is run.
    heads_split = layer.kind == "block"
    share = 0.5 if heads_split else 1.0

    def dense_fits(candidate: Layer, sb: int, ss: int, n: int = runs) -> bool:
        c = layer_costs(candidate, sb, ss, tp, itemsize)["dense"]
        return fits(c, tiles_needed(candidate, sb, ss, tp, itemsize, mem_bytes), share, n)

    steps = [(layer, sb, ss) for sb, ss in _reductions(b, s, min(MIN_TOKENS, b * s))]
    small, sb, ss = steps[-1]
    while layer.kind == "head" and small.vocab_size // 2 >= MIN_VOCAB * tp:
        small = replace(small, vocab_size=small.vocab_size // 2)
        steps.append((small, sb, ss))
    last = [(small, rb, rs) for rb, rs in _reductions(sb, ss, 1)[1:]]
    chosen = next((st for st in steps if dense_fits(*st)), None)
    if chosen is None:
        chosen = next((st for st in steps[-1:] + last if dense_fits(*st, n=0)), None)
    if chosen is None:  # profile_model checks every layer at one token first
        raise PlanInputError(f"{layer.kind} {base['shape']}: no shape of it fits the profiler's "
                             f"memory ceiling of {mem_bytes / 2**30:.2f} GiB")
    small, sb, ss = chosen
    tiles = tiles_needed(small, sb, ss, tp, itemsize, mem_bytes)
    measured = layer_costs(small, sb, ss, tp, itemsize)
    ex = build_executor(small, sb, ss, tp, xp, dtype, clock, tiles)
    dense_runs = _time_executor(ex, clock, warmup, repeats, budget_s * share)
    del ex
    where = _tiled(f"b{sb} s{ss}" + (f" vocab {small.vocab_size}" if small is not layer else ""),
                   small, tiles)
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
        held = _attention_bytes(ab, a_s, heads, kv, dims.head_dim, itemsize) <= mem_bytes
        return fits(cost, 1 if held else None, 0.5, n)

    pick = next((o for o in options if attn_fits(*o)), None)
    if pick is None:
        pick = next((o for o in options[-1:] + shorter if attn_fits(*o, n=0)), None)
    if pick is None:
        raise PlanInputError(f"block {base['shape']}: even one attention head at "
                             f"{shorter[-1][3] if shorter else s} tokens is over the profiler's "
                             f"memory ceiling of {mem_bytes / 2**30:.2f} GiB")
    heads, kv, ab, a_s = pick
    a_cost = attention_costs(ab, a_s, heads, kv, dims.head_dim, itemsize)
    attn_ex = AttentionExecutor(ab, a_s, heads, kv, dims.head_dim, xp, dtype, clock)
    attn_runs = _time_executor(attn_ex, clock, warmup, repeats, budget_s * 0.5)
    attn_factor = {p: _ratio(full["attention"], a_cost, p) for p in PHASES}
    where += f"; attention b{ab} s{a_s} heads {heads}/{kv}"
    measured_flops = measured["dense"].flops + a_cost.flops
    return _timing(base, full, dense_runs, dense_factor, attn_runs, attn_factor,
                   full_all.flops / measured_flops, where)


def _attention_bytes(b: int, s: int, heads: int, kv: int, d: int, itemsize: int) -> float:
    """Peak memory of an AttentionExecutor: the scores and their gradient (and a temporary), the
    mask, and q, k, v with their gradients, the output and its gradient."""
    return (itemsize * (3 * b * heads * s * s + s * s + b * s * d * (2 * (heads + 2 * kv)
                                                                     + 2 * heads))
            + s * s)  # the mask's boolean triangle


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
    if micro_batch * s > MAX_PROFILE_TOKENS:
        raise PlanInputError(f"--micro-batch {micro_batch} x --seq-len {s} = "
                             f"{micro_batch * s:,} tokens; plan profile measures at most "
                             f"{MAX_PROFILE_TOKENS:,} tokens a micro-batch")
    number("budget_s", budget_s, low=0, low_open=True, high=MAX_BUDGET_S)
    mem = memory_ceiling(xp)
    itemsize = np.dtype(dtype).itemsize
    for layer in dict.fromkeys(spec.layers):
        shard_dims(layer, tp)  # fail on a bad --tp before measuring anything
        if tiles_needed(layer, 1, 1, tp, itemsize, mem) is None:  # nor measure a part of it
            raise PlanInputError(f"{spec.name}: a {layer.kind} of {_shape_label(layer, tp)} "
                                 f"needs more than the profiler's memory ceiling of "
                                 f"{mem / 2**30:.2f} GiB even at one token")
    report = progress or (lambda done, total, label: None)
    distinct = list(dict.fromkeys(spec.layers))
    total = len(distinct) + 1
    report(0, total, "probing device speed")
    speed = probe_speed(xp, dtype)
    peak_before = measured_peak_flops(xp, dtype, speed)
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
    env.update(repeats=repeats, warmup=warmup, budget_s=budget_s, statistic="median",
               memory_ceiling_gib=mem / 2**30)
    return Profile(model_name=spec.name, device=device, device_name=device_name(xp), dtype=dtype,
                   tp=tp, micro_batch=micro_batch, seq_len=s,
                   layers=tuple(measured[layer] for layer in spec.layers), environment=env)
