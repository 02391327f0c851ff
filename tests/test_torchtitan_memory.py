"""torchtitan's measured memory (issues #15, #18): what torch.distributed.pipelining holds beyond
the layers' activations (a receive buffer per microbatch and direction), and how the published
readings count memory (the caching allocator's reserve, not the device's)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from planner.core.errors import PlanInputError
from planner.core.parallel import Parallel
from planner.core.units import GIB
from planner.cost import constants
from planner.fidelity.cases import MODERN_FILE, case_setup
from planner.fidelity.published import validate_case
from planner.fidelity.runs_schema import check_runs_document
from planner.model.load import load_model
from planner.predict.memory import kept_outputs, stage_output_bytes
from planner.predict.pipeline_schedule import inflight_closed_form
from planner.stack import load_stack, with_overrides

F405 = "torchtitan-llama3.1-405b-512gpu-3d-1f1b-float8"


def _cases():
    return {c["name"]: c for c in json.loads(MODERN_FILE.read_text())}


def _inflight(par):
    return np.array(inflight_closed_form(par.schedule, par.pp, par.num_microbatches,
                                         par.virtual_stages), dtype=float)


def test_only_torchtitan_keeps_a_buffer_per_microbatch():
    assert load_stack("torchtitan").p2p_buffers_per_microbatch
    for name in ("megatron-core", "megatron-2021", "deepspeed"):
        assert not load_stack(name).p2p_buffers_per_microbatch


def test_receive_buffers_per_microbatch_and_direction():
    """stage.py allocates, for each of the step's m microbatches, an input buffer on every stage
    but the first and an output-gradient buffer on every stage but the last; the in-flight
    inputs are the buffers the first layer keeps, already counted in its activations."""
    model = load_model("llama3-8b")
    titan = load_stack("torchtitan")
    par = Parallel(tp=2, pp=4, dp=1, micro_batch=1, num_microbatches=8, sequence_parallel=True)
    one = stage_output_bytes(model, par)
    assert one == 2 * 1 * model.seq_length * model.hidden_size / 2
    inflight = _inflight(par)  # 1F1B: 4, 3, 2, 1
    got = kept_outputs(model, par, inflight, titan)
    kept = inflight * one  # the stage outputs in fwd_cache, on every stage but the last
    want = [kept[0] + 8 * one,
            kept[1] + 8 * one + (8 - 3) * one,
            kept[2] + 8 * one + (8 - 2) * one,
            (8 - 1) * one]
    assert np.allclose(got, want)
    off = with_overrides(titan, "test", p2p_buffers_per_microbatch=False)
    assert np.allclose(kept_outputs(model, par, inflight, off)[:-1], kept[:-1])
    # one stage: no pipeline engine, no buffers
    single = replace(par, pp=1)
    assert kept_outputs(model, single, _inflight(single), titan).tolist() == [0.0]


def test_interleaved_chunks_each_hold_their_buffers():
    model = load_model("llama3-8b")
    titan = load_stack("torchtitan")
    par = Parallel(tp=1, pp=2, dp=1, micro_batch=1, num_microbatches=4, schedule="interleaved",
                   virtual_stages=2)
    inflight = _inflight(par)
    one = stage_output_bytes(model, par)
    got = kept_outputs(model, par, inflight, titan)
    off = kept_outputs(model, par, inflight,
                       with_overrides(titan, "test", p2p_buffers_per_microbatch=False))
    extra = got - off
    m = par.num_microbatches
    assert extra[0] == pytest.approx(m * one)  # first chunk: output gradients only
    assert extra[-1] == pytest.approx((m - inflight[-1]) * one)  # last: inputs only
    for k in (1, 2):
        assert extra[k] == pytest.approx(m * one + (m - inflight[k]) * one)


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(2, 8), m=st.integers(1, 32), mb=st.integers(1, 4))
def test_buffers_never_negative_and_grow_with_the_step(pp, m, mb):
    model = load_model("llama3-8b")
    titan = load_stack("torchtitan")
    par = Parallel(tp=1, pp=pp, dp=1, micro_batch=mb, num_microbatches=m)
    more = replace(par, num_microbatches=m + 1)
    a = kept_outputs(model, par, _inflight(par), titan)
    b = kept_outputs(model, more, _inflight(more), titan)
    assert (a >= 0).all() and (b >= a - 1e-6).all()


def test_the_405b_first_stage_holds_eight_gradient_buffers():
    """torchtitan's 405B 1F1B row (Table 5): 8 microbatches of 4 x 8192 tokens, SP over TP 8,
    hidden 16384: the first stage keeps 8 output-gradient buffers of 4 x 1024 x 16384 bf16,
    exactly 1 GiB, beside its 8 kept stage outputs."""
    setup = case_setup(_cases()[F405])
    par = setup.parallel
    one = stage_output_bytes(setup.model, par)
    assert one * 8 == 1 * GIB
    inflight = _inflight(par)
    got = kept_outputs(setup.model, par, inflight, setup.options)
    assert got[0] == pytest.approx(inflight[0] * one + 8 * one)


def _device_copy(case):
    other = copy.deepcopy(case)
    other["measured"]["memory_scope"] = "device"
    return other


def test_allocator_readings_leave_out_what_the_allocator_does_not_hold():
    """torchtitan logs max_reserved (the caching allocator's reserve): the prediction it is
    compared with leaves out RESERVED_BYTES (CUDA context, NCCL buffers), and nothing else."""
    case = _cases()["torchtitan-llama3.1-8b-8gpu-fsdp"]
    assert case["measured"]["memory_scope"] == "allocator"
    allocator = validate_case(case)
    device = validate_case(_device_copy(case))
    assert device.predicted_memory_gib - allocator.predicted_memory_gib == pytest.approx(
        constants.RESERVED_BYTES / GIB)
    assert allocator.predicted_oom == device.predicted_oom  # fitting still counts everything
    assert allocator.predicted_step_s == device.predicted_step_s


def test_every_torchtitan_memory_reading_is_the_allocators():
    for case in _cases().values():
        if case["measured"].get("memory_gib_per_gpu") is not None \
                and case.get("stack") == "torchtitan":
            assert case["measured"].get("memory_scope") == "allocator", case["name"]


def test_an_unknown_memory_scope_is_refused_in_one_line():
    case = copy.deepcopy(_cases()["torchtitan-llama3.1-8b-8gpu-fsdp"])
    case["measured"]["memory_scope"] = "nvidia-smi"
    with pytest.raises(PlanInputError) as e:
        check_runs_document([case], "runs.json")
    text = str(e.value)
    assert "\n" not in text and "memory_scope" in text


def test_sequence_parallel_backward_holds_one_whole_hidden_gradient():
    """Entering the TP region the backward all-gathers the SP-sharded gradient (Megatron-Core
    _ReduceScatterToSequenceParallelRegion.backward: _gather_along_first_dim), so of the MLP
    moment's two hidden-size gradients one is whole: h·(1 + 1/t) values per token, not 2h/t;
    without SP both were whole already (2h)."""
    from planner.cost.memory import ACT_BYTES, Shape, working_bytes

    block = load_model("llama3-70b").layers[1]
    h, f, t = block.hidden_size, block.ffn_hidden_size, 8
    sp = Shape(tp=t, sp=True, micro_batch=2, seq_len=4096)
    tokens = sp.tokens
    assert working_bytes(block, sp, "none", True) == pytest.approx(
        ACT_BYTES * tokens * (h + h / t + 2 * 2 * f / t))
    no_sp = replace(sp, sp=False)
    assert working_bytes(block, no_sp, "none", True) == pytest.approx(
        ACT_BYTES * tokens * (2 * h + 2 * 2 * f / t))
    one = replace(sp, tp=1, sp=False)
    assert working_bytes(block, one, "none", True) == pytest.approx(
        ACT_BYTES * tokens * (2 * h + 2 * 2 * f))
