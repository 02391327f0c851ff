"""FP8 GEMMs' transient copies in the backward: the operand layouts an FP8 GEMM needs that the
16-bit backward never makes.

Hopper's FP8 GEMM (``torch._scaled_mm``, cuBLASLt) takes its first operand row-major and its
second column-major. A 16-bit GEMM reads a transposed operand in place; an FP8 one needs the
other layout written out. torchao's Float8Tensor matmul does it at the GEMM, for each of the
three GEMMs of a linear (torchao v0.8.0, torchao/float8/float8_ops.py ``preprocess_addmm``; the
release after the torchao commit eab345c of 2024-12-23 that torchtitan's Float8 runs of
docs/performance.md name, with the same tensor-wise path):

    if not is_row_major(a_data.stride()):
        a_data = a_data.contiguous()
    if is_row_major(b_data.stride()):
        b_data = b_data.t().contiguous().t()

and the backward of its tensor-wise path (v0.8.0 torchao/float8/float8_linear.py
``manual_float8_matmul_with_args_in_float8``, whose forward keeps FP8 copies,
'ctx.save_for_backward(input_fp8, weight_fp8_t)') runs, in this order,

    grad_input = torch.mm(grad_output_fp8_reshaped, weight_fp8_t.t())
    ...
    grad_weight = torch.mm(grad_output_fp8_reshaped.t(), input_fp8_reshaped)

on an output gradient cast to FP8 first (``NoopFwToFloat8BwDynamic``: "Forward: no-op,
Backward: convert to float8_e5m2 with dynamic scaling"). So, for a linear whose GEMM multiplies
m tokens by a k x n weight, beside the 16-bit gradients the 16-bit model already counts
(cost/memory.py working_bytes):
- input gradient: the FP8 output gradient (m·n bytes) and the weight's column-major copy
  (k·n: ``weight_fp8_t.t()`` is row-major, so ``b_data.t().contiguous().t()`` copies it);
- weight gradient: the FP8 output gradient, still referenced, and its transposed copy
  (``grad_output_fp8_reshaped.t()`` is not row-major: ``a_data.contiguous()``, m·n), and the
  saved FP8 input's column-major copy (m·k).
The larger of the two moments, over the block's GEMMs, is what one backward adds (the copies
of one GEMM are freed when it returns: they are locals of ``preprocess_addmm``'s caller).

A stack that keeps the layouts instead does not make them here: Transformer Engine saves the
input's transposed FP8 copy in the forward (``fp8_saved_activations``, counted in the
activations by cost/precision.py) and caches the weight in both layouts
(``fp8_weight_cache``, counted in the model states); its output gradient is cast to both
layouts at once by its cast-transpose kernel, the same 2·m·n bytes.

Counted as a fused cast leaves them (torch.compile, which torchtitan calls required for
competitive Float8 performance and its Float8 runs use): the FP8 tensors themselves. An eager
torchao cast goes through an fp32 copy ('tensor_scaled = tensor.to(torch.float32) * scale',
float8_tensor.py ``_ToFloat8ConstrFunc``, then a clamp), temporaries not counted here. Inductor
frees a buffer at its last use, so the FP8 output gradient may be gone before the
weight-gradient GEMM (m·n less there): this is an upper bound by at most that. SwiGLU's gate
and up projections are one GEMM here
(cost/precision.py block_gemms, Megatron's fused linear_fc1); a stack that runs them as two
linears (torchtitan's w1, w3) makes the copies of one at a time, so this is an upper bound there
by one of their output gradients' copies.
"""

from __future__ import annotations

from planner.cost.memory import Shape
from planner.cost.precision import FP8_BYTES, block_gemms, uses_fp8
from planner.model.spec import Layer
from planner.stack import Stack


def gemm_copy_bytes(m: float, k: float, n: float, input_saved_transposed: bool,
                    weight_cached_transposed: bool) -> float:
    """Bytes of FP8 copies alive at the larger of one linear's two backward GEMMs (m tokens,
    k x n weight): the input gradient's (output gradient in FP8, weight column-major) or the
    weight gradient's (output gradient in FP8 and transposed, input column-major). A layout
    the stack keeps (the saved transposed input, the cached transposed weight) is not made."""
    weight = 0.0 if weight_cached_transposed else k * n
    inputs = 0.0 if input_saved_transposed else m * k
    return FP8_BYTES * max(m * n + weight, 2 * m * n + inputs)


def backward_copy_bytes(layer: Layer, shape: Shape, opts: Stack) -> float:
    """The most FP8 operand copies one backward of ``layer`` holds at once on this GPU (0 where
    its linears run 16-bit): the largest of its GEMMs' (:func:`gemm_copy_bytes`)."""
    if not uses_fp8(layer, opts):
        return 0.0
    return max((gemm_copy_bytes(g.m, g.k, g.n, opts.fp8_saved_activations,
                                opts.fp8_weights_held) for g in block_gemms(layer, shape)),
               default=0.0)
