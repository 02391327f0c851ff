"""What a GPU holds for one configuration and split: model states, kept stage outputs, gathered
ZeRO-3 weights, logits, and their sum per rank: the one memory formula the screen, the
partitioner, --explain and validation share."""

from __future__ import annotations

import numpy as np

from planner.core.parallel import Parallel
from planner.cost import constants
from planner.cost.memory import (ACT_BYTES, fragmentation, model_state_parts,
                                 sharded_params)
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
    """Per chunk: the stage outputs a pipeline engine that keeps them holds (each in-flight
    microbatch's output of every chunk but the last); zeros for an engine that frees them."""
    out = np.zeros(par.num_chunks)
    if opts.keep_stage_outputs:
        out[:-1] = inflight[:-1] * stage_output_bytes(model, par)
    return out


def gathered_bytes(model: ModelSpec, par: Parallel, opts: Stack, rank_params) -> np.ndarray:
    """Per rank: 16-bit weights ZeRO-3 holds unsharded at once. Gathering a layer at a time,
    the running layer and the ``zero3_prefetch`` next (PyTorch FSDP ``limit_all_gathers``; FSDP2
    and DeepSpeed ZeRO-3 prefetch one unit ahead likewise): the model's largest layer counts
    1 + prefetch times. Gathering a whole stage: the rank's parameters."""
    rank_params = np.asarray(rank_params, dtype=float)
    if par.zero < 3:
        return np.zeros_like(rank_params)
    if opts.zero3_gather == "stage":
        return rank_params * ACT_BYTES
    largest = largest_layer_params(model, par.tp, par.ep, par.expert_tp)
    return np.full_like(rank_params, (1 + opts.zero3_prefetch) * largest * ACT_BYTES)


_LARGEST: dict = {}  # (id(model), tp, ep, etp) -> (model, value): asked once per configuration


def largest_layer_params(model: ModelSpec, tp: int, ep: int, etp: int) -> float:
    """The parameters the model's largest layer puts on one GPU (sharded_params)."""
    key = (id(model), tp, ep, etp)
    held = _LARGEST.get(key)
    if held is None or held[0] is not model:
        if len(_LARGEST) >= 64:
            _LARGEST.clear()
        held = _LARGEST[key] = (
            model, max(sharded_params(layer, tp, ep, etp) for layer in model.layers))
    return held[1]


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
    weights = weights + stages.by_rank(stages.cached_bytes, p)  # FP8 weight copies, if cached
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
    recomputes = stages.by_rank(np.array([m != "none" for m in stages.recompute]), p) > 0
    frag = np.where(recomputes, fragmentation(True), fragmentation(False))
    return {"weights": weights, "gradients": grads, "optimizer": optim,
            "activations": acts - logits, "logits": logits, "transient": transient,
            "fragmentation": held * frag / (1 - frag),
            "reserved": np.full(p, float(constants.RESERVED_BYTES))}
