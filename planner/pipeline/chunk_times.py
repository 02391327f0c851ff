"""A configuration's per-chunk times as the simulator takes them: a float for every chunk or
one per chunk (`per_chunk`), one transfer per chunk boundary (`boundary_comm`), and the F, B and
W durations of a split or fused backward (`op_times`; `OpTimes`, a compiled run's table).

What an engine adds to the compute (`charge_actions`): every action (F, B, W) costs the stack's
``action_s`` more (dispatch, p2p setup: measured on torch.distributed.pipelining by
benchmarks/bench_engine.py), and a backward split into B and W costs ``split_backward`` (a
fraction) more than the fused one, spread over B and W in proportion.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from planner.core.schedules import schedule_traits
from planner.pipeline import dualpipe, graph
from planner.pipeline.schedule import ScheduleError


PerChunk = float | Sequence[float]


def per_chunk(value: PerChunk | None, n: int, what: str) -> list[float] | None:
    """`value` as one float per chunk (or boundary): a float repeated n times, or a sequence
    of exactly n; None stays None."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return [float(value)] * n
    values = [float(x) for x in value]
    if len(values) != n:
        raise ScheduleError(f"{what} has {len(values)} entries; expected {n} (one per chunk/boundary)")
    return values


def boundary_comm(comm_s: PerChunk, p: int, v: int) -> list[float]:
    """One transfer time per chunk boundary; a boundary inside one rank (p == 1) costs nothing."""
    chunks = p * v
    comm = per_chunk(comm_s, chunks - 1, "comm_s") if chunks > 1 else []
    return [0.0 if k % p == (k + 1) % p else c for k, c in enumerate(comm)]


def charge_actions(split: bool, chunks: int, fwd_s: PerChunk, bwd_s: PerChunk,
                   wgrad_s: PerChunk | None, action_s: float = 0.0,
                   split_backward: float = 0.0) -> tuple[PerChunk, PerChunk, PerChunk | None]:
    """Per-chunk (fwd_s, bwd_s, wgrad_s) with the engine's per-action costs charged.

    Every action costs ``action_s`` more: F and a fused B once each; a split backward runs two
    actions (B and W), so bwd_s gains 2 x action_s and wgrad_s one. A split backward also costs
    ``split_backward`` x its compute more than the fused one (torch.distributed.pipelining's
    stage_backward_input + stage_backward_weight against stage_backward, measured by
    benchmarks/bench_engine.py --split), charged in proportion to B and W. Without either cost
    the times come back as given."""
    if not action_s and not (split and split_backward):
        return fwd_s, bwd_s, wgrad_s
    fwd = [f + action_s for f in per_chunk(fwd_s, chunks, "fwd_s")]
    bwd = per_chunk(bwd_s, chunks, "bwd_s")
    if not split:
        return fwd, [b + action_s for b in bwd], wgrad_s
    wgrad = per_chunk(wgrad_s, chunks, "wgrad_s") or [b / 2 for b in bwd]
    scale = 1.0 + split_backward
    return (fwd, [b * scale + 2 * action_s for b in bwd],
            [w * scale + action_s for w in wgrad])


def op_times(split: bool, chunks: int, fwd_s, bwd_s, wgrad_s) -> tuple[list[float], ...]:
    """Per chunk: F, B and W times.  With a split backward (W ops present) B takes bwd_s -
    wgrad_s and W takes wgrad_s (default half of bwd_s); otherwise B is the whole backward."""
    fwd = per_chunk(fwd_s, chunks, "fwd_s")
    bwd = per_chunk(bwd_s, chunks, "bwd_s")
    if split:
        wgrad = per_chunk(wgrad_s, chunks, "wgrad_s") or [b / 2 for b in bwd]
        return fwd, [b - w for b, w in zip(bwd, wgrad)], wgrad
    return fwd, bwd, [0.0] * chunks


class OpTimes:
    """A configuration's op times as the duration table of a compiled run (graph.durations)."""

    def __init__(self, name, chunks, args, overlap):
        split = schedule_traits(name).weight_grad_ops
        self.fwd, self.bgrad, self.wgrad = op_times(split, chunks, args["fwd_s"],
                                                    args["bwd_s"], args["wgrad_s"])
        self.full = per_chunk(args["bwd_s"], chunks, "bwd_s")
        self.o_fwd = per_chunk(overlap[0], chunks, "overlap_fwd_s")
        self.o_bwd = per_chunk(overlap[1], chunks, "overlap_bwd_s")
        self.interference = overlap[2]

    def pair(self, kf: int, kb: int) -> float:
        return dualpipe.pair_s(self.fwd[kf], self.o_fwd[kf], self.full[kb], self.o_bwd[kb],
                               self.interference)

    def table(self, g: graph.Graph) -> np.ndarray:
        return graph.durations(g, self.fwd, self.bgrad, self.wgrad, self.full, self.pair)
