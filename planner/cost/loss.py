"""The cross-entropy's transient memory in the backward of the output head, by how the stack
runs the loss.

A fused loss (Megatron's vocab-parallel cross-entropy) writes its gradient in place: nothing
beyond the head's working set (cost/memory.py working_bytes). An eager ``F.cross_entropy`` on
fp32 logits (torchtitan) writes the nll gradient and the log-softmax gradient as two new
buffers beside the kept log-probabilities. The 16-bit gradient of the logits (the backward of
the model's cast, 'output = self.output(h).float() if self.output else h', torchtitan
models/llama/model.py) is written only after that: autograd frees a node's saved tensors as
soon as the node has run ("auto outputs = call_function(graph_task, func, inputs); ... if
(!graph_task->keep_graph_) { fn.release_variables(); }", torch/csrc/autograd/engine.cpp
Engine::evaluate_function) and its input gradient with the call, so when the cast's backward
writes the 16-bit gradient only the fp32 log-softmax gradient is left beside it. The moment is
three fp32 buffers, not three and a 16-bit one.

Under tensor parallelism torchtitan runs the loss on
vocab-sharded logits with DTensor's loss parallel ("output": ColwiseParallel(input_layouts=
Shard(1), output_layouts=Shard(-1) if loss_parallel ...), torchtitan parallelize_llama.py
apply_tp; on unless --training.disable_loss_parallel), whose backward fuses both steps as
``grad_input = torch.zeros_like(x)`` ... ``return (grad_input + torch.exp(x)) * grad_output``
(torch/distributed/tensor/parallel/loss.py _nll_loss_and_log_softmax_backward): three new fp32
buffers at once (the zeros, the exponential, their sum; then the product as the sum's
exponential is freed) beside the kept log-probabilities. The 16-bit gradient of the logits is
written only after they are freed, so it does not add to that moment.
"""

from __future__ import annotations

from planner.cost.memory import ACT_BYTES, Shape
from planner.model.spec import Layer
from planner.stack import Stack


def loss_work_bytes(layer: Layer, shape: Shape, opts: Stack) -> float:
    """Bytes the loss's backward adds to the head's working set (which already counts the
    16-bit logit gradient): 0 fused; eager, two loss-dtype logit buffers in place of the 16-bit
    gradient (written after they are freed); under TP with the stack's loss parallel, three."""
    if opts.fused_cross_entropy or layer.kind != "head":
        return 0.0
    values = shape.tokens * layer.padded_vocab(shape.tp) / shape.tp
    buffers = 3 if opts.loss_parallel and shape.tp > 1 else 2
    return buffers * opts.loss_bytes * values - ACT_BYTES * values
