"""Closed forms the screen relies on, checked against the op-by-op simulator."""

from dataclasses import replace

import pytest

from planner.cost import constants
from planner.stack import default_stack
from planner.predict.pipeline_schedule import inflight_closed_form
from planner.predict.step import evaluate
from planner.hardware.profiles import load_hardware, make_cluster
from planner.model.presets import PRESETS
from planner.core.parallel import Parallel
from planner.pipeline.simulate import simulate
from planner.predict.stages import usable_bytes

CASES = [(name, p, m, v) for name in ("gpipe", "1f1b", "zb-h1", "zb-2p", "interleaved")
         for p in (1, 2, 4, 8) for m in (1, 4, 8, 16, 32)
         for v in ((2, 3, 4) if name == "interleaved" else (1,))
         if not (name == "interleaved" and (m % p or p == 1))]


@pytest.mark.parametrize("name, p, m, v", CASES)
def test_closed_form_inflight_never_below_the_simulated_peak(name, p, m, v):
    """The screen's memory uses the closed form; it must not promise less than the schedule
    holds (equal for GPipe, 1F1B and ZB-H1; interleaved may round up per chunk)."""
    counts = inflight_closed_form(name, p, m, v)
    per_rank = [sum(counts[k] for k in range(r, p * v, p)) for r in range(p)]
    peak = simulate(name, p, m, v, fwd_s=1.0, bwd_s=2.0).peak_inflight
    assert all(c >= s for c, s in zip(per_rank, peak))
    if name != "interleaved":
        assert tuple(per_rank) == peak


def test_ranks_that_recompute_reserve_more_for_fragmentation(monkeypatch):
    """The allocator's fragmentation is a share of reserved memory, higher under recompute
    (planner/cost/constants.py), and the partitioner's capacity is the exact inverse of it."""
    cluster = make_cluster(load_hardware("a100-80gb"), 8, 1)
    free = cluster.hardware.memory_bytes - constants.RESERVED_BYTES
    assert usable_bytes(cluster, True) == pytest.approx(free * 0.85)
    assert usable_bytes(cluster, False) == pytest.approx(free * 0.95)
    model = PRESETS["megatron-1.7b"]
    none = Parallel(tp=1, pp=1, dp=8, micro_batch=1, num_microbatches=4, schedule="1f1b",
                    virtual_stages=1, recompute="none", zero=1, sequence_parallel=False)
    full = replace(none, recompute="full")

    def tensors(par):  # bytes above the reserve, as if fragmentation were 5% everywhere
        return evaluate(model, cluster, par, default_stack()).rank_memory_bytes[0] \
            - constants.RESERVED_BYTES

    with_recompute_share = tensors(full), tensors(none)
    monkeypatch.setattr(constants, "RECOMPUTE_FRAGMENTATION", constants.FRAGMENTATION)
    assert with_recompute_share[0] == pytest.approx(tensors(full) * 0.95 / 0.85)
    assert with_recompute_share[1] == pytest.approx(tensors(none))
