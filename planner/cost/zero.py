"""ZeRO-3 / FSDP: each unit's weights gathered and its gradients reduce-scattered as the pass
reaches it, and what of those collectives the compute of the pass cannot hide.

A ZeRO-3 rank keeps 1/dp of every weight. Before a unit (one FSDP-wrapped block, or a whole
stage) runs it all-gathers the unit's 16-bit weights; after the unit's backward it
reduce-scatters the unit's gradients (Rajbhandari et al. 2020, ZeRO, §5.3, the parameter
partitioning P_os+g+p; Zhao et al. 2023, PyTorch FSDP, §3, one FlatParameter per wrapped unit).
With FULL_SHARD the weights are freed after the forward and gathered again for the backward. The stack's prefetch window (``zero3_prefetch``: FSDP's forward/backward
prefetch, FSDP2's implicit prefetch, DeepSpeed's stage3_prefetch_bucket_size) issues the next
unit's gather while the current unit computes, so one pass over u equal units is a two-stage
pipeline of collectives and compute:

    forward   gather(1) | gather(k+1) beside compute(k) | compute(u)
    backward  gather(1) | gather(k+1) + reduce-scatter(k-1) beside compute(k) | reduce-scatter(u)

Its length is  head + (u - 1)·max(c, x) + c + tail  with x the collectives each step runs and c
the compute of one unit: what is exposed is the first gather, the last reduce-scatter and, on
every step where the unit's compute is shorter than its collectives, the difference. Short
compute per unit (small micro-batches, many GPUs at a fixed batch) therefore leaves the step
bound by the collectives, each priced with its own latency (planner/cost/nccl.py), instead of
hiding one bulk transfer behind the whole pass. Without prefetch every gather is exposed; a
collective the stack does not overlap at all is exposed whole.

Units are taken as equal within a rank (the rank's parameters and compute divided by its unit
count); a rank's largest unit (an embedding or head wider than a block) is not singled out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class UnitTimes:
    """Per rank (arrays), for one microbatch: the number of units, and per unit the forward and
    backward compute, the all-gather of its weights for the forward and again for the backward
    (0 where the weights stay gathered) and the reduce-scatter of its gradients."""

    units: np.ndarray
    fwd_s: np.ndarray
    bwd_s: np.ndarray
    gather_s: np.ndarray
    bwd_gather_s: np.ndarray
    reduce_s: np.ndarray


def _pipelined(units, per_step_s, compute_s, head_s, tail_s):
    """Exposed seconds of a pass whose ``units`` steps each run ``per_step_s`` of collectives
    beside ``compute_s`` of compute, after a ``head_s`` nothing hides and before a ``tail_s``."""
    return head_s + tail_s + np.maximum(units - 1, 0) * np.maximum(0.0, per_step_s - compute_s)


def exposed_per_microbatch_s(t: UnitTimes, prefetch: int, overlap_gather: bool,
                             overlap_reduce: bool) -> tuple[np.ndarray, np.ndarray]:
    """(exposed, total) seconds of ZeRO-3 collectives in one microbatch's forward and backward,
    per rank. ``prefetch`` is the stack's window (0: each gather waits for its own unit);
    ``overlap_gather`` / ``overlap_reduce`` say whether the stack runs gathers / reduce-scatters
    beside compute at all. A rank with 0 units (the layering unknown: the search's lower bound)
    exposes nothing."""
    u = np.asarray(t.units, dtype=float)
    total = u * (t.gather_s + t.bwd_gather_s + t.reduce_s)
    hide_gather = overlap_gather and prefetch >= 1
    # forward: gathers only
    if hide_gather:
        fwd = _pipelined(u, t.gather_s, t.fwd_s, t.gather_s, 0.0)
    else:
        fwd = u * t.gather_s
    # backward: the next unit's gather and the previous unit's reduce-scatter share each step
    step = (t.bwd_gather_s if hide_gather else 0.0) + (t.reduce_s if overlap_reduce else 0.0)
    head = t.bwd_gather_s if hide_gather else 0.0
    tail = t.reduce_s if overlap_reduce else 0.0
    always = u * ((0.0 if hide_gather else t.bwd_gather_s) + (0.0 if overlap_reduce else t.reduce_s))
    bwd = always + _pipelined(u, step, t.bwd_s, head, tail)
    exposed = np.where(u > 0, fwd + bwd, 0.0)
    return np.minimum(exposed, total), total


# --- weights held for the whole step under pipeline parallelism, and FP8 all-gathers -----------
#
# torchtitan does not reshard a pipeline stage's FSDP2 units after the forward ("For PP, do not
# reshard after forward to avoid per-microbatch all-gathers, which can be expensive and
# non-overlapped", torchtitan parallelize_llama.py apply_fsdp), and torch.distributed.pipelining
# runs every backward of an FSDP stage with set_reshard_after_backward(False) and
# set_requires_gradient_sync(False), calling post_backward only once the last backward is done
# (torch/distributed/pipelining/stage.py backward_maybe_with_nosync). So the stage's weights are
# gathered once, in the first forward, and stay gathered; its gradients stay unsharded,
# accumulated in FSDP2's reduce dtype ("self.unsharded_accumulated_grad =
# unsharded_grad.to(self.reduce_dtype)", _fsdp_param.py), and are reduce-scattered once, after
# the last backward, with no compute left on the rank to hide them (the stack's
# ``zero3_pipeline_hold``).
#
# torchao's FP8 all-gather (the stack's ``fp8_all_gather``; torchtitan
# --float8.enable_fsdp_float8_all_gather: "cast Float8Linear.weight from high precision to
# float8 before FSDP all-gather so we can communicate in float8 to save bandwidth", torchtitan
# docs/float8.md) gathers a block's linear weights in 1 byte instead of 2; norms, embedding and
# output head (not Float8Linear) stay 16-bit. The forward GEMMs then read the gathered FP8
# weight: no forward weight cast (cost/precision.py). The cast it replaces runs on the shard
# before each gather (1/dp of the weight, read 4 bytes + write 1; with
# precompute_float8_dynamic_scale_for_fsdp the scales come from one amax pass per step): for the
# 70B torchtitan run (dp 32) about 3 GB a step, a millisecond against a 20 s step, not priced.

FP8_GATHER_BYTES = 1
GATHER_BYTES = 2  # 16-bit weights


def holds_for_step(par, opts) -> bool:
    """Whether ZeRO-3 keeps each stage's weights gathered and its gradients unsharded for the
    whole step (pipeline parallelism on a stack with ``zero3_pipeline_hold``)."""
    return par.zero >= 3 and par.pp > 1 and opts.zero3_pipeline_hold


def root_unit_held(par, opts) -> bool:
    """Whether ZeRO-3 keeps the layers outside the per-block units (embedding, final norm, head:
    the root unit of a stack with ``zero3_root_unit``) gathered through each step while the
    blocks are gathered one at a time. FSDP2 (fully_shard docstring, reshard_after_forward):
    "The root FSDP state has its value specially set to ``False`` as a heuristic since its
    parameters would typically be immediately all-gathered for backward", whatever the caller
    passes ('# For the root, do not reshard after forward ... self._fsdp_param_group.
    post_forward_mesh_info = None', FSDPState._lazy_init, torch 2.6), so they stay gathered
    from the root's pre-forward to its post-backward; torchtitan wraps each TransformerBlock and
    then the model ('fully_shard(transformer_block, ...)', 'fully_shard(model, ...)',
    parallelize_llama.py apply_fsdp). Where every unit is held for the step
    (:func:`holds_for_step`) the root is among them; with one DP x CP rank nothing is sharded."""
    return (par.zero >= 3 and par.dp * par.cp > 1 and opts.zero3_root_unit
            and opts.zero3_gather == "layer" and not holds_for_step(par, opts))


def fp8_gathered(par, opts) -> bool:
    """Whether ZeRO-3 all-gathers the blocks' FP8 linear weights in FP8."""
    return par.zero >= 3 and opts.precision == "fp8" and opts.fp8_all_gather


def layer_gather_bytes(layer, params: float, norms_on_gpu: float, fp8: bool) -> float:
    """Bytes one GPU's all-gather of ``layer`` returns, for its ``params`` parameters on this
    GPU of which ``norms_on_gpu`` are norm weights: 16-bit, or FP8 for a block's linear weights
    under FP8 all-gather (the norms stay 16-bit; cost/precision.py prices FP8 for blocks only)."""
    if not fp8 or layer.kind != "block":
        return GATHER_BYTES * params
    return FP8_GATHER_BYTES * (params - norms_on_gpu) + GATHER_BYTES * norms_on_gpu


def reduce_chain_s(units_per_chunk, reduce_s_per_chunk) -> float:
    """Seconds the reduce-scatters add to the drain of a step whose stages are held gathered
    (:func:`holds_for_step`) on an engine that reduces each stage's gradients inside its last
    backward, unit after unit, before sending the input gradient on (``zero3_reduce_chain``).
    torch.distributed.pipelining up to torch 2.6 runs, after a stage's last backward, every
    unit's post-backward in a loop ('if last_backward: # Manually call post backward for FSDP
    ... state._fsdp_param_group.post_backward()', stage.py backward_maybe_with_nosync), and
    each post-backward first makes the compute stream wait for the previous unit's
    reduce-scatter ('self.device_handle.current_stream().wait_event(self.comm_ctx.
    reduce_scatter_state.event)', _fsdp_param_group.py post_backward; torch 2.6.0); the input
    gradient's send is issued after the backward returns, on a stream that waits for the
    compute stream. So on each chunk the reduce-scatters of all its units but the last lie
    between its last backward and the next chunk's, and the last microbatch's backward passes
    every chunk in turn: the chunks after the first each add (units - 1) reduce-scatters to the
    step, and their last unit's runs beside the rest of the drain. Only the first chunk's own
    reduce-scatters end the step (:func:`step_exposed_s` with ``reduce_units``). Exact where
    each chunk's last backward waits for the one after it, as 1F1B's drain does; an upper bound
    where a rank still has other work then."""
    u = np.asarray(units_per_chunk, dtype=float)[1:]
    rs = np.asarray(reduce_s_per_chunk, dtype=float)[1:]
    return float((np.maximum(u - 1, 0.0) * rs).sum())


def step_exposed_s(t: UnitTimes, prefetch: int, overlap_gather: bool, reduce_units=None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(exposed, total) seconds of a step's ZeRO-3 collectives per rank when the weights are
    held for the step: one pass of gathers beside the first microbatch's forward (pipelined as
    :func:`exposed_per_microbatch_s` prices a forward) and every unit's reduce-scatter after
    the last backward, exposed whole, or only ``reduce_units`` of them per rank where the rest
    run inside the drain (:func:`reduce_chain_s`). ``bwd_gather_s`` is not read: nothing is
    gathered again."""
    u = np.asarray(t.units, dtype=float)
    total = u * (t.gather_s + t.reduce_s)
    if overlap_gather and prefetch >= 1:
        fwd = _pipelined(u, t.gather_s, t.fwd_s, t.gather_s, 0.0)
    else:
        fwd = u * t.gather_s
    reduced = u if reduce_units is None else np.asarray(reduce_units, dtype=float)
    exposed = np.where(u > 0, fwd + reduced * t.reduce_s, 0.0)
    return np.minimum(exposed, total), total
