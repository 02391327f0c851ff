"""Shape-dependent matmul efficiency: tile quantization (and why wave quantization is not charged).

A GPU computes C = A·B (M×K times K×N) by cutting the M×N output into tiles, one thread block
each, and running the blocks on its SMs in waves. NVIDIA's "Matrix Multiplication Background
User's Guide" (DU-09799-001, §3 "Dimension Quantization Effects") names the two losses this
causes:

- §3.1: "Tile quantization occurs when matrix dimensions are not divisible by the thread block
  tile size." The last row and column of tiles compute their full size, of which only part is
  the output.
- §3.2: "While tile quantization means the problem size is quantized to the size of each tile,
  there is a second quantization effect where the total number of tiles is quantized to the
  number of multiprocessors on the GPU: Wave quantization." Its example: "An NVIDIA A100 GPU
  has 108 SMs; in the particular case of 256x128 thread block tiles, it can execute one thread
  block per SM, leading to a wave size of 108 tiles that can execute simultaneously. Thus, GPU
  utilization will be highest when the number of tiles is an integer multiple of 108 or just
  below."
- §2.3 on the choice of tile: "Larger tiles have more data reuse, allowing them to use less
  bandwidth and be more efficient than smaller tiles. On the other hand, for a problem of a
  given size, using larger tiles will generate fewer tiles to run in parallel, which can
  potentially lead to under-utilization of the GPU." and "This tradeoff between tile efficiency
  and tile parallelism suggests that the larger the GEMM, the less important this tradeoff is:
  at some point, a GEMM has enough work to use the largest available tiles and still fill the
  GPU."

The model charges tile quantization in full, with the guide's large tile (256×128, either
orientation) or its half (128×128), whichever wastes less. It does not charge wave quantization,
and that choice was made with measurements in view: Bekman's MAMF sweeps (ml-engineering,
compute/accelerator, MAMF table) found the best A100-PCIe shape, 2304x5120x1536, at 3.33 waves
of 256x128 tiles, which the guide's rule puts 17% below a whole number of waves; charging the
tail wave moved this repository's zero-bubble 14.6B runs (4.44 waves per QKV GEMM) 8-10 points
too slow and its Megatron 2021 table 1.7B-18B runs 6-11 points, and charging only GEMMs of less
than one wave (the row-parallel input gradient at TP 8, 2048x768 with K = 6144) moved those
0.2-1.2 points further from the measurements (plan validate). Current libraries split the K loop
over idle SMs (cuBLAS split-K; CUTLASS stream-K, Osama et al. 2023, "Stream-K: Work-centric
Parallel Decomposition for Dense Matrix-Matrix Multiplication on the GPU", PPoPP) and so hide
both the tail wave and a short first wave for the K depths of training (hundreds and more). The
rate multiplies the profile's measured large-matmul rate (matmul_efficiency, the best shape of a
sweep, tile-aligned by construction), so only the loss relative to a well-shaped matmul is added.
"""

from __future__ import annotations

import math
from functools import lru_cache

# (tile rows, tile columns): the guide's 256x128 example tile in both orientations and 128x128.
TILES = ((256, 128), (128, 256), (128, 128))


def tile_efficiency(m: int, n: int, tile_m: int, tile_n: int) -> float:
    """Share of the computed tiles' area that is output (§3.1)."""
    return (m * n) / (math.ceil(m / tile_m) * tile_m * math.ceil(n / tile_n) * tile_n)


@lru_cache(maxsize=65536)
def quantization_efficiency(m: float, n: float) -> float:
    """Useful fraction of the work of a GEMM whose output is m x n, with the best tile of TILES.
    A pure function of two numbers, cached: a search prices the same few shapes for every
    recompute mode and expert-parallel degree (tens of thousands of calls, DeepSeek-V3 on 2,048
    GPUs)."""
    m, n = max(1, round(m)), max(1, round(n))
    return max(tile_efficiency(m, n, tm, tn) for tm, tn in TILES)


def gemm_seconds(m: float, k: float, n: float, rate: float) -> float:
    """Seconds of one (m x k) @ (k x n) matmul at ``rate`` FLOP/s for well-shaped matmuls."""
    if m <= 0 or k <= 0 or n <= 0:
        return 0.0
    return 2.0 * m * k * n / (rate * quantization_efficiency(m, n))


def training_gemm_seconds(m: float, k: float, n: float,
                          rate: float) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) seconds of a weight matmul Y = X·W with X of
    m x k and W of k x n: the backward computes dX = dY·Wᵀ (output m x k) and dW = Xᵀ·dY
    (output k x n), each with the forward's FLOPs and its own output shape."""
    return gemm_seconds(m, k, n, rate), gemm_seconds(m, n, k, rate), gemm_seconds(k, m, n, rate)


def weight_matmul_seconds(shapes, rate: float) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) seconds of a layer's weight matmuls, each
    given as (m, k, n). An MoE layer lists the same shape once per local expert: each
    distinct shape is priced once, the sums still run over every matmul in order."""
    priced: dict = {}
    for s in shapes:
        if s not in priced:
            priced[s] = training_gemm_seconds(*s, rate)
    parts = [priced[s] for s in shapes]
    return tuple(sum(p[i] for p in parts) for i in range(3))
