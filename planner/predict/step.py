"""Predict one configuration: per-stage time and memory, step time, throughput, MFU.

A training step on pipeline rank i is the schedule over its microbatches (predict/
pipeline_schedule.py) plus what the schedule cannot hide: the data-parallel gradient
synchronisation (predict/data_parallel.py: partly overlapped with the last backward when the run
overlaps it), a tied embedding's gradient all-reduce between the first and last stage, and the
optimizer step. Memory is predict/memory.py's formula over the same split.

Everything per stage is a numpy array over the chunks of one split, so a prediction costs a few
array operations whatever the pipeline depth: the search screens thousands of configurations
with the same code that evaluates one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.core.parallel import Parallel
from planner.cost import constants, moe, precision, tied_embedding
from planner.cost.precision import step_cast_bytes
from planner.hardware.profiles import Cluster
from planner.model.spec import ModelSpec
from planner.predict.chunks import (ChunkArrays, CostTable, block_counts_of, even_block_bounds,
                                    mirrored, split_stages)
from planner.predict.data_parallel import dp_exposed_s
from planner.predict.layer_costs import model_layer_costs
from planner.predict.memory import memory_parts, side_stream_bytes, state_bytes
from planner.predict.pipeline_schedule import inflight_counts, pipeline_time
from planner.predict.plan import Metrics, Plan, Stage
from planner.stack import Stack, default_stack

# Adam step per parameter shard: read fp32 master, m, v and the fp32 gradient (16 B), write master,
# m, v (12 B) and the 16-bit weight (2 B): 30 bytes, memory-bound (Megatron's fused Adam).
OPTIMIZER_BYTES_PER_PARAM = 30


@dataclass(frozen=True)
class Prediction:
    """What a configuration costs, before it is dressed as a Plan."""

    step_s: float
    bubble: float
    rank_memory_bytes: np.ndarray
    chunk_memory_bytes: np.ndarray
    model_flops: float  # the whole step, all GPUs
    hardware_flops: float
    transfer_s: np.ndarray  # per chunk: its output to the next chunk (0 for the last)
    # of step_s: the pipeline's fill, steady state and drain (no DP sync, no optimizer step)
    pipeline_s: float = 0.0
    # per pipeline rank, by part (memory.py MEMORY_PARTS); the parts sum to rank_memory_bytes
    memory_parts: dict | None = None
    # per pipeline rank: reserved on ZeRO-3's side streams beyond rank_memory_bytes, released
    # when an allocation fails (predict/memory.py side_stream_bytes)
    side_stream_bytes: np.ndarray | None = None

    @property
    def peak_memory_bytes(self) -> float:
        """The largest rank's peak: what must fit."""
        return float(self.rank_memory_bytes.max())

    @property
    def peak_reserved_bytes(self) -> float:
        """The largest rank's peak as the allocator reserves it (and nvidia-smi shows it): with
        what the side streams keep."""
        side = 0.0 if self.side_stream_bytes is None else self.side_stream_bytes
        return float((self.rank_memory_bytes + side).max())


def predict(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
            stages: ChunkArrays, simulated: bool = False, sim_cache: dict | None = None) -> Prediction:
    """Step time, bubble and memory of a configuration with the given split. With ``simulated``
    the schedule runs op by op (pipeline/simulate.py): step time, bubble and the activations each
    rank holds come from the simulation instead of the closed forms."""
    hw, p = cluster.hardware, par.pp
    if par.schedule_traits.mirrored:  # rank r also holds stage p - 1 - r: every per-rank sum
        stages = mirrored(stages)  # counts both (pipeline/dualpipe.py)
    pipe = pipeline_time(model, cluster, par, opts, stages, simulated, sim_cache)
    inflight = np.array(inflight_counts(par.schedule, p, par.num_microbatches,
                                        par.virtual_stages), dtype=float)
    states = state_bytes(stages.params, par, opts, stages.expert_params) + \
        precision.held_fp8_bytes(stages.cached_bytes, par.zero, opts)
    chunk_mem = states + inflight * stages.act_bytes
    parts = memory_parts(model, par, stages, inflight, opts, pipe.held_activation_bytes)
    rank_mem = sum(parts.values())
    # a tied embedding's gradient all-reduce follows the drain on the first and last rank
    # (cost/tied_embedding.py)
    tied = np.zeros(p)
    tied[[0, -1]] = tied_embedding.sync_s(model, par, cluster, opts)
    dp_exposed = float((dp_exposed_s(par, cluster, opts, stages, model) + tied).max())
    # Each rank steps its shard: dense parameters over the DP x CP ranks, experts over expert DP
    # (state_parts).
    owned = (stages.by_rank(stages.params - stages.expert_params, p)
             / (par.dp * par.cp if par.zero >= 1 else 1)
             + stages.by_rank(stages.expert_params, p)
             / (par.expert_dp if par.zero >= 1 else 1)).max()
    # with cached FP8 weights, the step also recasts them once (cost/precision.py)
    step_bytes = owned * OPTIMIZER_BYTES_PER_PARAM + step_cast_bytes(
        float(stages.by_rank(stages.cached_bytes, p).max()), opts)
    optimizer_s = step_bytes / (
        hw.memory_bandwidth_gbps * 1e9 * (hw.memory_efficiency or constants.MEMORY_EFFICIENCY))
    replicas = par.tp * par.cp * par.dp * par.num_microbatches  # per-GPU FLOPs -> whole step
    return Prediction(step_s=float(pipe.pipeline_s + dp_exposed + optimizer_s),
                      bubble=float(pipe.bubble),
                      rank_memory_bytes=rank_mem, chunk_memory_bytes=chunk_mem,
                      model_flops=float(stages.model_flops.sum()) * replicas,
                      hardware_flops=float(stages.hardware_flops.sum()) * replicas,
                      transfer_s=pipe.transfer_s, memory_parts=parts,
                      pipeline_s=float(pipe.pipeline_s),
                      side_stream_bytes=side_stream_bytes(model, par, opts, stages))


def metrics_of(model: ModelSpec, cluster: Cluster, par: Parallel, pred: Prediction,
               peak_flops: float | None = None) -> Metrics:
    """Step metrics; MFU and HFU against ``peak_flops`` when given (a profile's measured peak:
    its times come from that device, so the cluster GPU's datasheet peak would read ~0%)."""
    gpus, peak = cluster.gpus, peak_flops or cluster.hardware.peak_flops
    step = pred.step_s
    return Metrics(step_time_s=step,
                   tokens_per_s=par.global_batch * model.seq_length / step,
                   tflops_per_gpu=pred.model_flops / step / gpus / 1e12,
                   mfu=pred.model_flops / (step * gpus * peak),
                   hfu=pred.hardware_flops / (step * gpus * peak),
                   bubble_fraction=pred.bubble, peak_memory_bytes=pred.peak_memory_bytes)


def evaluate(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack | None = None,
             bounds: list[tuple[int, int]] | None = None, recompute_per_chunk=None,
             profile=None, tables: dict[str, CostTable] | None = None,
             simulated: bool = False, sim_cache: dict | None = None,
             recompute_layers=None) -> Plan:
    """Predict the plan of one fully specified configuration (even split unless ``bounds``)
    on the stack ``opts`` (default: the default stack).

    ``tables`` are the layer costs per recompute mode when the caller already has them.
    ``recompute_layers``: per chunk None, or N: only its first N blocks recomputed (Megatron's
    block method, predict/chunks.py partial_segments)."""
    return predict_plan(model, cluster, par, opts, bounds, recompute_per_chunk, profile, tables,
                        simulated, sim_cache, recompute_layers)[0]


def predict_plan(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack | None = None,
                 bounds: list[tuple[int, int]] | None = None, recompute_per_chunk=None,
                 profile=None, tables: dict[str, CostTable] | None = None,
                 simulated: bool = False, sim_cache: dict | None = None,
                 recompute_layers=None) -> tuple[Plan, Prediction]:
    """:func:`evaluate`, and the Prediction it dressed (per-rank memory parts)."""
    opts = opts or default_stack()
    bounds = bounds or even_block_bounds(model, par.num_chunks)
    modes = recompute_per_chunk or [par.recompute] * par.num_chunks
    modes, counts = block_counts_of(model, bounds, modes, recompute_layers)
    needed = set(modes) | ({"none"} if any(n is not None for n in counts) else set())
    by_mode = dict(tables or {})
    for mode in needed - set(by_mode):
        by_mode[mode] = CostTable(model_layer_costs(model, par, cluster.hardware, opts, mode,
                                                    profile))
    stages = split_stages(by_mode, bounds, modes, counts,
                          [layer.kind == "block" for layer in model.layers])
    pred = predict(model, cluster, par, opts, stages, simulated, sim_cache)
    plan_stages = tuple(
        Stage(stage=k, rank=k % par.pp, first=int(stages.first[k]), last=int(stages.last[k]),
              recompute=stages.recompute[k], time_s=float(stages.time_s[k]),
              memory_bytes=float(pred.chunk_memory_bytes[k]), fwd_s=float(stages.fwd_s[k]),
              bwd_s=float(stages.bwd_s[k]), wgrad_s=float(stages.bwd_weight_s[k]),
              send_s=float(pred.transfer_s[k]), a2a_s=float(stages.a2a_s[k]),
              recompute_layers=counts[k])
        for k in range(par.num_chunks))
    plan = Plan(model=model, cluster=cluster, parallel=par, stages=plan_stages,
                metrics=metrics_of(model, cluster, par, pred,
                                   getattr(profile, "peak_flops", None)),
                rank_memory_bytes=tuple(float(x) for x in pred.rank_memory_bytes),
                memory_parts=tuple((part, tuple(float(x) for x in bytes_))
                                   for part, bytes_ in pred.memory_parts.items()),
                notes=_notes(opts) + moe.notes(model, par, opts), stack=opts)
    return plan, pred


def _notes(opts: Stack) -> tuple[str, ...]:
    """The footer: the stack the plan was priced on, and what that means for the big terms."""
    kernel = "" if opts.attention_kernel == "flash2" else f", {opts.attention_kernel} kernel"
    attention = f"flash attention (scores not stored{kernel})" if opts.flash_attention else \
        "unfused attention"
    grads = opts.grad_dtype
    if opts.param_dtype == "bf16" and opts.grad_dtype != "fp32" and \
            opts.fp32_grad_accumulation_zero:
        stages = ",".join(str(z) for z in opts.fp32_grad_accumulation_zero)
        grads += f" (+fp32 accumulation at ZeRO {stages})"
    dp = " + ".join(k for k, on in (("grad reduce", opts.overlap_grad_reduce),
                                    ("param gather", opts.overlap_param_gather)) if on) or "off"
    fp8 = f", FP8 block GEMMs ({opts.fp8_recipe} scaling)" if opts.precision == "fp8" else ""
    return (f"stack: {opts.label()} (`plan stacks`; --stack NAME|FILE to change)",
            f"assumes {attention}, DP overlap {dp}, TP overlap "
            f"{'on' if opts.tp_comm_overlap else 'off'}, {grads} gradients{fp8}")
