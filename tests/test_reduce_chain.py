"""The reduce-scatter chain of torch <= 2.6's pipelined FSDP2 (issue #15): a held stage's
gradients reduce-scattered inside its last backward, unit after unit, before its input gradient
is sent on (cost/zero.py reduce_chain_s, the stack field zero3_reduce_chain)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.core.parallel import Parallel
from planner.cost import zero
from planner.hardware.profiles import load_hardware, make_cluster
from planner.model.load import load_model
from planner.predict.step import predict_plan
from planner.stack import load_stack, with_overrides

CHAIN = with_overrides(load_stack("torchtitan"), "torch 2.6", zero3_reduce_chain=True)


def test_every_chunk_after_the_first_waits_out_all_its_reduce_scatters_but_one():
    # chunks of 17, 16 and 16 units (embedding + blocks, blocks, blocks + head counted as 16)
    assert zero.reduce_chain_s([17, 16, 16], [0.5, 0.01, 0.02]) == pytest.approx(
        15 * 0.01 + 15 * 0.02)
    assert zero.reduce_chain_s([32], [0.01]) == 0.0  # one chunk: its reduce-scatters end the step
    assert zero.reduce_chain_s([0, 0], [0.01, 0.01]) == 0.0  # no known layering: nothing


def _step(opts, pp=2, dp=4):
    model = load_model("llama3-8b").with_seq_length(2048)
    par = Parallel(tp=1, pp=pp, dp=dp, micro_batch=1, num_microbatches=2 * pp, zero=3,
                   recompute="full")
    cluster = make_cluster(load_hardware("h100"), pp * dp, max(1, pp * dp // 8))
    return predict_plan(model, cluster, par, opts)[0].metrics.step_time_s


def test_the_chain_lengthens_only_a_held_pipeline():
    base = load_stack("torchtitan")
    assert not base.zero3_reduce_chain  # torch 2.13 reduces in an action of its own
    longer = [_step(CHAIN, pp) - _step(base, pp) for pp in (2, 4)]
    assert 0 < longer[0] < longer[1]  # more chunks after the first, more reduce-scatters waited
    # without PP nothing is held, so nothing is chained
    assert _step(CHAIN, pp=1, dp=8) == pytest.approx(_step(base, pp=1, dp=8))
    held_off = replace(CHAIN, zero3_pipeline_hold=False)
    assert _step(held_off) == pytest.approx(_step(replace(base, zero3_pipeline_hold=False)))
