"""How much longer the flash attention kernel a stack names runs than FlashAttention-2.

The hardware profiles' ``attention_efficiency`` (and constants.ATTENTION_EFFICIENCY) is
FlashAttention-2's achieved fraction of peak. A stack that runs another flash kernel
(Stack.attention_kernel) pays its attention time (the scores, softmax and values, not the Q/K/V
and output projections, which are GEMMs) times the factors here, forward and backward apart, as
published against FlashAttention-2 on the same GPU. A recomputed forward runs the same kernel, so
it pays the forward factor too (it is the forward again: planner/cost/layer.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelTime:
    """A kernel's attention time over FlashAttention-2's on the same shapes, per pass."""

    forward: float
    backward: float


FLASH2 = KernelTime(forward=1.0, backward=1.0)

# FlashAttention in Triton (FlashAttention-1's algorithm written in Triton). Dao 2023,
# "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning" (arXiv
# 2307.08691), sec. 4.1, on an A100 80GB SXM4 with sequence lengths 512 to 16k, head dimension 64
# or 128, with and without the causal mask: "FlashAttention-2 is around 1.3-1.5× faster than
# FlashAttention in Triton in the forward pass and around 2× faster in the backward pass." (The
# sec. 4 summary of the same figures: "1.3-2.5× faster than FlashAttention in Triton".)
# Forward: 1.3, the lower end of the published range, the conservative choice (the least time
# attributed to the kernel). Two reasons besides: the paper's benchmark times OpenAI Triton's
# op (Dao-AILab/flash-attention benchmarks/benchmark_flash_attention.py: "from
# triton.ops.flash_attention import attention as attention_triton"), while llm-foundry's
# attn_impl triton runs Dao's derivative of it (llmfoundry/models/layers/flash_attn_triton.py
# @0227d9f7: "We use the FlashAttention implementation from Phil Tillet a starting point." ...
# "Speed up the forward pass a bit"), which may be the faster of the two; and the figures are
# for A100, the same ratio is applied on every GPU (no published H100 comparison was at hand).
# Backward: 2.0, the single figure published. The same file's docstring corroborates the size
# without a number: "Overall Triton forward + backward is slightly slower than CUDA forward +
# backward" (CUDA: FlashAttention-1), which FlashAttention-2 is "around 2× faster than" (sec.
# 4.1). Chosen from the paper alone; the llm-foundry rows it prices were known to be predicted
# too fast (4-30%) when it was chosen, and the lower end is the choice that moves them least.
FLASH_TRITON = KernelTime(forward=1.3, backward=2.0)

KERNEL_TIMES = {"flash2": FLASH2, "flash_triton": FLASH_TRITON}


def kernel_time(kernel: str) -> KernelTime:
    """The time factors of a kernel named by Stack.attention_kernel (validated there)."""
    return KERNEL_TIMES[kernel]
