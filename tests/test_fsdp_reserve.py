"""FSDP2's root unit and side streams (issue #15): the embedding, final norm and head stay gathered
through the step while blocks are gathered in turn (cost/zero.py root_unit_held), and what the
all-gather and reduce-scatter streams free stays reserved for them, counted where memory is
measured but not in what must fit (cost/side_streams.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from planner.core.parallel import Parallel
from planner.cost.memory import sharded_params
from planner.fidelity.cases import MODERN_FILE, case_setup
from planner.fidelity.published import validate_case
from planner.hardware.profiles import load_hardware, make_cluster
from planner.model.load import load_model
from planner.predict.memory import layer_gather_bytes, root_gather_bytes, state_parts
from planner.predict.stages import cost_tables, partition_problem
from planner.predict.step import predict_plan
from planner.stack import load_stack, with_overrides

TITAN = load_stack("torchtitan")
FLAT = with_overrides(TITAN, "no root, no side streams", zero3_root_unit=False,
                      zero3_side_streams=False)


def _fsdp(dp=8, pp=1, model="llama3-8b"):
    spec = load_model(model).with_seq_length(2048)
    par = Parallel(tp=1, pp=pp, dp=dp, micro_batch=1, num_microbatches=4 * pp, zero=3,
                   recompute="full")
    return spec, make_cluster(load_hardware("h100"), pp * dp, max(1, pp * dp // 8)), par


def test_the_bundled_stacks_say_which_has_a_root_unit_and_side_streams():
    assert TITAN.zero3_root_unit and TITAN.zero3_side_streams
    for name in ("megatron-core", "megatron-2021", "deepspeed"):
        other = load_stack(name)
        assert not (other.zero3_root_unit or other.zero3_side_streams)


def test_the_root_is_held_and_only_blocks_are_gathered_in_turn():
    """Llama 3 8B on 8 GPUs, FSDP: the root holds the embedding and the head in 16-bit
    (128,256 x 4,096 each, 2 bytes); the transient gathers two blocks (the running one and the
    prefetched one) instead of two of the largest layer, the embedding."""
    model, cluster, par = _fsdp()
    _, root = predict_plan(model, cluster, par, TITAN)
    _, flat = predict_plan(model, cluster, par, FLAT)
    vocab_weight = 128256 * 4096 * 2
    held = root.memory_parts["weights"][0] - flat.memory_parts["weights"][0]
    head_norm = 4096 * 2  # the final norm's weight, in the head layer
    assert held == pytest.approx(2 * vocab_weight + head_norm)
    block = sharded_params(model.layers[1], 1) * 2
    transient = root.memory_parts["transient"][0] - flat.memory_parts["transient"][0]
    assert transient == pytest.approx(2 * block - 2 * (vocab_weight + head_norm))
    # what must fit is the compute stream's; the side streams are only reserved beside it
    assert root.peak_memory_bytes == pytest.approx(float(root.rank_memory_bytes.max()))
    assert root.peak_reserved_bytes > root.peak_memory_bytes


def test_a_tied_weight_is_held_once_and_nothing_without_sharding():
    model = replace(load_model("llama3-8b"), tie_embeddings=True)
    _, _, par = _fsdp()
    per_layer = root_gather_bytes(model, par, TITAN)
    assert per_layer[0] == pytest.approx(128256 * 4096 * 2)
    assert per_layer[-1] == pytest.approx(4096 * 2)  # the head keeps only its norm
    assert not per_layer[1:-1].any()
    assert not root_gather_bytes(model, replace(par, dp=1), TITAN).any()
    # held for the step under PP, the root is among the held stage weights: nothing apart
    assert not root_gather_bytes(model, replace(par, pp=2, num_microbatches=8), TITAN).any()


def test_the_partitioner_holds_the_root_as_evaluate_does():
    model, cluster, par = _fsdp()
    tables = cost_tables(model, par, cluster.hardware, TITAN)
    with_root = partition_problem(model, cluster, par, TITAN, tables).state_bytes
    without = partition_problem(model, cluster, par, replace(TITAN, zero3_root_unit=False),
                                tables).state_bytes
    assert np.allclose(with_root - without, root_gather_bytes(model, par, TITAN))


def test_side_streams_keep_the_gathers_in_flight_and_idle_sharded_gradients():
    """Under PP the stage's gradients are held unsharded through the step, so the sharded
    ones' blocks sit free on the reduce-scatter stream; the copy-in stream keeps two of the
    largest layer's all-gather outputs (the running unit and the prefetched one)."""
    model, cluster, par = _fsdp(dp=4, pp=2)
    plan, pred = predict_plan(model, cluster, par, TITAN)
    largest = float(layer_gather_bytes(model, par, TITAN).max())
    shard_grads = [sum(state_parts(sharded_params(layer, 1), par, TITAN)[1]
                       for layer in model.layers[s.first:s.last]) for s in plan.stages]
    assert pred.side_stream_bytes == pytest.approx([2 * largest + g for g in shard_grads])
    # without PP the sharded gradients are live at the peak (counted as gradients): gathers only
    model, cluster, par = _fsdp()
    _, pred = predict_plan(model, cluster, par, TITAN)
    assert pred.side_stream_bytes == pytest.approx(
        [2 * float(layer_gather_bytes(model, par, TITAN).max())])
    # a stack that gathers into its own buffers reserves nothing apart
    _, pred = predict_plan(model, cluster, par, load_stack("megatron-core"))
    assert not pred.side_stream_bytes.any()
    assert pred.peak_reserved_bytes == pred.peak_memory_bytes


def test_the_float8_rows_read_the_reserve_and_fit_on_the_tensors():
    """torchtitan docs/performance.md Tables 4-5 report max_reserved: compared with the
    reserve (side streams included), while the OOM verdict reads what must fit."""
    cases = {c["name"]: c for c in json.loads(MODERN_FILE.read_text())}
    for name in ("torchtitan-llama3.1-70b-256gpu-fsdp32-tp8-float8",
                 "torchtitan-llama3.1-405b-512gpu-3d-1f1b-float8",
                 "torchtitan-llama3.1-405b-512gpu-3d-interleaved-float8"):
        row = validate_case(cases[name])
        assert row.memory_error >= -0.03 and not row.predicted_oom
        setup = case_setup(cases[name])
        _, pred = predict_plan(setup.model, setup.cluster, setup.parallel, setup.options,
                               bounds=list(setup.bounds) if setup.bounds else None)
        assert pred.peak_reserved_bytes > pred.peak_memory_bytes
