"""What Transformer Engine's userbuffer TP overlap leaves exposed, per collective.

With sequence parallelism a block's column-parallel GEMM (QKV, MLP up) waits on an all-gather of
its input and its row-parallel GEMM (output projection, MLP down) ends in a reduce-scatter; the
backward all-gathers the row-parallel GEMM's output gradient and reduce-scatters the column-
parallel GEMM's input gradient (cost/tensor_parallel.py). Transformer Engine's userbuffers hide
each collective behind a GEMM in one of three ways, set per GEMM (planner/stack/userbuffers.py).
The code read is transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp
(NVIDIA/TransformerEngine commit 4757bfa7ed23f3965fc7332a297b2d97372c40a9); NeMo's
docs/source/features/optimizations/communication_overlap.rst (NVIDIA/NeMo commit 88e76a78)
describes the same three. With ``c`` the collective's time (NCCL's price, cost/nccl.py) and
``g`` the GEMM's:

- **pipeline** (a reduce-scatter, ``num_splits`` = N): CommOverlapBase::split_overlap_rs cuts
  the GEMM into N chunks of m/N rows and, after each chunk, reduce-scatters its output on the
  communication stream while the next chunk computes ("// Communication chunk"; "// Last
  communication chunk with max SM"). A chain of N GEMM chunks of g/N each followed by N
  collective chunks of c/N each ends max(c/N, c - g·(N-1)/N) after the GEMM: the last chunk
  when the GEMM is the longer, the collective less all but one GEMM chunk when it is not. NeMo:
  "pipeline-overlap using chunks of reduce-scatter, which exposes one reduce-scatter chunk".
- **ring_exchange** (an all-gather or a reduce-scatter over tp ranks): CommOverlapP2PBase::
  split_overlap_ag runs tp GEMM chunks, one per input shard, and sends the shard it just used
  to the next rank while the next chunk computes ("if (i < _tp_size - 1) { // P2P
  communication"); the tp - 1 transfers of c/(tp-1) each overlap tp - 1 of the tp chunks, so
  the GEMM ends max(0, c - g·(tp-1)/tp) late. split_overlap_rs (the reduce-scatter) sends each
  GEMM chunk's output to its owner while the next chunk computes, the same chain, then sums
  the tp received chunks ("// Reduce GEMM output chunks": reduce_bf16 reads tp chunks of
  T/tp x h and writes one), a memory-bound kernel after the GEMM.
- **bulk** (a collective beside a GEMM that does not depend on it, backward only):
  CommOverlapBase::bulk_overlap launches the collective on the communication stream and the
  GEMM on the compute stream, and the main stream waits for both: max(0, c - g) exposed.

Resources: the ring exchange's transfers run on the copy engines (``use_ce`` is True by
default, planner/stack/userbuffers.py) and hold no SMs (its GEMM chunks still run on S - num_sm
SMs when set_sm_margin is set: CommOverlapCore applies the margin to every method). The pipeline and bulk collectives run
on ``num_sm`` SMs (CommOverlapCore: '_ub_comm->sms = num_comm_sm'). With ``set_sm_margin`` the
GEMM is launched on the rest for its whole length ('_math_sms = (set_sm_margin) ? sm_count -
num_comm_sm : sm_count'): it takes g·S/(S - num_sm) on a GPU of S SMs. Without it the GEMM
shares the SMs while the collective runs and loses num_sm/S of them for that time, the rule
comm.overlap_interference applies to NCCL's SMs. A chunked GEMM is priced chunk by chunk at
the rate its chunk shape allows (cost/gemm.py), so splitting a small GEMM costs its tiles.

Not priced (choices, not fitted): the last pipeline chunk's wider SM grant (UB_MAX_SM = 32)
speeding its reduce-scatter; HBM contention between the transfers and the GEMM; FP8 userbuffers
(TE all-gathers FP8 inputs in FP8; the planner prices every TP collective at 16 bits).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost import gemm, mla, precision
from planner.cost.memory import Shape
from planner.model.spec import Layer
from planner.stack.userbuffers import Overlap, lookup


@dataclass(frozen=True)
class Pair:
    """One column- then row-parallel GEMM pair of a block and the ub_cfgs names of its four
    TP collectives: forward all-gather (column), forward reduce-scatter (row), backward
    all-gather (row's input gradient), backward reduce-scatter (column's weight gradient)."""

    column: tuple[tuple[float, float, float], ...]  # (m, k, n) of the GEMMs fed by the gather
    row: tuple[float, float, float]
    names: tuple[str, str, str, str]


ATTENTION = ("qkv_fprop", "proj_fprop", "proj_dgrad", "qkv_wgrad")
MLP = ("fc1_fprop", "fc2_fprop", "fc2_dgrad", "fc1_wgrad")


def block_pairs(layer: Layer, shape: Shape) -> tuple[Pair, ...]:
    """A block's TP pairs, as moe.block_tp_pairs counts them: the attention's (QKV, or MLA's
    projections up to the output one, all fed by the gathered input) and a dense MLP's, or an
    MoE block's shared experts' (taken to use the MLP's ub_cfgs names, fc1/fc2)."""
    gemms = tuple((g.m, g.k, g.n) for g in precision.block_gemms(layer, shape))
    a = len(mla.projection_shapes(layer, shape.tokens, shape.tp)) if layer.is_mla else 2
    attention, mlp = gemms[:a], gemms[a:]
    pairs = [Pair(attention[:-1], attention[-1], ATTENTION)]
    if not layer.is_moe:
        pairs.append(Pair(mlp[:1], mlp[1], MLP))
    elif layer.shared_ffn_hidden_size:
        pairs.append(Pair(mlp[-2:-1], mlp[-1], MLP))
    return tuple(pairs)


def exposed_s(ov: Overlap, c: float, chunks: tuple[float, ...], sm_count: int | None,
              tp: int, reduce_s: float = 0.0) -> float:
    """Seconds the GEMM beside a collective of ``c`` seconds ends later than it would alone,
    where ``chunks`` are the GEMM's chunk times as the method cuts it (one for bulk): the
    collective's exposed part plus what its SMs cost the GEMM (module docstring)."""
    g = sum(chunks)
    s = min(ov.num_sm, sm_count - 1) if sm_count else 0
    if ov.method == "ring_exchange":  # copy engines: no SMs held, but a margin still applies
        margin = g * s / (sm_count - s) if sm_count and ov.set_sm_margin else 0.0
        return margin + max(0.0, c - (g + margin) * (tp - 1) / tp) + reduce_s
    if sm_count and ov.set_sm_margin:
        sm_cost = g * s / (sm_count - s)
    elif sm_count:
        sm_cost = min(c, g) * s / sm_count
    else:
        sm_cost = 0.0
    g += sm_cost
    if ov.method == "bulk":
        return sm_cost + max(0.0, c - g)
    n = ov.num_splits
    return sm_cost + max(c / n, c - g * (n - 1) / n)


def _chunks(shapes, n: int, rate: float, part: int) -> tuple[float, ...]:
    """Times of ``shapes`` cut into ``n`` chunks of m/n rows each, for the pass ``part`` of
    gemm.training_gemm_seconds (0 forward, 1 input gradient, 2 weight gradient)."""
    out = []
    for m, k, nn in shapes:
        one = gemm.training_gemm_seconds(m / n, k, nn, rate)[part]
        out.extend([one] * n)
    return tuple(out)


def block_s(pairs: tuple[Pair, ...], ub, ag_s: float, rs_s: float, tp: int, rate: float,
            sm_count: int | None, reduce_s: float) -> tuple[float, float, float]:
    """(forward all-gathers, forward reduce-scatters, backward) seconds a block's TP
    collectives add under userbuffer overlap, against the same block's GEMMs unchunked and
    without collectives. ``ag_s``/``rs_s``: one all-gather / reduce-scatter of the block's
    hidden states; ``reduce_s``: the ring-exchange reduce-scatter's summing kernel."""
    fwd_ag = fwd_rs = bwd = 0.0
    for p in pairs:
        ag_f, rs_f, ag_b, rs_b = (lookup(ub, name) for name in p.names)
        fwd_ag += _cost(ag_f, ag_s, p.column, 0, tp, rate, sm_count, 0.0)
        fwd_rs += _cost(rs_f, rs_s, (p.row,), 0, tp, rate, sm_count, reduce_s)
        # backward: the row GEMM's input gradient beside the gather of its output gradient,
        # the column GEMMs' weight gradient beside the reduce-scatter of their input gradient
        bwd += _cost(ag_b, ag_s, (p.row,), 1, tp, rate, sm_count, 0.0)
        bwd += _cost(rs_b, rs_s, p.column, 2, tp, rate, sm_count, reduce_s)
    return fwd_ag, fwd_rs, bwd


def _cost(ov: Overlap, c: float, shapes, part: int, tp: int, rate: float,
          sm_count: int | None, reduce_s: float) -> float:
    """The collective's exposed seconds plus what cutting the GEMM into chunks costs."""
    n = {"ring_exchange": tp, "pipeline": ov.num_splits}.get(ov.method, 1)
    whole = sum(gemm.training_gemm_seconds(*s, rate)[part] for s in shapes)
    chunks = _chunks(shapes, n, rate, part)
    return (sum(chunks) - whole) + exposed_s(
        ov, c, chunks, sm_count, tp, reduce_s if ov.method == "ring_exchange" else 0.0)
