"""Memory that ZeRO-3's side streams keep reserved: measured, but no demand on capacity.

PyTorch's caching allocator hands a freed block only to later allocations on the stream that
allocated it: "the CUDA caching allocator guarantees that the memory will only be reused with
the same creation stream" (Tensor.record_stream docs). FSDP2 allocates two kinds of tensors on
side streams. Each all-gather output is allocated on its copy-in stream ('with
device_handle.stream(all_gather_copy_in_stream): ... all_gather_input, all_gather_output =
torch.ops.fsdp.all_gather_copy_in(', foreach_all_gather) and freed once copied out into the
unsharded parameters, which live on the compute stream; so the copy-in stream keeps blocks for
the all-gathers in flight at once: the running unit's and the ``zero3_prefetch`` next, taken at
the model's largest gathered layer as cost/memory.py prices the gathered weights themselves.
Each reduce-scatter output is allocated on the reduce-scatter stream ('with
device_handle.stream(reduce_scatter_stream): reduce_output = reduce_scatter_input.new_empty(
(reduce_scatter_output_numel,))', foreach_reduce) and the sharded gradients are views of it
('new_sharded_grad = torch.as_strided(reduce_output, ...)'; torch/distributed/_composable/fsdp/
_fsdp_collectives.py, torch 2.5-2.6). Where the stack holds a stage's gradients unsharded from
the first forward to the last backward (cost/zero.py holds_for_step), the sharded ones are
freed by the step's zero_grad and rebuilt only after the last backward, so their blocks sit
reserved on that stream through the compute stream's peak; otherwise they are live at the peak
and already counted as gradients.

None of it makes a plan not fit: an allocation that fails first frees every cached block and
tries again ('// Free all non-split cached blocks and retry alloc.', c10/cuda/
CUDACachingAllocator.cpp DeviceCachingAllocator::malloc). It counts where memory is read as the
allocator's reserve or the device's use (torch.cuda.max_memory_reserved, nvidia-smi), which is
how published runs report it (planner/fidelity/published.py), not in what fits.
"""

from __future__ import annotations

import numpy as np


def side_stream_bytes(largest_gather_bytes: float, prefetch: int,
                      idle_shard_grad_bytes) -> np.ndarray:
    """Per rank: the all-gather outputs of the running unit and the ``prefetch`` next (each at
    ``largest_gather_bytes``) plus ``idle_shard_grad_bytes``, the rank's sharded gradients where
    they are freed through the peak (zeros where they are live and counted already)."""
    idle = np.asarray(idle_shard_grad_bytes, dtype=float)
    return (1 + prefetch) * largest_gather_bytes + idle
