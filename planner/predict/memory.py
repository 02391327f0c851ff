"""What a GPU holds for one configuration and split: model states, kept stage outputs, gathered
ZeRO-3 weights, logits, and their sum per rank: the one memory formula the screen, the
partitioner, --explain and validation share."""

from __future__ import annotations

import numpy as np

from planner.core.parallel import Parallel
from planner.cost import constants, precision, side_streams, zero
from planner.cost.fragmentation import churn_share, fragmentation, layer_shares
from planner.cost.memory import (ACT_BYTES, Shape, model_state_parts, sharded_params,
                                 sp_gathered_bytes)
from planner.model.spec import ModelSpec
from planner.predict.chunks import ChunkArrays
from planner.stack import Stack


def state_parts(params, par: Parallel, opts: Stack, expert_params=0.0) -> tuple:
    """(weights, gradients, optimizer) bytes of ``params`` parameters (scalar or array) under
    this configuration's ZeRO stage and the stack's gradient, weight and optimizer copies. The
    ``expert_params`` among them are sharded over the expert-data-parallel group instead of the
    DP x CP ranks (Megatron-Core's distributed optimizer keeps expert parameters in their own
    buffers over the expert data-parallel group: tp·cp·dp / (etp·ep) ranks)."""
    # ZeRO / the distributed optimizer shards over the DP x CP ranks (Megatron's
    # data-parallel group with context parallelism: parallel_state, with_context_parallel=True)
    args = (opts.held_grad_bytes(par.zero), opts.held_weight_bytes(par.zero),
            opts.optimizer_state_bytes, opts.zero2_shards_grads())
    dense = model_state_parts(params - expert_params, par.dp * par.cp, par.zero, *args)
    experts = model_state_parts(expert_params, par.expert_dp, par.zero, *args)
    return tuple(d + e for d, e in zip(dense, experts))


def state_bytes(params, par: Parallel, opts: Stack, expert_params=0.0):
    """Model-state bytes of ``params`` parameters: the sum of :func:`state_parts`."""
    return sum(state_parts(params, par, opts, expert_params))


def stage_output_bytes(model: ModelSpec, par: Parallel) -> float:
    """One microbatch's output of a chunk (16-bit hidden states; sharded with SP)."""
    return ACT_BYTES * par.micro_batch * model.seq_length / par.cp * model.hidden_size / (
        par.tp if par.sequence_parallel else 1)


def kept_outputs(model: ModelSpec, par: Parallel, inflight: np.ndarray, opts: Stack) -> np.ndarray:
    """Per chunk: what the pipeline engine holds beyond the layers' activations. The stage
    outputs of an engine that keeps them (each in-flight microbatch's output of every chunk but
    the last), and the receive buffers of an engine that allocates one per microbatch of the
    step (p2p_buffers_per_microbatch): the output gradients of every chunk but the last, and
    the inputs of every chunk but the first, less the in-flight inputs, which are the buffers
    the chunk's first layer keeps (counted in its activations)."""
    out = np.zeros(par.num_chunks)
    one = stage_output_bytes(model, par)
    if opts.keep_stage_outputs:
        out[:-1] = inflight[:-1] * one
    if opts.p2p_buffers_per_microbatch and par.num_chunks > 1:
        m = par.num_microbatches
        out[:-1] += m * one  # output-gradient receive buffers
        out[1:] += np.maximum(m - inflight[1:], 0.0) * one  # input buffers not in flight
    return out


def gathered_bytes(model: ModelSpec, par: Parallel, opts: Stack, rank_params) -> np.ndarray:
    """Per rank: weights ZeRO-3 holds unsharded at once for a moment (a transient). Gathering a
    layer at a time, the running layer and the ``zero3_prefetch`` next (PyTorch FSDP
    ``limit_all_gathers``; FSDP2 and DeepSpeed ZeRO-3 prefetch one unit ahead likewise): the
    model's largest gathered layer counts 1 + prefetch times, in 16-bit or, for FP8 linear
    weights under FP8 all-gather, FP8 (cost/zero.py). Gathering a whole stage: the rank's
    parameters in 16-bit. Weights held for the whole step are no transient: :func:`held_bytes`."""
    rank_params = np.asarray(rank_params, dtype=float)
    if par.zero < 3 or zero.holds_for_step(par, opts):
        return np.zeros_like(rank_params)
    if opts.zero3_gather == "stage":
        return rank_params * ACT_BYTES
    per_layer = layer_gather_bytes(model, par, opts)
    if zero.root_unit_held(par, opts):  # the root's layers are held, not gathered in turn
        per_layer = per_layer[_blocks(model)]
    return np.full_like(rank_params, (1 + opts.zero3_prefetch) * float(per_layer.max()))


def _blocks(model: ModelSpec) -> np.ndarray:
    """Mask of the model's transformer blocks among its layers."""
    return np.array([layer.kind == "block" for layer in model.layers])


def root_gather_bytes(model: ModelSpec, par: Parallel, opts: Stack) -> np.ndarray:
    """Per layer: the gathered weights ZeRO-3's root unit holds through the step (the layers
    outside the blocks, where the stack wraps them so: cost/zero.py root_unit_held); zeros
    otherwise."""
    if not zero.root_unit_held(par, opts):
        return np.zeros(len(model.layers))
    out = layer_gather_bytes(model, par, opts) * ~_blocks(model)
    if model.tie_embeddings and par.num_chunks == 1:  # one tied weight, gathered once
        out[-1] -= zero.GATHER_BYTES * model.padded_vocab_size(par.tp) * model.hidden_size / par.tp
    return out


_GATHER: dict = {}  # (id(model), tp, ep, etp, fp8) -> (model, per-layer bytes)


def layer_gather_bytes(model: ModelSpec, par: Parallel, opts: Stack) -> np.ndarray:
    """Per layer: the bytes one GPU's ZeRO-3 all-gather of it returns (cost/zero.py), asked
    once per configuration."""
    fp8 = zero.fp8_gathered(par, opts)
    key = (id(model), par.tp, par.ep, par.expert_tp, fp8)
    held = _GATHER.get(key)
    if held is None or held[0] is not model:
        if len(_GATHER) >= 64:
            _GATHER.clear()
        held = _GATHER[key] = (model, np.array([
            zero.layer_gather_bytes(layer, sharded_params(layer, par.tp, par.ep, par.expert_tp),
                                    layer.norm_params if layer.kind == "block" else 0.0, fp8)
            for layer in model.layers]))
    return held[1]


def chunk_gather_bytes(model: ModelSpec | None, par: Parallel, opts: Stack,
                       stages: ChunkArrays) -> np.ndarray:
    """Per chunk: the bytes one GPU's all-gathers of all its layers return. A chunk of no known
    layers (the search's ideal chunk), or no ``model``, counts its parameters at the least
    bytes a parameter is gathered in (a lower bound)."""
    least = zero.FP8_GATHER_BYTES if zero.fp8_gathered(par, opts) else zero.GATHER_BYTES
    if model is None:
        return least * stages.params
    known = stages.last > stages.first
    return np.where(known, _chunk_sums(layer_gather_bytes(model, par, opts), stages),
                    least * stages.params)


def held_bytes(model: ModelSpec, par: Parallel, opts: Stack, stages: ChunkArrays
               ) -> tuple[np.ndarray, np.ndarray]:
    """Per chunk: (gathered weights, gradients beyond the sharded ones state_parts counts) that
    ZeRO-3 holds for the whole step where the stack keeps a pipeline stage gathered (cost/zero.py
    holds_for_step); otherwise the root unit's gathered layers where it is held
    (:func:`root_gather_bytes`) and no gradients. Only parameters sharded over more than one
    rank are gathered: dense ones over the DP x CP ranks, experts over the expert-DP group. Their
    gradients stay unsharded in the reduce dtype until the last backward; the sharded gradient
    exists only after it (torchtitan zeroes gradients, set to None, before each step), so the
    unsharded one replaces it: params x bytes x (1 - 1/n) more than state_parts' shard."""
    n = len(stages.first)
    if not zero.holds_for_step(par, opts):
        return _chunk_sums(root_gather_bytes(model, par, opts), stages), np.zeros(n)
    experts = stages.expert_params
    dense = stages.params - experts
    groups = ((dense, par.dp * par.cp), (experts, par.expert_dp))
    sharded = sum(p for p, ranks in groups if ranks > 1)
    share = np.where(stages.params > 0, sharded / np.maximum(stages.params, 1.0), 0.0)
    grads = opts.reduced_grad_bytes(par.zero) * sum(p * (1 - 1 / ranks) for p, ranks in groups)
    return chunk_gather_bytes(model, par, opts, stages) * share, grads


def _chunk_sums(per_layer: np.ndarray, stages: ChunkArrays) -> np.ndarray:
    """Per chunk: the sum of ``per_layer`` over its layers (0 for a chunk of no known layers)."""
    cum = np.concatenate([[0.0], np.cumsum(per_layer)])
    first, last = stages.first.astype(int), stages.last.astype(int)
    return np.where(last > first, cum[last] - cum[first], 0.0)


def logit_bytes(model: ModelSpec, par: Parallel, stages: ChunkArrays,
                loss_bytes: int = 4) -> np.ndarray:
    """Per chunk: the log-probabilities one microbatch keeps for the loss (the chunk with the
    head), ``loss_bytes`` each: 4 (fp32), or the stack's loss_bytes."""
    out = np.zeros(len(stages.first))
    head = model.layers[-1]
    if head.kind == "head":  # the main loss's and each MTP module's (cost/mtp.py)
        out[stages.last == len(model.layers)] = (
            (1 + head.mtp_depth) * loss_bytes * par.micro_batch * model.seq_length / par.cp
            * head.padded_vocab(par.tp) / par.tp)
    return out


MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "logits", "transient",
                "fragmentation", "reserved")


def memory_parts(model: ModelSpec, par: Parallel, stages: ChunkArrays, inflight: np.ndarray,
                 opts: Stack, held_activations=None) -> dict[str, np.ndarray]:
    """Peak bytes per pipeline rank, by part (MEMORY_PARTS), conservative: model states +
    held activations (the closed-form in-flight counts, or the simulated peak when given; kept
    stage outputs included) of which the fp32 logits are shown apart + the largest transient
    (a layer's backward working set, ZeRO-3's gathered weights), plus the allocator's
    fragmentation (more on ranks that recompute) and the framework's reserve."""
    p = par.pp
    weights, grads, optim = (stages.by_rank(x, p) for x in state_parts(stages.params, par, opts,
                                                                        stages.expert_params))
    # FP8 weight copies, if cached; FP8 primary weights replace their 16-bit copy
    weights = weights + stages.by_rank(
        precision.held_fp8_bytes(stages.cached_bytes, par.zero, opts), p)
    held_w, held_g = held_bytes(model, par, opts, stages)  # ZeRO-3 under PP, where held
    weights, grads = weights + stages.by_rank(held_w, p), grads + stages.by_rank(held_g, p)
    if model.tie_embeddings and par.num_chunks == 1:  # one copy of the tied weight, not two
        tied = model.padded_vocab_size(par.tp) * model.hidden_size / par.tp
        tw, tg, to = state_parts(tied, par, opts)
        weights, grads, optim = weights - tw, grads - tg, optim - to
    head = model.layers[-1]
    if head.kind == "head" and head.mtp_copies_embedding:
        # the MTP modules' embedding copy is the embedding itself on a rank holding both
        # (one stage, or DualPipe's rank 0 and p - 1): DeepSeek-V3 report sec. 3.2.3, "we
        # deploy the shallowest layers (including the embedding layer) and deepest layers
        # (including the output head) of the model on the same PP rank. This arrangement
        # enables the physical sharing of parameters and gradients"
        n = len(model.layers)
        both = ((stages.by_rank((stages.first == 0).astype(float), p) > 0)
                & (stages.by_rank((stages.last == n).astype(float), p) > 0))
        copy = model.padded_vocab_size(par.tp) * model.hidden_size / par.tp
        cw, cg, co = state_parts(copy, par, opts)
        weights, grads, optim = weights - both * cw, grads - both * cg, optim - both * co
    if held_activations is None:
        acts = stages.by_rank(inflight * stages.act_bytes, p)
    else:
        acts = np.asarray(held_activations, dtype=float)
    acts = acts + stages.by_rank(kept_outputs(model, par, inflight, opts), p)
    logits = np.minimum(stages.by_rank(inflight * logit_bytes(model, par, stages, opts.loss_bytes), p), acts)
    transient = stages.rank_max(stages.work_bytes, p) + gathered_bytes(
        model, par, opts, stages.by_rank(stages.params, p))
    held = weights + grads + optim + acts + transient
    # a rank is held to the largest churn of its chunks' recompute modes (cost/fragmentation.py)
    frag = fragmentation(stages.rank_max(chunk_churn(model, par, opts, stages), p))
    return {"weights": weights, "gradients": grads, "optimizer": optim,
            "activations": acts - logits, "logits": logits, "transient": transient,
            "fragmentation": held * frag / (1 - frag),
            "reserved": np.full(p, float(constants.RESERVED_BYTES))}


def side_stream_bytes(model: ModelSpec, par: Parallel, opts: Stack,
                      stages: ChunkArrays) -> np.ndarray:
    """Per rank: what ZeRO-3's side streams keep reserved beside the peak and release when an
    allocation fails (cost/side_streams.py): not in memory_parts, which is what must fit."""
    p = par.pp
    if par.zero < 3 or not opts.zero3_side_streams:
        return np.zeros(p)
    idle = np.zeros(p)
    if zero.holds_for_step(par, opts):  # the sharded gradients, freed until the last backward
        idle = stages.by_rank(state_parts(stages.params, par, opts, stages.expert_params)[1], p)
    largest = float(layer_gather_bytes(model, par, opts).max())
    return side_streams.side_stream_bytes(largest, opts.zero3_prefetch, idle)


def _churn_shape(model: ModelSpec, par: Parallel, opts: Stack) -> Shape:
    """The layer shape predict/layer_costs.py prices layers with, less its timing fields: only the
    tensors a block keeps decide its recompute churn, so no hardware is needed."""
    return Shape(tp=par.tp, sp=par.sequence_parallel, micro_batch=par.micro_batch,
                 seq_len=model.seq_length // par.cp, cp=par.cp,
                 recompute_modules=opts.recompute_modules, loss_bytes=opts.loss_bytes,
                 sp_gathered_bytes=sp_gathered_bytes(opts), ep=par.ep, etp=par.expert_tp,
                 moe_probs_in_activation=opts.moe_probs_in_activation)


def recompute_churn(model: ModelSpec, par: Parallel, opts: Stack, modes) -> dict[str, float]:
    """Per recompute mode in ``modes``: the largest share of full recompute's free-and-rebuild
    churn it has on any layer of the model (cost/fragmentation.py churn_share), which sets the
    allocator fragmentation a chunk under it may need, whatever layers it holds."""
    shape = _churn_shape(model, par, opts) if set(modes) - {"none", "full"} else None
    return {m: churn_share(model.layers, shape, m, opts.flash_attention) for m in set(modes)}


def chunk_churn(model: ModelSpec, par: Parallel, opts: Stack, stages: ChunkArrays) -> np.ndarray:
    """Per chunk: the largest churn share of its layers under its recompute mode
    (cost/fragmentation.py); a chunk of no known layers (the search's ideal chunk) takes the
    model's largest under its mode."""
    out = np.zeros(len(stages.first))
    modes = set(stages.recompute) - {"none"}
    if not modes:
        return out
    # only a selective mode reads the layer shape (full and none are 1 and 0 per block)
    shape = _churn_shape(model, par, opts) if modes - {"full"} else None
    per_layer = {m: layer_shares(model.layers, shape, m, opts.flash_attention) for m in modes}
    for i, (a, b, mode) in enumerate(zip(stages.first.astype(int), stages.last.astype(int),
                                         stages.recompute)):
        if mode != "none":
            out[i] = max(per_layer[mode][a:b] if b > a else per_layer[mode])
    return out
