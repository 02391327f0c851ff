"""A lower bound on DualPipe's pipeline for any stage split (planner/search/solver.py
_dualpipe_bound): the partitioner splits DualPipe's stages (predict/stages.py placed), so the
bound may not assume Megatron's even split."""

from __future__ import annotations

import numpy as np

from planner.predict.chunks import CostTable


def least_pair_compute_s(tables: dict[str, CostTable], pp: int) -> float:
    """The busiest DualPipe rank's compute per microbatch pair (its two stages, rank r holding
    stages r and pp - 1 - r: pipeline/dualpipe.py) is at least this, for any split and any
    stage modes: each layer at its least compute over the modes, the MoE all-to-all taken out
    (a pair hides it: dualpipe.pair_s); the pp ranks' pairs hold the model twice, rank 0 holds
    the first and the last layer, and some rank holds each layer."""
    compute = np.minimum.reduce([
        np.diff(t.prefix["fwd_s"] + t.prefix["bwd_input_s"] + t.prefix["bwd_weight_s"]
                - t.prefix["a2a_s"]) for t in tables.values()])
    return float(max(2 * compute.sum() / pp, compute[0] + compute[-1], compute.max()))
