"""Every layer of the model priced under one configuration: the shape a configuration runs its
layers at (TP and sequence parallelism, the CP share of the sequence and whether the CP group
leaves its NVLink domain, MoE's dispatch, the stack's dtypes) and cost/layer.py's cost of each
layer under it."""

from __future__ import annotations

from planner.core.parallel import Parallel
from planner.cost import moe, zero
from planner.cost.layer import LayerCost, layer_cost
from planner.cost.memory import Shape, sp_gathered_bytes
from planner.layout.ranks import blocks_cross
from planner.model.spec import ModelSpec
from planner.stack import Stack


def model_layer_costs(model: ModelSpec, par: Parallel, hw, opts: Stack, recompute: str,
                profile=None) -> list[LayerCost]:
    """The cost of every layer of the model under one parallel shape and recompute mode."""
    shape = Shape(tp=par.tp, sp=par.sequence_parallel, micro_batch=par.micro_batch,
                  seq_len=model.seq_length // par.cp, cp=par.cp, cp_cross=cp_crosses(par, hw),
                  recompute_modules=opts.recompute_modules, loss_bytes=opts.loss_bytes,
                  fp8_gathered=zero.fp8_gathered(par, opts),
                  accumulation_bytes=opts.accumulation_bytes(par.zero),
                  sp_gathered_bytes=sp_gathered_bytes(opts),
                  **moe.shape_fields(par, hw, opts))
    cache: dict = {}
    out = []
    for i, layer in enumerate(model.layers):
        measured = profile.layers[i] if profile is not None else None
        key = (layer, id(measured))
        if key not in cache:
            cache[key] = layer_cost(layer, shape, recompute, hw, opts, measured)
        out.append(cache[key])
    return out


def nvlink_domain(hw) -> int:
    """GPUs on one NVLink fabric for this hardware (Cluster.nvlink_domain, from the profile the
    cluster's node size was set on)."""
    domain = hw.nvlink_domain or hw.gpus_per_node
    return domain if domain % hw.gpus_per_node == 0 else hw.gpus_per_node


def cp_crosses(par: Parallel, hw) -> bool:
    """Whether a CP group leaves its NVLink domain (tp-cp order: each is tp·cp consecutive
    ranks), so its K/V exchange runs on the network."""
    return par.cp > 1 and blocks_cross(par.tp * par.cp, par.dp * par.pp, nvlink_domain(hw))
