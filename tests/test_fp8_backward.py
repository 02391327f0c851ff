"""FP8 GEMMs' operand copies in the backward (planner/cost/fp8_backward.py): the byte count of
the tensors torchao's tensor-wise Float8Linear backward makes, what Transformer Engine keeps
instead, and where it moves torchtitan's published Float8 memory (docs/performance.md)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from planner.cost import fp8_backward, precision
from planner.cost.layer import layer_cost
from planner.cost.memory import Shape
from planner.fidelity.cases import MODERN_FILE, case_setup
from planner.fidelity.published import validate_case
from planner.hardware.profiles import load_hardware
from planner.model.load import load_model
from planner.stack import load_stack, with_overrides

H100 = load_hardware("h100")


def _fp8(stack: str, **changes):
    return with_overrides(load_stack(stack), "t", precision="fp8", **changes)


def test_one_linear_counts_the_tensors_torchaos_backward_makes():
    """Llama 3.1 405B's down projection on one GPU of TP 8 at 4 x 8192 tokens (Table 5's 1F1B
    microbatch): m = 32768, k = 53248 / 8, n = 16384. torchao's backward (v0.8.0
    float8_linear.py / float8_ops.py): grad_input = mm(grad_output_fp8, weight_fp8_t.t()) with
    'b_data = b_data.t().contiguous().t()' (the weight copied column-major: k·n bytes) beside
    the e5m2 output gradient (m·n); then grad_weight = mm(grad_output_fp8.t(), input_fp8) with
    'a_data = a_data.contiguous()' (the output gradient transposed: m·n more) and the saved
    input copied column-major (m·k)."""
    m, k, n = 32768, 53248 // 8, 16384
    titan = _fp8("torchtitan")
    assert not (titan.fp8_saved_activations or titan.fp8_weight_cache)
    dgrad, wgrad = m * n + k * n, 2 * m * n + m * k
    got = fp8_backward.gemm_copy_bytes(m, k, n, titan.fp8_saved_activations,
                                       titan.fp8_weight_cache)
    assert got == max(dgrad, wgrad) == wgrad == 1_291_845_632  # 1.2 GiB of FP8 copies


def test_transformer_engine_keeps_the_layouts_it_needs():
    """TE saves the input's transposed FP8 copy and caches the weight in both layouts (the
    activations and model states count those); its backward makes only the output gradient in
    both layouts (cast-transpose): 2·m·n."""
    te = _fp8("megatron-core")
    assert te.fp8_saved_activations and te.fp8_weight_cache
    assert fp8_backward.gemm_copy_bytes(4096, 8192, 2048, True, True) == 2 * 4096 * 2048


def test_sixteen_bit_layers_and_the_head_make_no_copies():
    spec = load_model("llama3-8b")
    shape = Shape(tp=2, sp=True, micro_batch=1, seq_len=spec.seq_length)
    block, head = spec.layers[1], spec.layers[-1]
    assert fp8_backward.backward_copy_bytes(block, shape, load_stack("torchtitan")) == 0.0
    assert fp8_backward.backward_copy_bytes(head, shape, _fp8("torchtitan")) == 0.0
    fp8 = layer_cost(block, shape, "full", H100, _fp8("torchtitan"))
    bf16 = layer_cost(block, shape, "full", H100, load_stack("torchtitan"))
    assert fp8.work_bytes - bf16.work_bytes == pytest.approx(
        fp8_backward.backward_copy_bytes(block, shape, _fp8("torchtitan")))


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), mb=st.integers(1, 4),
       seq=st.sampled_from([1024, 4096, 8192]),
       saved=st.booleans(), cached=st.booleans())
def test_copies_invariants(tp, mb, seq, saved, cached):
    # at least the output gradient of the widest GEMM in both layouts, at most that plus its
    # input and weight once each; a kept layout never adds; twice the tokens never less
    spec = load_model("llama3-8b")
    block = spec.layers[1]
    shape = Shape(tp=tp, sp=tp > 1, micro_batch=mb, seq_len=seq)
    opts = _fp8("torchtitan", fp8_saved_activations=saved, fp8_weight_cache=cached)
    got = fp8_backward.backward_copy_bytes(block, shape, opts)
    gemms = precision.block_gemms(block, shape)
    assert max(2 * g.m * g.n for g in gemms) <= got <= max(
        2 * g.m * g.n + g.m * g.k + g.k * g.n for g in gemms)
    assert got <= fp8_backward.backward_copy_bytes(block, shape, _fp8("torchtitan"))
    double = Shape(tp=tp, sp=tp > 1, micro_batch=2 * mb, seq_len=seq)
    assert fp8_backward.backward_copy_bytes(block, double, opts) >= got


def test_table5_rows_move_by_the_largest_gemms_copies():
    """On the 405B rows of torchtitan docs/performance.md Table 5 the peak is a block's
    backward on the first stage: it rises by the MLP up projection's copies (gate and up as one
    GEMM, the largest), over one less the allocator's fragmentation share. The 70B row of
    Table 4 peaks in the loss's backward (the output head is not Float8): unmoved."""
    cases = {c["name"]: c for c in json.loads(MODERN_FILE.read_text())}
    for name, mb in (("torchtitan-llama3.1-405b-512gpu-3d-1f1b-float8", 4),
                     ("torchtitan-llama3.1-405b-512gpu-3d-interleaved-float8", 2)):
        setup = case_setup(cases[name])
        block = setup.model.layers[1]
        shape = Shape(tp=8, sp=True, micro_batch=mb, seq_len=8192)
        up = precision.block_gemms(block, shape)[2]
        m, k, n = mb * 8192, 16384, 2 * 53248 // 8
        assert (up.m, up.k, up.n) == (m, k, n)
        assert fp8_backward.backward_copy_bytes(block, shape, setup.options) == \
            2 * m * n + m * k
    row = validate_case(cases["torchtitan-llama3.1-70b-256gpu-fsdp32-tp8-float8"])
    # -3.7% before the root unit and the side streams' reserve (test_validate's reserve pass)
    assert row.memory_error == pytest.approx(-0.027, abs=0.005)
