"""The caching allocator's fragmentation under each recompute mode: how much of full recompute's
free-and-rebuild churn a mode has.

cost/constants.py gives two shares of reserved memory that hold no tensor: FRAGMENTATION for
steady tensor sizes and RECOMPUTE_FRAGMENTATION where "activation recomputation frees and
rebuilds a layer's activations once per microbatch". Full recompute does that to a whole block;
so does any selective recompute that re-runs a checkpointed region (normal checkpointing: the
region's forward runs again under autograd and every intermediate it does not save is
allocated anew). Megatron-Core separates these from its output-discarding modules
(TransformerConfig.recompute_modules: '"moe_act", "layernorm", and "mla_up_proj" use
output-discarding checkpointing, "core_attn", "mlp", "moe", and "shared_experts" use normal
checkpointing'): CheckpointWithoutOutput frees only the module's output ("use resize to release
the output tensor memory and still keep the metadata in the tensors",
``output.untyped_storage().resize_(0)``) and restores that one tensor before its consumer's
backward ("restore the recomputed memory without changing the metadata",
megatron/core/tensor_parallel/random.py). Every other tensor of the block is kept as without
recompute. DeepSeek-V3's recompute is of this kind (report sec. 3.2.3: "We recompute all
RMSNorm operations and MLA up-projections during back-propagation, thereby eliminating the need
to persistently store their output activations").

So an output-discarding recompute churns only the bytes it discards, not the block's. Its
fragmentation is taken as the steady share plus the recompute surcharge (RECOMPUTE_FRAGMENTATION
- FRAGMENTATION) in proportion to the bytes it frees and rebuilds per block over the bytes full
recompute frees and rebuilds on the same block (the block's kept activations less the input
full recompute keeps). Linear in that churn is our assumption, not a published curve: it is 0
without recompute and 1 under full recompute, where both constants stay as they were chosen
(BLOOM's full-recompute readings). Normal checkpointing keeps the whole surcharge:
torchtitan's op policy checkpoints the whole block (a torch.utils.checkpoint region), and its
measured rows (torchtitan Llama 3.1 8B, op selective AC, 67.0-82.4 GiB) read 1.6-9.9% under the
prediction with it; this split was made with those rows in view.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from planner.cost import constants
from planner.cost.memory import Shape, activation_bytes
from planner.cost.recompute import OP_POLICY, discarded_bytes
from planner.model.spec import Layer

# Megatron-Core's modules checkpointed as a whole region ("normal checkpointing", module
# docstring), and torchtitan's op-level policy, which checkpoints the whole block
NORMAL_CHECKPOINT = frozenset({"core_attn", "mlp", "moe", "shared_experts", OP_POLICY})


def layer_churn(layer: Layer, shape: Shape | None, mode: str, flash: bool) -> float:
    """Share of full recompute's free-and-rebuild churn that ``mode`` has on this layer: 0
    without recompute and on layers no recompute covers (embedding; a head with MTP modules
    takes its MTP block's), 1 under full recompute or a selective one that re-runs a
    checkpointed region, else (bytes the output-discarding modules discard) / (bytes full
    recompute frees and rebuilds), within [0, 1]. Only a selective mode reads ``shape`` (None
    will do for none and full)."""
    if layer.kind == "head" and layer.mtp_depth and layer.mtp_block is not None:
        # its multi-token-prediction modules' blocks run under the stage's mode (cost/mtp.py)
        return layer_churn(layer.mtp_block, shape, mode, flash)
    if mode == "none" or layer.kind != "block":
        return 0.0
    if mode == "full" or NORMAL_CHECKPOINT.intersection(shape.recompute_modules):
        return 1.0
    full = activation_bytes(layer, shape, "none", flash) - activation_bytes(
        layer, shape, "full", flash)
    return min(discarded_bytes(layer, shape) / full, 1.0) if full > 0 else 0.0


def _distinct_shares(layers, shape: Shape | None, mode: str, flash: bool) -> dict[int, float]:
    """:func:`layer_churn` per distinct layer object (a model repeats its block objects)."""
    known: dict[int, float] = {}
    if mode == "none":
        return known
    for layer in layers:
        if id(layer) not in known:
            known[id(layer)] = layer_churn(layer, shape, mode, flash)
    return known


def layer_shares(layers, shape: Shape | None, mode: str, flash: bool) -> list[float]:
    """:func:`layer_churn` of each of ``layers`` in order, each distinct layer priced once."""
    known = _distinct_shares(layers, shape, mode, flash)
    return [known.get(id(layer), 0.0) for layer in layers]


def churn_share(layers: Iterable[Layer], shape: Shape | None, mode: str, flash: bool) -> float:
    """The largest :func:`layer_churn` of these layers: what a GPU holding any of them under
    ``mode`` is held to."""
    return max(_distinct_shares(layers, shape, mode, flash).values(), default=0.0)


def fragmentation(share):
    """Share of the allocator's reserved memory that holds no tensor, for a recompute whose
    churn is ``share`` of full recompute's (:func:`churn_share`; a scalar or an array; True /
    False read as 1 / 0)."""
    return constants.FRAGMENTATION + (
        constants.RECOMPUTE_FRAGMENTATION - constants.FRAGMENTATION) * np.asarray(
            share, dtype=float)
