"""Shape-dependent matmul efficiency (planner/cost/gemm.py): tile quantization charged, wave
quantization not, against NVIDIA's guide and Bekman's measured best shapes."""

import math

import pytest
from hypothesis import given, strategies as st

from planner.cost import gemm


def test_tile_quantization_is_the_share_of_computed_tiles_that_is_output():
    # NVIDIA guide §3.1: a dimension one past a tile multiple computes one more row of tiles
    assert gemm.tile_efficiency(4096, 4096, 128, 128) == 1.0
    assert gemm.tile_efficiency(4097, 4096, 128, 128) == pytest.approx(4097 / (33 * 128))
    assert gemm.tile_efficiency(256, 257, 256, 128) == pytest.approx(257 / 384)
    # the best of the guide's tiles: 384 fits 128x128 exactly, not 256x128
    assert gemm.quantization_efficiency(384, 4096) == 1.0


# Bekman, ml-engineering compute/accelerator/README.md, MAMF comparison table: the shape at which
# a sweep of bf16 torch.mm measured its highest rate, per GPU (two table versions).
MEASURED_BEST_SHAPES = {
    "A100 SXM (CUDA 12.1)": (6912, 16384, 2048),
    "A100 SXM (torch 2.6)": (1024, 10240, 5120),
    "A100 PCIe (CUDA 12.1)": (2304, 5120, 1536),
    "H100 SXM (CUDA 12.1)": (6144, 17920, 2816),
    "H100 SXM (torch 2.7)": (2048, 2048, 13312),
    "GH200 (CUDA 12.5)": (11264, 19712, 1536),
    "GH200 (torch 2.6)": (1024, 15360, 4096),
}
SMS = {"A100": 108, "H100": 132, "GH200": 132}


@pytest.mark.parametrize("gpu", sorted(MEASURED_BEST_SHAPES))
def test_measured_best_shapes_run_at_the_full_rate(gpu):
    """A sweep's best shape cannot be predicted slower than other shapes of the same sweep: the
    model puts each at the full rate (the profile's matmul_efficiency is measured there)."""
    m, n, k = MEASURED_BEST_SHAPES[gpu]
    assert gemm.quantization_efficiency(m, n) == 1.0
    assert gemm.gemm_seconds(m, k, n, 1e15) == pytest.approx(2 * m * n * k / 1e15)


def test_the_tail_wave_is_not_charged_because_measured_best_shapes_have_partial_waves():
    """Why cost/gemm.py leaves wave quantization out: by the guide's §3.2 rule (one 256x128 tile
    per SM, waves = ceil(tiles / SMs)) two measured best shapes would lose 9-17% to a partial
    last wave, and a sweep's best shape cannot be that far below a shape of whole waves."""
    def guide_wave_efficiency(m, n, sms):
        tiles = math.ceil(m / 256) * math.ceil(n / 128)
        return tiles / (math.ceil(tiles / sms) * sms)
    pcie = MEASURED_BEST_SHAPES["A100 PCIe (CUDA 12.1)"]
    gh200 = MEASURED_BEST_SHAPES["GH200 (torch 2.6)"]
    assert guide_wave_efficiency(*pcie[:2], SMS["A100"]) == pytest.approx(360 / 432)  # 3.33 waves
    assert guide_wave_efficiency(*gh200[:2], SMS["GH200"]) == pytest.approx(480 / 528)
    # the guide's own example: 108 tiles fill an A100, 109 need a second, nearly empty wave
    assert guide_wave_efficiency(256 * 9, 128 * 12, 108) == 1.0
    assert guide_wave_efficiency(256 * 9, 128 * 12 + 1, 108) == pytest.approx(117 / 216)


def test_backward_matmuls_keep_their_own_output_shapes():
    """Y = X·W (X: m x k, W: k x n): dX = dY·Wᵀ has output m x k, dW = Xᵀ·dY output k x n; an
    unaligned n (an unpadded vocabulary) costs the forward and the weight gradient, not dX."""
    m, k, n = 8192, 4096, 50257
    rate = 1e15
    fwd, dgrad, wgrad = gemm.training_gemm_seconds(m, k, n, rate)
    flops = 2 * m * k * n
    assert dgrad == pytest.approx(flops / rate)
    assert fwd == pytest.approx(flops / rate / (n / (math.ceil(n / 128) * 128)))
    assert wgrad == pytest.approx(fwd)
    assert fwd > dgrad


def test_layer_cost_prices_each_matmul_at_its_shape(monkeypatch):
    """cost/layer.py charges the head's logit GEMM (T x h @ h x V) by its shape: with an
    unpadded vocabulary the forward and weight-gradient matmuls lose the tile share."""
    from dataclasses import replace
    from planner.cost import constants
    from planner.cost.layer import layer_cost
    from planner.cost.memory import Shape
    from planner.hardware.profiles import load_hardware
    from planner.model.presets import PRESETS
    hw = load_hardware("a100-80gb")
    head = replace(PRESETS["gpt3-175b"].layers[-1], vocab_size=50257,
                   make_vocab_size_divisible_by=1)
    T, h, v = 2048, head.hidden_size, 50257
    shape = Shape(tp=1, sp=False, micro_batch=1, seq_len=T)
    charged = layer_cost(head, shape, "none", hw)
    monkeypatch.setattr(gemm, "quantization_efficiency", lambda m, n: 1.0)
    aligned = layer_cost(head, shape, "none", hw)
    rate = hw.peak_flops * (hw.matmul_efficiency or constants.MATMUL_EFFICIENCY)
    flops = 2 * T * h * v
    lost = flops / rate * (math.ceil(v / 128) * 128 / v - 1)  # 128x128 (or 256x128) tiles
    assert charged.fwd_s - aligned.fwd_s == pytest.approx(lost, rel=1e-6)
    assert charged.bwd_weight_s - aligned.bwd_weight_s == pytest.approx(lost, rel=1e-6)
    assert charged.bwd_input_s == pytest.approx(aligned.bwd_input_s, rel=1e-9)



@given(st.integers(1, 40000), st.integers(1, 40000), st.integers(1, 40000))
def test_a_gemm_never_runs_above_the_well_shaped_rate(m, k, n):
    """Quantization only wastes work: the time is at least the FLOPs at the profile's rate, equal
    to it when both output dimensions are multiples of 128, and the efficiency is in (0, 1]."""
    rate = 1e14
    t = gemm.gemm_seconds(m, k, n, rate)
    assert t >= 2 * m * k * n / rate * (1 - 1e-12)
    assert 0 < gemm.quantization_efficiency(m, n) <= 1
    aligned = gemm.gemm_seconds(128 * m, k, 128 * n, rate)
    assert aligned == pytest.approx(2 * 128 * m * k * 128 * n / rate)
