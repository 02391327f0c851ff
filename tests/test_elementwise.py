"""Element-wise traffic of fused and eager stacks (planner/cost/elementwise.py). The measured
check is the torchtitan eager/compile pair (tests/test_validate.py); these pin the mechanism."""

from dataclasses import replace

import pytest
from hypothesis import given, strategies as st

from planner.cost import constants, elementwise
from planner.cost.layer import layer_cost
from planner.cost.memory import Shape
from planner.hardware.profiles import load_hardware
from planner.model.presets import PRESETS
from planner.stack import default_stack, with_overrides

LLAMA = PRESETS["llama3-8b"].layers[1]
HW = load_hardware("a100-80gb")
RATE = HW.memory_bandwidth_gbps * 1e9 * (HW.memory_efficiency or constants.MEMORY_EFFICIENCY)


def test_eager_rmsnorm_moves_36_bytes_per_element_where_a_fused_one_moves_4():
    # x.float() (2+4), pow (4+4), mean (4), x*rsqrt (4+4), type_as (4+2), *weight (2+2)
    eager = (2 + 4) + (4 + 4) + 4 + (4 + 4) + (4 + 2) + (2 + 2)
    assert eager == 36 and elementwise.EAGER_RMSNORM_EXTRA == eager - 4
    # float (2+4), complex multiply (4+4), type_as (4+2) against a fused read 2 + write 2
    assert elementwise.EAGER_ROPE_EXTRA == (2 + 4) + (4 + 4) + (4 + 2) - 4


def test_sequence_parallel_shards_the_norms_and_tp_shards_the_heads():
    T = 4096
    whole = elementwise.eager_extra_bytes(LLAMA, T, tp=1, sp=False)
    tp8 = elementwise.eager_extra_bytes(LLAMA, T, tp=8, sp=False)
    sp8 = elementwise.eager_extra_bytes(LLAMA, T, tp=8, sp=True)
    norms = 32 * T * LLAMA.hidden_size * 2
    assert tp8 - sp8 == pytest.approx(norms * (1 - 1 / 8))
    assert sp8 == pytest.approx(whole / 8)


def test_no_gqa_copy_without_grouped_heads_and_no_rope_without_rotary_positions():
    T = 2048
    mha = replace(LLAMA, num_kv_heads=LLAMA.num_attention_heads)
    h = LLAMA.hidden_size
    gqa_copy = 2 * T * 2 * (1024 + 4096)
    rope_gqa = 16 * T * (4096 + 1024)
    rope_mha = 16 * T * (4096 + 4096)
    assert elementwise.eager_extra_bytes(LLAMA, T, 1, False) - gqa_copy - rope_gqa == \
        pytest.approx(elementwise.eager_extra_bytes(mha, T, 1, False) - rope_mha)
    no_rope = replace(LLAMA, rope=False)
    assert elementwise.eager_extra_bytes(LLAMA, T, 1, False) - \
        elementwise.eager_extra_bytes(no_rope, T, 1, False) == pytest.approx(rope_gqa)
    assert elementwise.fused_rope_bytes(no_rope, T, 1) == 0.0
    assert elementwise.eager_head_extra_bytes(replace(LLAMA, norm="layernorm"), T, 1, False) == 0
    assert elementwise.eager_head_extra_bytes(LLAMA, T, 1, False) == 32 * T * h


def test_fused_stacks_pay_one_rope_kernel_and_eager_stacks_pay_the_rest():
    T = 2048
    shape = Shape(tp=2, sp=True, micro_batch=1, seq_len=T)
    fused = default_stack()
    eager = with_overrides(fused, fused_elementwise=False)
    no_rope = replace(LLAMA, rope=False)
    with_rope = layer_cost(LLAMA, shape, "none", HW, fused)
    without = layer_cost(no_rope, shape, "none", HW, fused)
    assert with_rope.fwd_s - without.fwd_s == pytest.approx(4 * T * (4096 + 1024) / 2 / RATE)
    # the backward of a memory-bound op moves twice its forward's bytes
    gap = layer_cost(LLAMA, shape, "none", HW, eager)
    base = layer_cost(LLAMA, shape, "none", HW, fused)
    floor = constants.EAGER_KERNEL_MIN_S * RATE
    extra = elementwise.eager_extra_bytes(LLAMA, T, 2, True, floor) / RATE
    assert gap.fwd_s - base.fwd_s == pytest.approx(extra)
    assert gap.bwd_input_s - base.bwd_input_s == pytest.approx(2 * extra)


def test_an_eager_kernel_shorter_than_its_launch_costs_the_launch():
    """At 16 tokens every eager kernel of a block moves far less than 7 us of HBM traffic: the
    chain costs its kernel count times the launch (constants.EAGER_KERNEL_MIN_S)."""
    T, floor = 16, constants.EAGER_KERNEL_MIN_S * RATE
    got = elementwise.eager_extra_bytes(LLAMA, T, 1, False, floor)
    kernels = 2 * 6 + 2 * 3 + 2 + 2  # two RMSNorms, RoPE on Q and K, SwiGLU, two repeat_kv copies
    h, q, kv, f = 4096, 4096, 1024, 14336
    fused = 2 * 4 * T * h + 4 * T * (q + kv) + 6 * T * f
    assert got == pytest.approx(kernels * floor - fused)
    # at 8,192 tokens no kernel is that short: the floor changes nothing
    assert elementwise.eager_extra_bytes(LLAMA, 8192, 1, False, floor) == \
        elementwise.eager_extra_bytes(LLAMA, 8192, 1, False)



@given(st.integers(1, 65536), st.sampled_from([1, 2, 4, 8]), st.booleans(),
       st.floats(0, 1e8))
def test_eager_kernels_never_cost_less_than_fused_ones(tokens, tp, sp, floor):
    """Eager chains move at least what the fused kernel does: the extra is never negative, and a
    launch floor only adds to it."""
    for layer in (LLAMA, PRESETS["gpt3-175b"].layers[1], replace(LLAMA, rope=False)):
        plain = elementwise.eager_extra_bytes(layer, tokens, tp, sp)
        assert plain >= 0
        assert elementwise.eager_extra_bytes(layer, tokens, tp, sp, floor) >= plain


def test_a_compiled_complex_rope_pays_the_eager_rope_chain_and_nothing_else():
    """torch.compile fuses every point-wise chain but a complex one: torchtitan's RoPE
    (view_as_complex, a complex product) keeps its eager kernels (Stack.complex_rope). A fused
    stack so marked pays the eager RoPE's extra bytes (16 per element of Q and K) in the forward,
    twice in the backward and once more in a recompute; an eager stack pays them once already,
    and a model without RoPE pays nothing."""
    T = 2048
    shape = Shape(tp=2, sp=True, micro_batch=1, seq_len=T)
    fused = default_stack()
    compiled = with_overrides(fused, complex_rope=True)
    floor = constants.EAGER_KERNEL_MIN_S * RATE
    assert elementwise.eager_rope_extra_bytes(LLAMA, T, 2) == \
        pytest.approx(16 * T * (4096 + 1024) / 2)
    rope = elementwise.eager_rope_extra_bytes(LLAMA, T, 2, floor) / RATE  # launch floors too
    base, got = (layer_cost(LLAMA, shape, "full", HW, s) for s in (fused, compiled))
    assert got.fwd_s - base.fwd_s == pytest.approx(rope)
    assert got.bwd_input_s - base.bwd_input_s == pytest.approx(2 * rope)
    assert got.recompute_s - base.recompute_s == pytest.approx(rope)
    eager = with_overrides(fused, fused_elementwise=False)
    both = with_overrides(eager, complex_rope=True)
    assert layer_cost(LLAMA, shape, "none", HW, both).fwd_s == \
        pytest.approx(layer_cost(LLAMA, shape, "none", HW, eager).fwd_s)
    no_rope = replace(LLAMA, rope=False)
    assert layer_cost(no_rope, shape, "none", HW, compiled).fwd_s == \
        pytest.approx(layer_cost(no_rope, shape, "none", HW, fused).fwd_s)


@given(tokens=st.integers(1, 1 << 16), tp=st.sampled_from([1, 2, 4, 8]))
def test_the_eager_rope_is_part_of_the_eager_extras(tokens, tp):
    floor = constants.EAGER_KERNEL_MIN_S * RATE
    no_rope = replace(LLAMA, rope=False)
    assert elementwise.eager_extra_bytes(LLAMA, tokens, tp, False, floor) - \
        elementwise.eager_extra_bytes(no_rope, tokens, tp, False, floor) == \
        pytest.approx(elementwise.eager_rope_extra_bytes(LLAMA, tokens, tp, floor))
