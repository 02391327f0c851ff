"""The software stack a plan runs on: every run option the cost and memory models read.

A stack is one named, versioned set of choices that the training framework makes and the
parallel configuration does not: the attention kernel, the gradient dtype, whether DP and TP
traffic overlaps compute, how ZeRO and the pipeline engine behave, which schedules exist. The
bundled stacks (profiles/stacks/*.json) give a source for each value; planner/stack/profiles.py
loads and validates them. Nothing else in the planner chooses these options: the search,
``--explain``, ``plan validate`` and the exporters all read them from the plan's Stack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from planner.core import schema
from planner.core.errors import PlanInputError
from planner.core.parallel import RECOMPUTE_MODULES, SCHEDULES
import planner.stack.userbuffers as userbuffers

# the flash attention kernels a stack may name (their times: planner/cost/attention_kernel.py)
ATTENTION_KERNELS = ("flash2", "flash_triton")
# bytes per element of each dtype a stack names
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
ACTIVATION_BYTES = 2  # 16-bit weights and activations (both param dtypes are 2 bytes)


@dataclass(frozen=True)
class Stack:
    """One training stack. Field comments say what the cost or memory model does with each."""

    name: str
    version: str
    description: str
    # the launcher (planner/export) that runs this stack; exports for another are refused
    launcher: str | None
    # "flash": scores never stored, causal half executed; "unfused": s x s scores kept
    attention: str
    # the flash kernel that runs the attention (scores, softmax, values) when attention is
    # "flash": "flash2" (FlashAttention-2, the rate the hardware profiles' attention_efficiency
    # describes) or "flash_triton" (FlashAttention in Triton, FlashAttention-1's algorithm:
    # llm-foundry's attn_impl triton); its time over FlashAttention-2's, forward and backward
    # apart, is in planner/cost/attention_kernel.py. Not read for unfused attention.
    attention_kernel: str
    # 16-bit training dtype of weights and activations (exports: --bf16 / --fp16)
    param_dtype: str
    # gradients held for the optimizer and reduced over DP: fp32 (Megatron main_grad) or 16-bit
    grad_dtype: str
    # ZeRO stages at which a 16-bit-gradient stack also keeps an fp32 accumulation buffer
    # (DeepSpeed's BF16_Optimizer); reduced in fp32 there. Ignored unless param_dtype is bf16.
    fp32_grad_accumulation_zero: tuple[int, ...]
    # optimizer state bytes per parameter (Adam: fp32 master, m and v = 12)
    optimizer_state_bytes: float
    # ZeRO-3 keeps only the fp32 shard (FSDP), no 16-bit copy beside it
    fp32_shards: bool
    # DP gradient reduce hidden behind the backward / parameter all-gather behind the forward
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    # TP collectives hidden inside the GEMMs (Megatron --tp-comm-overlap, torchtitan AsyncTP)
    tp_comm_overlap: bool
    # the share of the TP collectives' time that overlap hides, when on (1: all of it); read
    # only when tp_overlap_ub is None (an engine measured as a whole: torchtitan's AsyncTP)
    tp_overlap_hidden: float
    # Transformer Engine's userbuffer settings per GEMM (planner/stack/userbuffers.py: method,
    # num_splits, num_sm, set_sm_margin, TE's defaults filled in); when set, what overlap hides
    # and costs is priced per collective from them (planner/cost/tp_overlap.py)
    tp_overlap_ub: tuple[tuple[str, str, int, int, bool], ...] | None
    # ZeRO-2 reduce-scatter: after every "microbatch" (only a gradient shard kept), or once per
    # "step" (full gradients kept until the step, so no gradient memory is saved)
    zero2_reduce_scatter: str
    # ZeRO-1 gradient collective: "reduce_scatter" (each rank receives only the shard it steps:
    # Megatron's distributed optimizer) or "all_reduce" (every rank receives the whole gradient
    # and steps its shard: DeepSpeed's BF16_Optimizer, twice the bytes); either way the updated
    # 16-bit weights are all-gathered after the step
    zero1_grad_reduce: str
    # ZeRO-3 all-gather unit: one "layer" at a time (FSDP per-block wrapping) or a whole "stage"
    zero3_gather: str
    # ZeRO-3 units gathered ahead of the one running (FSDP / ZeRO-3 prefetch): 1 + this are
    # unsharded at once
    zero3_prefetch: int
    # under pipeline parallelism, each stage's ZeRO-3 weights stay gathered and its gradients
    # unsharded (accumulated in the reduce dtype) from the first forward to the last backward:
    # one gather and one reduce-scatter per step, both held in memory (planner/cost/zero.py)
    zero3_pipeline_hold: bool
    # ZeRO-3 allocates its all-gather outputs and its reduce-scatter outputs (the sharded
    # gradients) on side streams, whose freed memory the caching allocator keeps for them:
    # reserved beside the compute stream's peak, released only when an allocation fails
    # (FSDP2; planner/cost/side_streams.py); false: in buffers of its own or on the compute stream
    zero3_side_streams: bool
    # ZeRO-3 wraps the layers outside the blocks (embedding, final norm, head) as one root unit,
    # gathered through the whole step while blocks are gathered one at a time (FSDP's root;
    # planner/cost/zero.py root_unit_held); false: they are gathered as any layer is
    zero3_root_unit: bool
    # held for the step under PP, a stage's gradients are reduce-scattered inside its last
    # backward, unit after unit, before its input gradient is sent on (torch.distributed.
    # pipelining up to torch 2.6; planner/cost/zero.py reduce_chain_s); false: after it
    zero3_reduce_chain: bool
    # Megatron's scatter/gather of stage outputs over TP ranks (Narayanan et al. 2021 §4.1)
    p2p_scatter_gather: bool
    # with sequence parallelism the column-parallel linears keep their all-gathered input for
    # the backward (DTensor TP: torchtitan), in FP8 where the block runs FP8; false: the SP
    # shard is kept and gathered again in the backward (Megatron) (planner/cost/memory.py)
    sp_keeps_gathered: bool
    # the pipeline engine runs each send and receive as a blocking call between its compute
    # ops, so a transfer occupies both ranks instead of overlapping their compute
    # (planner/pipeline/blocking.py); False: a transfer is latency on the dependency only
    p2p_blocking: bool
    # the pipeline engine runs an interleaved schedule as a table of time steps with idle slots,
    # each step's sends and its neighbours' receives batched and waited on before the next step
    # (torch.distributed.pipelining up to torch 2.6, PipelineScheduleMulti;
    # planner/pipeline/timestep.py); False: each rank runs its ops as their inputs arrive
    pipeline_timesteps: bool
    # the pipeline engine keeps every in-flight microbatch's stage output until its backward
    keep_stage_outputs: bool
    # the pipeline engine allocates a receive buffer for every microbatch of the step, its
    # input on each stage but the first and its output gradient on each stage but the last,
    # and keeps them across steps (torch.distributed.pipelining; planner/predict/memory.py)
    p2p_buffers_per_microbatch: bool
    # cross-entropy computes its gradient in place (no two extra fp32 logit buffers)
    fused_cross_entropy: bool
    # fused element-wise kernels (bias-GeLU, SwiGLU, bias-dropout-add) instead of eager ops
    fused_elementwise: bool
    # the model applies RoPE with complex tensors (torchtitan's apply_rotary_emb: view_as_complex,
    # a complex product): torch.compile generates no code for complex operators, so its RoPE
    # kernels stay eager even with fused_elementwise (planner/cost/elementwise.py)
    complex_rope: bool
    # pipeline schedules the stack runs
    schedules: tuple[str, ...]
    # fixed cost of each pipeline action (a chunk's forward, backward, or in zero-bubble
    # schedules its input- or weight-gradient half), seconds; the simulator charges it per action
    pipeline_action_overhead_s: float
    # host seconds per transformer block per forward pass that the GPU waits for because kernel
    # launches are synchronous (CUDA_LAUNCH_BLOCKING=1); the backward costs twice, a full
    # recompute once more (planner/cost/host.py). 0: asynchronous launches, the host runs ahead
    host_s_per_block: float
    # MoE: routed tokens on the busiest GPU over the mean (1.0 balanced; a capacity factor caps
    # it); scales expert time and all-to-all bytes, not model FLOPs (planner/cost/moe.py)
    moe_expert_load: float
    # MoE: the routing weights multiply the routed experts' activation output (Megatron-Core),
    # so the experts' outputs are not kept for the weights' gradient; False: the weights multiply
    # the experts' outputs, which are kept (planner/cost/moe.py kept_bytes)
    moe_probs_in_activation: bool
    # MoE token dispatcher: "alltoall" (every routed copy sent to its expert's GPU), "deepep"
    # (DeepEP: a token crosses the network once per destination node; cost/moe.py deepep_s)
    moe_dispatcher: str
    # MoE: how a token's experts are picked (planner/cost/routing.py): "scores" (the router's
    # top-k, balanced, within the model's routing groups), "round_robin" (NeMo Automodel's
    # FakeBalancedGate: k consecutive experts a token); sets where DeepEP sends a token
    moe_routing: str
    # Megatron's --recompute-modules: what a block recomputes when its recompute mode is
    # "selective" (planner/cost/recompute.py): "core_attn" (the s x s scores; nothing more with
    # flash attention), "layernorm" (the two norm outputs), "moe_act" (the routed experts'
    # activation output), "mla_up_proj" (MLA's Q, K, V and normed latents)
    recompute_modules: tuple[str, ...]
    # how much more a backward split into input-grad (B) and weight-grad (W) actions costs than
    # the fused backward, as a fraction of the backward (0.1: B + W = 1.1 x fused)
    split_backward_overhead: float
    # no global synchronisation before the optimizer step (the zero-bubble fork's optimizer
    # post-validation): consecutive steps overlap, and a step costs the longest time one rank
    # spends from its first to its last pipeline action instead of the whole makespan
    optimizer_post_validation: bool
    # context parallelism's K/V exchange (cost/context.py): "p2p" ring, "a2a" all-to-all
    # (Ulysses), "allgather"; None: the stack runs no context parallelism (cp > 1 refused)
    cp_comm: str | None
    # --- FP8 (planner/cost/precision.py; read only when precision is "fp8") ---
    # the transformer blocks' linear layers (QKV, output projection, MLP) run "bf16" or "fp8"
    # GEMMs; attention, embedding and output head stay 16-bit
    precision: str
    # how FP8 scales are found: "delayed" (per tensor, from an amax history), "current" (per
    # tensor, from this tensor's amax: one more read), "rowwise" (a scale per row), "blockwise"
    # (DeepSeek-V3: 1x128 activation tiles, 128x128 weight blocks)
    fp8_recipe: str
    # FP8 weight copy and its transpose kept from the first microbatch to the optimizer step
    # (2 bytes per block weight; cast once per step) instead of cast in every microbatch
    fp8_weight_cache: bool
    # GEMM inputs saved for the backward in FP8 (1 byte) instead of 16-bit and cast again
    fp8_saved_activations: bool
    # ZeRO-3 all-gathers the blocks' linear weights already cast to FP8 (1 byte, torchao's
    # enable_fsdp_float8_all_gather): half the gathered bytes, and no forward weight cast
    fp8_all_gather: bool
    # FP8 primary weights (Transformer Engine's fp8_model_init: NeMo fp8_params, Megatron-LM
    # --fp8-param-gather): the blocks' linear weights live only as FP8 tensors (data and its
    # transpose), no 16-bit copy; the distributed optimizer writes them from its fp32 master
    # shard and all-gathers them in FP8 (cost/precision.py fp8_primary_weights). Read at ZeRO
    # 0-2 (ZeRO-3's FP8 gather is fp8_all_gather)
    fp8_params: bool
    # bytes per value of the saved input of the attention-output projection when GEMM inputs are
    # saved in FP8: 1 (FP8, as every other GEMM input), or DeepSeek-V3's 12-bit E5M6 (1.5)
    fp8_attn_out_bytes: float
    # the routed experts' activation-function inputs (their FC1 outputs) saved in FP8 (1 byte)
    # for the backward instead of 16-bit (DeepSeek-V3 sec. 3.3.3)
    fp8_moe_act_input: bool
    # --- memory of the loss and the gradient reduction ---
    # under TP the loss runs on vocab-sharded logits (DTensor's loss_parallel), whose fused
    # backward holds three loss-dtype logit buffers at once (planner/cost/loss.py); read only
    # when the cross-entropy is not fused
    loss_parallel: bool
    # dtype the cross-entropy runs in: "fp32" (logits upcast: Megatron's fused vocab-parallel
    # loss, torchtitan), "bf16" (F.cross_entropy on the 16-bit logits, NeMo Automodel's
    # MaskedCrossEntropy with fp32_upcast false): the log-probabilities kept for the backward
    # and, unless fused, its two gradient buffers are of this dtype (cost/memory.py)
    loss_dtype: str
    # dtype gradients are reduced over DP in when it differs from grad_dtype (FSDP2's
    # MixedPrecisionPolicy reduce_dtype fp32 over bf16-resident parameters: reduced in fp32,
    # kept in the parameters' bf16); None: as the held gradients (grad_dtype, or the fp32
    # accumulation buffer where there is one)
    grad_reduce_dtype: str | None
    # where each value comes from, by field name
    sources: tuple[tuple[str, str], ...] = ()
    # named components run over the stack (planner/stack/components.py), "name version" each
    components: tuple[str, ...] = ()
    # fields changed from the named stack by flags or a case ("field", "value" as text)
    overrides: tuple[tuple[str, str], ...] = ()

    # --- what the cost and memory models read ---------------------------------------------------

    @property
    def flash_attention(self) -> bool:
        return self.attention == "flash"

    def fp32_accumulation(self, zero: int) -> bool:
        """Whether 16-bit gradients are accumulated in an extra fp32 buffer at this ZeRO stage."""
        return (DTYPE_BYTES[self.grad_dtype] < 4 and self.param_dtype == "bf16"
                and zero in self.fp32_grad_accumulation_zero)

    def held_grad_bytes(self, zero: int) -> int:
        """Gradient bytes each parameter holds: the gradients and any fp32 accumulation buffer."""
        return DTYPE_BYTES[self.grad_dtype] + (4 if self.fp32_accumulation(zero) else 0)

    def reduced_grad_bytes(self, zero: int) -> int:
        """Bytes per parameter the DP reduction moves: the stack's reduce dtype where it names
        one, else the fp32 buffer where there is one, else the held gradients."""
        if self.grad_reduce_dtype is not None:
            return DTYPE_BYTES[self.grad_reduce_dtype]
        return 4 if self.fp32_accumulation(zero) else DTYPE_BYTES[self.grad_dtype]

    @property
    def fp8_weights_held(self) -> bool:
        """FP8 copies of the block weights (and their transposes) held across the step: a
        cache beside the 16-bit weights, or the primary weights themselves (fp8_params)."""
        return self.fp8_weight_cache or self.fp8_params

    @property
    def loss_bytes(self) -> int:
        """Bytes per logit of the cross-entropy's kept log-probabilities and gradient buffers."""
        return DTYPE_BYTES[self.loss_dtype]

    def accumulation_bytes(self, zero: int) -> int:
        """Bytes per parameter each microbatch's weight gradient is accumulated into (read and
        written once per microbatch) at this ZeRO stage: the held gradients, or the fp32
        accumulation buffer where the stack keeps one (DeepSpeed 0.19.8: at ZeRO-1 only)."""
        return 4 if self.fp32_accumulation(zero) else DTYPE_BYTES[self.grad_dtype]

    def held_weight_bytes(self, zero: int) -> int:
        """16-bit weight bytes each parameter holds besides the fp32 master in the optimizer."""
        return 0 if self.fp32_shards and zero >= 3 else ACTIVATION_BYTES

    def zero2_shards_grads(self) -> bool:
        return self.zero2_reduce_scatter == "microbatch"

    # --- presentation ---------------------------------------------------------------------------

    def values(self) -> dict:
        """The resolved option values, JSON-ready, in field order."""
        out = {}
        for f in fields(self):
            if f.name in _META:
                continue
            value = getattr(self, f.name)
            if f.name == "tp_overlap_ub":
                out[f.name] = userbuffers.as_dict(value)
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def to_dict(self) -> dict:
        """What plan.json records: name, version, any components, overrides and every
        resolved value."""
        named = {"components": list(self.components)} if self.components else {}
        return {"name": self.name, "version": self.version, **named,
                "overrides": dict(self.overrides), "values": self.values()}

    def label(self) -> str:
        """``megatron-core 2025.06`` plus its components and overrides, for footers and notes:
        ``torchtitan 2025.12 + llm-foundry 061f2c7 with grad_reduce_dtype=bf16``."""
        text = " + ".join((f"{self.name} {self.version}",) + self.components)
        if self.overrides:
            text += " with " + ", ".join(f"{k}={v}" for k, v in self.overrides)
        return text


_META = ("name", "version", "description", "sources", "components", "overrides")
OPTION_FIELDS = tuple(f.name for f in fields(Stack) if f.name not in _META)
REQUIRED_FIELDS = ("name", "version", "description") + OPTION_FIELDS

_CHOICES = {
    "launcher": (None, "megatron", "deepspeed", "torchtitan"),
    "attention": ("flash", "unfused"),
    "attention_kernel": ATTENTION_KERNELS,
    "param_dtype": ("bf16", "fp16"),
    "grad_dtype": tuple(DTYPE_BYTES),
    "zero2_reduce_scatter": ("microbatch", "step"),
    "zero1_grad_reduce": ("reduce_scatter", "all_reduce"),
    "zero3_gather": ("layer", "stage"),
    "cp_comm": (None, "p2p", "a2a", "allgather"),
    "precision": ("bf16", "fp8"),
    "fp8_recipe": ("delayed", "current", "rowwise", "blockwise"),
    "moe_dispatcher": ("alltoall", "deepep"),
    "moe_routing": ("scores", "round_robin"),
    "loss_dtype": ("fp32", "bf16"),
    "grad_reduce_dtype": (None,) + tuple(DTYPE_BYTES),
}
_BOOLS = ("fp32_shards", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
          "p2p_scatter_gather", "p2p_blocking", "keep_stage_outputs", "fused_cross_entropy",
          "p2p_buffers_per_microbatch", "pipeline_timesteps",
          "fused_elementwise", "complex_rope", "optimizer_post_validation", "fp8_weight_cache",
          "fp8_saved_activations", "fp8_all_gather", "fp8_params", "zero3_pipeline_hold",
          "zero3_side_streams", "zero3_root_unit", "zero3_reduce_chain", "loss_parallel",
          "sp_keeps_gathered", "moe_probs_in_activation", "fp8_moe_act_input")
# (low, high) inclusive; a value outside is refused with the range
_RANGES = {"optimizer_state_bytes": (0.0, 32.0), "zero3_prefetch": (0, 8),
           "pipeline_action_overhead_s": (0.0, 0.1), "split_backward_overhead": (0.0, 1.0),
           "host_s_per_block": (0.0, 0.1),
           "moe_expert_load": (1.0, 64.0), "fp8_attn_out_bytes": (1.0, 2.0),
           "tp_overlap_hidden": (0.0, 1.0)}


def check_value(key: str, value, origin: str):
    """The value of one option field, normalised (lists to tuples), or one PlanInputError line
    naming the field, what it must be and what it got."""
    where = f"{origin}: '{key}'"
    if key in ("name", "version", "description"):
        if not isinstance(value, str) or (key != "description" and not value.strip()):
            raise PlanInputError(f"{where} must be a non-empty string, got {value!r}")
        # printed and exported: printable, no control characters (core/schema.py, issue #12)
        return schema.check_value(value, schema.Text() if key == "description" else
                                  schema.Name(), where)
    if key in _CHOICES:
        if value not in _CHOICES[key]:
            allowed = ", ".join("null" if c is None else c for c in _CHOICES[key])
            raise PlanInputError(f"{where} must be one of {allowed}, got {value!r}")
        return value
    if key in _BOOLS:
        if not isinstance(value, bool):
            raise PlanInputError(f"{where} must be true or false, got {value!r}")
        return value
    if key in _RANGES:
        low, high = _RANGES[key]
        whole = isinstance(low, int)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                whole and not float(value).is_integer()):
            kind = "a whole number" if whole else "a number"
            raise PlanInputError(f"{where} must be {kind} in [{low}, {high}], got {value!r}")
        if not math.isfinite(value) or not low <= value <= high:
            raise PlanInputError(f"{where} must be in [{low}, {high}], got {value!r}")
        return int(value) if whole else float(value)
    if key == "schedules":
        if not isinstance(value, (list, tuple)) or not value or any(
                s not in SCHEDULES for s in value) or len(set(value)) != len(value):
            raise PlanInputError(f"{where} must be a non-empty list of distinct schedules from "
                                 f"{', '.join(SCHEDULES)}, got {value!r}")
        return tuple(value)
    if key == "tp_overlap_ub":
        return userbuffers.parse(value, where)
    if key == "recompute_modules":
        if not isinstance(value, (list, tuple)) or not value or any(
                m not in RECOMPUTE_MODULES for m in value) or len(set(value)) != len(value):
            raise PlanInputError(f"{where} must be a non-empty list of distinct modules from "
                                 f"{', '.join(RECOMPUTE_MODULES)} (Megatron's other "
                                 f"--recompute-modules are not priced), got {value!r}")
        if "torchtitan_op" in value and len(value) > 1:
            raise PlanInputError(f"{where}: torchtitan_op (torchtitan's op-level selective AC "
                                 f"policy) stands alone; got {value!r}")
        return tuple(value)
    if key == "fp32_grad_accumulation_zero":
        if not isinstance(value, (list, tuple)) or any(
                isinstance(z, bool) or z not in (0, 1, 2, 3) for z in value):
            raise PlanInputError(f"{where} must be a list of ZeRO stages 0-3, got {value!r}")
        return tuple(sorted(set(value)))
    raise PlanInputError(f"{where} is not a stack field")  # pragma: no cover - callers check
