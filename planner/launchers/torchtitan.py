"""torchtitan: a TOML job config (``torchtitan.toml``) for torchtitan 0.2.2 on torch 2.13, the
release the torchtitan stack prices (profiles/stacks/torchtitan.json ``version``) and CI runs
(tests/test_torchtitan_run.py: one training step of ``torchtitan.train`` on gloo CPU processes
with the unchanged export, read back against plan.json).

torchtitan 0.2.2 reads ``--job.config_file`` TOML (torchtitan/config/job_config.py): ``[model]
name, flavor``, ``[parallelism] module_fqns_per_model_part`` (a list of lists: 'Specify a list of
lists containing the FQNs (Fully Qualified Names) of modules for each model chunk'); the output
projection is ``output``. (0.3.0 reads no TOML and its trainer calls
``pp_schedule.step(arg_mbs=..., kwarg_mbs=...)``, which torch 2.13 lacks: not a target.)

Rules, each refused with its reason:
- the model must be one of 0.2.2's Llama 3 flavors (shapes below); torchtitan builds its own
  model, so any other shape would train a different model than the one planned;
- ZeRO maps onto FSDP2's ``reshard_after_forward`` (``apply_fsdp`` in
  torchtitan/models/llama3/infra/parallelize.py): ZeRO-3 -> "always" ("default", no reshard,
  under pipelining: see ``reshard_policy``), ZeRO-2 -> "never". FSDP2 shards gradients with the
  optimizer state, so ZeRO-1 has no equivalent; ZeRO-0 is replication
  (``data_parallel_replicate_degree``), which 0.2.2 runs only as 1-D DDP ("DDP has not
  supported > 1D parallelism" in parallelize.py);
- bf16 with TP or PP runs only under FSDP (``mixed_precision_rules``); TP always shards the
  norms along the sequence (``sequence_rules``); context parallelism and Float8 are not run
  here, so refused;
- schedules are ``torch.distributed.pipelining``'s; a multi-stage class (interleaved, zero
  bubble) needs at least 2 stages per rank in torchtitan, and torch has no single-stage
  zero-bubble class, so a one-stage-per-rank ZB-H1 plan is refused here (torch itself runs it;
  see plan.json's ``engines.torch_pipelining``).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.launchers.torch_pipelining import SCHEDULES as TORCH_SCHEDULES, schedule_rules
from planner.launchers.common import (ExportError, Facts, block_counts, header,  # noqa: F401
                                      is_standard_gpt_model, launched_recompute, moe_problems,
                                      recompute_problems, schedule_basics, structure_problems,
                                      tp_divisibility)
from planner.launchers.quoting import comment, toml_str
from planner.model.spec import ModelSpec
from planner.predict.plan import Plan

NAME = "torchtitan"
RELEASE = "0.2.2"
TARGET = (f"torchtitan {RELEASE} on torch 2.13 TOML job config (torchrun -m torchtitan.train "
          "--job.config_file torchtitan.toml)")
FILE = "torchtitan.toml"
RESHARD = {3: "always", 2: "never"}


def reshard_policy(plan: Plan) -> str:
    """FSDP2's policy for the plan's ZeRO stage. Under pipelining a ZeRO-3 plan priced on a stack
    that holds each stage gathered through the step (``zero3_pipeline_hold``) runs torchtitan's
    "default", which for PP is no reshard: torchtitan/models/llama3/infra/parallelize.py
    apply_fsdp, 'case "default": # For PP, by default do not reshard after forward to avoid
    per-microbatch all-gathers, which can be expensive and non-overlapped / reshard_after_forward
    = not pp_enabled'."""
    par = plan.parallel
    held = plan.stack is None or plan.stack.zero3_pipeline_hold
    if par.zero == 3 and par.pp > 1 and held:
        return "default"
    return RESHARD[par.zero]


@dataclass(frozen=True)
class Flavor:
    """A Llama 3 shape torchtitan ships: (blocks, hidden, heads, kv heads, FFN, vocabulary)."""

    flavor: str
    shape: tuple[int, int, int, int, int, int]


# torchtitan/models/llama3/__init__.py (0.2.2) llama3_args: dim, n_layers, n_heads, n_kv_heads
# (None: n_heads), vocab_size (default 128256), FFN = FeedForward's 'hidden_dim = int(2 *
# hidden_dim / 3)', times ffn_dim_multiplier, rounded up to multiple_of (default 256) from 4 *
# dim: debugmodel ('dim=256, n_layers=6, n_heads=16, vocab_size=2048') 682 -> 768, 8B 1024/1.3 ->
# 14336, 70B 4096/1.3 -> 28672, 405B 4096/1.2 -> 53248. All SwiGLU, RMSNorm, RoPE, no biases,
# untied. (debugmodel_flex_attn / _varlen_attn share debugmodel's shape with other attention:
# not exported; the Qwen3 flavors have per-head QK norms and tied embeddings: not exported.)
FLAVORS = (
    Flavor("debugmodel", (6, 256, 16, 16, 768, 2048)),
    Flavor("8B", (32, 4096, 32, 8, 14336, 128256)),
    Flavor("70B", (80, 8192, 64, 8, 28672, 128256)),
    Flavor("405B", (126, 16384, 128, 8, 53248, 128256)),
)


def flavor(model: ModelSpec) -> Flavor | None:
    """The torchtitan Llama 3 flavor with exactly this model's shape, if any."""
    if (model.mlp, model.norm, model.bias, model.tie_embeddings, model.position_embeddings,
            model.qkv_bias, model.qk_norm, model.block_norms, model.sliding_window) != \
            ("swiglu", "rmsnorm", False, False, 0, False, "", 2, 0):
        return None
    if model.kv_channels * model.num_attention_heads != model.hidden_size:
        return None
    shape = (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_kv_heads,
             model.ffn_hidden_size, model.vocab_size)
    return next((f for f in FLAVORS if f.shape == shape), None)


def mixed_precision_rules(f: Facts) -> list[str]:
    """torchtitan/distributed/utils.py maybe_enable_amp: without FSDP, 'if
    parallel_dims.tp_enabled or parallel_dims.pp_enabled: logger.warning("Mixed precision
    training with TP or PP is only supported when FSDP/HSDP/CP is enabled.")' and returns a null
    context: such a run trains in fp32, not the bf16 the stack priced. FSDP is on where
    data_parallel_shard_degree > 1 (parallel_dims.py 'def fsdp_enabled(self): return
    self.dp_shard_enabled or self.cp_enabled'), i.e. dp > 1 with ZeRO 2 or 3 here."""
    if (f.tp > 1 or f.pp > 1) and not (f.dp > 1 and f.zero >= 2):
        return [f"{NAME} {RELEASE}: bf16 with TP or PP runs only under FSDP (\"Mixed precision "
                "training with TP or PP is only supported when FSDP/HSDP/CP is enabled.\"); "
                f"tp={f.tp} pp={f.pp} dp={f.dp} zero={f.zero} would train in fp32: plan dp > 1 "
                "with --zero 2 or 3"]
    return []


def sequence_rules(f: Facts) -> list[str]:
    """parallelize.py apply_tp shards every norm along the sequence, with no option to turn it
    off: '"attention_norm": SequenceParallel()', '"ffn_norm": SequenceParallel()', '"norm":
    SequenceParallel()'; a TP plan priced without SP would run with less activation memory and
    other collectives than priced."""
    if f.tp > 1 and not f.sequence_parallel:
        return [f"{NAME} {RELEASE}: tensor parallelism always runs sequence parallel "
                "(apply_tp: \"attention_norm\": SequenceParallel()); plan with "
                "--sequence-parallel"]
    return []


def parallel_rules(f: Facts) -> list[str]:
    """torchtitan's rules; it pads nothing, so the vocabulary must split evenly over TP too."""
    out = tp_divisibility(f.tp, f.num_heads, f.num_kv_heads, f.ffn, f.vocab, NAME)
    out += schedule_basics(f.pp, f.schedule, f.virtual_stages, f.sequence_parallel, f.tp, NAME)
    out += sequence_rules(f)
    if f.pp > 1:
        out += schedule_rules(f, NAME)
        if f.schedule in ("interleaved", "zb-h1") and f.virtual_stages < 2:
            out.append(f"{NAME}: {f.schedule} runs a multi-stage schedule class, which torchtitan "
                       f"allows with at least 2 stages per rank (virtual_stages={f.virtual_stages}"
                       "); torch has no single-stage zero-bubble class")
    if f.dp > 1:
        if f.zero == 1:
            out.append(f"{NAME}: FSDP2 shards gradients together with the optimizer state, so "
                       "there is no ZeRO-1; plan with --zero 2 (reshard never) or --zero 0 "
                       "(replicate)")
        if f.zero == 0 and (f.tp > 1 or f.pp > 1):
            out.append(f"{NAME} {RELEASE}: ZeRO-0 is DDP, which it runs only without TP or PP "
                       "(\"DDP has not supported > 1D parallelism\"); plan with --zero 2 or 3")
    out += mixed_precision_rules(f)
    if f.cp > 1:
        out.append(f"{NAME} {RELEASE}: parallelism.context_parallel_degree is not exported: its "
                   "ring attention is not run in CI here (gloo on CPU), so a CP plan is not "
                   "checked to run as priced; plan without --cp")
    return out


def check(plan: Plan) -> list[str]:
    par, m = plan.parallel, plan.model
    out = structure_problems(plan) + parallel_rules(Facts.of(par, m)) + moe_problems(
        plan, NAME, "export it with --export megatron")
    out += recompute_problems(plan, NAME, block_method=layer_sac(plan) is not None)
    divisor = 2 * par.tp * par.cp  # parallel_dims.py seq_len_divisor: 'self.tp * (self.cp * 2)'
    if m.seq_length % divisor:
        out.append(f"{NAME}: parallelize_llama asserts 'seq_len % parallel_dims.seq_len_divisor "
                   f"== 0'; sequence {m.seq_length} is not divisible by 2 * tp * cp = {divisor}")
    stack = plan.stack
    if stack is not None and stack.param_dtype != "bf16":
        out.append(f"{NAME}: training.mixed_precision_param is bfloat16 or float32; the plan's "
                   f"{stack.name} stack computes in {stack.param_dtype}")
    if stack is not None and stack.grad_dtype != "fp32":
        out.append(f"{NAME}: training.mixed_precision_reduce is float32 only; the plan's "
                   f"{stack.name} stack reduces gradients in {stack.grad_dtype}")
    out += precision_rules(plan.model, plan.stack)
    if m.is_moe:  # refused above (moe_problems); its flavor check would only repeat it
        return out
    return out + model_rules(m)


def model_rules(m: ModelSpec) -> list[str]:
    """The rules on the model alone: torchtitan builds only its own Llama 3 flavors, so a solve
    for torchtitan checks them before searching (planner/launchers/__init__.py model_problems)."""
    if not is_standard_gpt_model(m):
        return [f"{NAME}: model parts name tok_embeddings / layers.i / norm + the output; "
                "this model has other layer kinds"]
    if flavor(m) is None:
        return [f"{NAME}: no Llama 3 flavor has this model's shape ({m.num_layers} blocks, "
                f"hidden {m.hidden_size}, {m.num_attention_heads} heads, {m.num_kv_heads} KV, "
                f"FFN {m.ffn_hidden_size}, vocabulary {m.vocab_size}); torchtitan {RELEASE} "
                f"builds only {', '.join(f.flavor for f in FLAVORS)}"]
    return []


def precision_rules(model: ModelSpec, stack) -> list[str]:
    """An FP8 plan is refused: 0.2.2 converts linears with ``[model] converters`` and
    ``[quantize.linear.float8]`` (job_config.py Float8Linear, torchao), which this exporter does
    not write and CI does not run (no torchao, no FP8 on CPU)."""
    if stack is not None and stack.precision == "fp8":
        return [f"{NAME} {RELEASE}: FP8 export is not supported ([quantize.linear.float8] needs "
                "torchao and is not run in CI here); plan with --precision bf16"]
    return []


def module_fqns_per_model_part(plan: Plan) -> list[list[str]]:
    """The modules of each model chunk, in stage order (torchtitan's Llama names)."""
    n = len(plan.model.layers)
    parts = []
    for s in plan.stages:
        names = []
        for i in range(s.first, s.last):
            if i == 0:
                names.append("tok_embeddings")
            elif i == n - 1:
                names += ["norm", "output"]
            else:
                names.append(f"layers.{i - 1}")
        parts.append(names)
    return parts


def _settings(plan: Plan) -> dict:
    """The values the TOML sets, by torchtitan section and field. The local batch is one
    pipeline step (split into microbatches: pipeline_parallel.py 'n_microbatches = batch_size //
    microbatch_size') with pp > 1; without a pipeline it is one microbatch and
    global_batch_size > local * dp makes torchtitan accumulate gradients (train.py
    'self.gradient_accumulation_steps = global_batch_size // (job_config.training.local_batch_size
    * batch_degree)')."""
    par, m = plan.parallel, plan.model
    shard = par.dp if par.zero >= 2 else 1
    local = par.micro_batch * par.num_microbatches if par.pp > 1 else par.micro_batch
    settings = {
        "training": {"local_batch_size": local,
                     "global_batch_size": par.global_batch, "seq_len": m.seq_length,
                     "mixed_precision_param": "bfloat16"},  # check() refuses other stacks
        "parallelism": {"tensor_parallel_degree": par.tp, "pipeline_parallel_degree": par.pp,
                        "data_parallel_shard_degree": shard,
                        "data_parallel_replicate_degree": par.dp // shard},
    }
    if plan.stack is not None:  # the gradient reduction the stack priced (FSDP2's reduce dtype)
        settings["training"]["mixed_precision_reduce"] = "float32"
    p = settings["parallelism"]
    if par.dp > 1 and par.zero >= 2:
        p["fsdp_reshard_after_forward"] = reshard_policy(plan)
    if par.pp > 1:
        p["pipeline_parallel_schedule"] = TORCH_SCHEDULES[par.schedule][1]
        p["pipeline_parallel_microbatch_size"] = par.micro_batch
    if plan.stack is not None:  # eager element-wise kernels unless the stack compiled them
        settings["compile"] = {"enable": plan.stack.fused_elementwise}
    return settings


def entry(plan: Plan) -> dict:
    """plan.json's ``engines.torchtitan``: the names it takes, or the rule the plan breaks."""
    problems = check(plan)
    if problems:
        return {"target": TARGET, "supported": False, "rule": problems[0]}
    settings = _settings(plan)
    out = {"target": TARGET, "supported": True, "module": "llama3",
           "flavor": flavor(plan.model).flavor, **settings["parallelism"]}
    if "compile" in settings:
        out["compile"] = settings["compile"]["enable"]
    if plan.parallel.pp > 1:
        out["module_fqns_per_model_part"] = module_fqns_per_model_part(plan)
    out["activation_checkpoint"] = activation_checkpoint(plan)
    return out


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return toml_str(value)


def activation_checkpoint(plan: Plan) -> dict:
    """``[activation_checkpoint]``: the plan's one recompute setting (check() refuses others).
    activation_checkpoint.py applies it to every TransformerBlock ('for layer_id,
    transformer_block in layers.named_children()'); "full" wraps each in ptd_checkpoint_wrapper,
    "selective" with "op" wraps each with the op-level policy, with an int k every k-th block."""
    recompute = launched_recompute(plan)
    k = layer_sac(plan)
    if k is not None:
        return {"mode": "selective", "selective_ac_option": str(k)}
    if recompute.mode == "selective":
        return {"mode": "selective", "selective_ac_option": "op"}
    return {"mode": recompute.mode}


def _toml(plan: Plan) -> str:
    f = flavor(plan.model)
    lines = [header(plan, TARGET), "\n[model]\n", 'name = "llama3"\n',
             f"flavor = {toml_str(f.flavor)}  # {comment(plan.model.name)}\n"]
    for section, values in _settings(plan).items():
        lines.append(f"\n[{section}]\n")
        lines += [f"{field} = {_toml_value(value)}\n" for field, value in values.items()]
        if section == "parallelism" and plan.parallel.pp > 1:
            lines.append("module_fqns_per_model_part = "
                         f"{_toml_value(module_fqns_per_model_part(plan))}\n")
    lines.append("\n[activation_checkpoint]\n")
    if layer_sac(plan) is not None:
        lines.append("# layer SAC: every k-th transformer block of a rank is checkpointed, "
                     f"floor(blocks / k): the {launched_recompute(plan).blocks} per chunk the "
                     "plan recomputes.\n")
    lines += [f"{field} = {toml_str(value)}\n"
              for field, value in activation_checkpoint(plan).items()]
    return "".join(lines)


def layer_sac(plan: Plan) -> int | None:
    """k of torchtitan's layer SAC where it recomputes exactly the plan's block method (the first
    N blocks of every chunk), else None.

    job_config.py ActivationCheckpoint.selective_ac_option: "'int' (e.g., 2) for every nth
    layer"; activation_checkpoint.py _apply_layer_sac counts the blocks it wraps in a
    process-wide counter ('global _layer_sac_count / _layer_sac_count += 1') and checkpoints a
    block when '_layer_sac_count % ac_freq == 0', so a rank with n blocks recomputes floor(n / k)
    of them (every k-th, not the first ones: the same cost for identical Llama blocks). Exact
    when one chunk per rank and floor(n_r / k) is each rank's planned count for one k; any other
    block plan is refused (recompute_problems)."""
    setting = launched_recompute(plan)
    if setting is None or setting.blocks is None or plan.parallel.virtual_stages != 1:
        return None
    counts = block_counts(plan)
    asked = [min(setting.blocks, n) for n in counts]
    fits = [k for k in range(1, max(counts) + 1)
            if all(n // k == a for n, a in zip(counts, asked))]
    return max(fits) if fits else None


def render(plan: Plan) -> dict[str, str]:
    return {FILE: _toml(plan)}
