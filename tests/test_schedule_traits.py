"""The schedule registry (planner/core/schedules.py) says what each schedule's op order does.

Each trait is checked against the ops planner/pipeline/schedule.py builds, so a trait that
drifts from its schedule fails here, not in a number far away."""

from __future__ import annotations

import pytest

from planner.core.errors import PlanInputError
from planner.core.schedules import (HOLDS_LIMIT, REGISTRY, SCHEDULES, Schedule, find_schedule,
                                    schedule_traits)
from planner.pipeline.schedule import build_schedule

P, M = 4, 8


def _ops(traits: Schedule):
    v = 2 if traits.takes_virtual_stages else 1
    return build_schedule(traits.name, P, M, v), v


@pytest.mark.parametrize("traits", REGISTRY, ids=SCHEDULES)
def test_weight_grad_ops_trait_matches_the_op_order(traits):
    ops, _ = _ops(traits)
    has_w = any(op.kind == "W" for rank in ops for op in rank)
    assert has_w == traits.weight_grad_ops


@pytest.mark.parametrize("traits", REGISTRY, ids=SCHEDULES)
def test_chunks_per_rank_trait_matches_the_op_order(traits):
    ops, v = _ops(traits)
    held = {len({op.chunk for op in rank}) for rank in ops}
    assert held == {traits.chunks_per_rank(v)}


@pytest.mark.parametrize("traits", REGISTRY, ids=SCHEDULES)
def test_mirrored_ranks_run_the_mirror_stage(traits):
    ops, v = _ops(traits)
    chunks = {r: {op.chunk for op in rank} for r, rank in enumerate(ops)}
    mirrored = all(chunks[r] == {r, P - 1 - r} for r in range(P))
    assert mirrored == traits.mirrored


@pytest.mark.parametrize("traits", REGISTRY, ids=SCHEDULES)
def test_split_backward_defers_w(traits):
    """A split backward runs some W after a later microbatch's B (zero bubble's deferral);
    ZB-H1 defers rank r's W by exactly r microbatches (Qi et al. 2023)."""
    if not traits.split_backward:
        return
    for r, rank in enumerate(ops := _ops(traits)[0]):
        kinds = [(op.kind, op.microbatch) for op in rank]
        first_w = next(i for i, (k, _) in enumerate(kinds) if k == "W")
        backwards_before = sum(1 for k, _ in kinds[:first_w] if k == "B")
        if traits.defers_w_by_rank:
            assert backwards_before == min(r, M - 1) + 1, (r, kinds)
    assert ops


def test_holds_limit_goes_with_a_limit():
    for traits in REGISTRY:
        assert (traits.holds == HOLDS_LIMIT) == (traits.inflight_limit > 0)


def test_launchers_of_each_schedule():
    """Megatron-LM runs 1F1B and interleaved 1F1B; DeepSpeed's TrainSchedule 1F1B only."""
    by = {t.name: set(t.launchers) for t in REGISTRY}
    assert {n for n, ls in by.items() if "megatron" in ls} == {"1f1b", "interleaved"}
    assert {n for n, ls in by.items() if "deepspeed" in ls} == {"1f1b"}
    assert "torch.distributed.pipelining" not in by["dualpipe"]


def test_an_unknown_name_is_one_clear_line():
    with pytest.raises(PlanInputError, match="unknown schedule 'bogus'; choose one of gpipe"):
        schedule_traits("bogus")
    assert find_schedule("bogus") is None and find_schedule(None) is None


def test_a_trait_contradiction_is_refused():
    with pytest.raises(ValueError, match="a split backward has W ops"):
        Schedule("x", "X", split_backward=True)
    with pytest.raises(ValueError, match="inflight_limit"):
        Schedule("x", "X", holds=HOLDS_LIMIT)
