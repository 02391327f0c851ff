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
- the model must be one of 0.2.2's dense flavors (torchtitan_flavors.py): Llama 3 (debugmodel,
  8B, 70B, 405B, ``[model] name = "llama3"``) or Qwen3 (debugmodel, 0.6B, 1.7B, 4B, 8B, 14B, 32B,
  ``name = "qwen3"``: per-head QK norms, head_dim 128, tied embeddings up to 4B); torchtitan
  builds its own model, so any other shape would train a different model than the one planned.
  MoE models, Qwen3's MoE flavors (debugmodel_moe, 30B-A3B, 235B-A22B) and DeepSeek-V3 among
  them, are refused: their expert-parallel settings are not written and not run in CI here;
- Qwen3 has no pipelining in 0.2.2 (its TrainSpec's 'pipelining_fn=None'), its tied flavors
  do not run under FSDP2 and its TP does not run on CPU, so pp > 1, ZeRO-2/3 on a tied flavor
  and tp > 1 are refused for it (``qwen3_rules``), and its ``training.seq_len`` may not exceed the flavor's 'max_seq_len=4096'
  (``seq_len_rules``); its parallelize_qwen3 (torchtitan/models/qwen3/infra/parallelize.py)
  applies the same TP (sequence-parallel norms), AC, FSDP (llama4's apply_fsdp, the same
  reshard policies) and DDP rules as Llama 3's, quoted at each rule below;
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

from planner.core.schedules import find_schedule
from planner.launchers.torch_pipelining import schedule_rules, torch_class
from planner.launchers.common import (Facts, block_counts, header, is_standard_gpt_model,
                                      launched_recompute, moe_problems, recompute_problems,
                                      schedule_basics, structure_problems, tp_divisibility)
from planner.launchers.quoting import comment, toml_str
from planner.launchers.torchtitan_flavors import FLAVORS, by_facts, flavor
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
    SequenceParallel()' (Qwen3's apply_non_moe_tp the same, plus '"attention.q_norm":
    SequenceParallel(sequence_dim=2)'); a TP plan priced without SP would run with less activation memory and
    other collectives than priced."""
    if f.tp > 1 and not f.sequence_parallel:
        return [f"{NAME} {RELEASE}: tensor parallelism always runs sequence parallel "
                "(apply_tp: \"attention_norm\": SequenceParallel()); plan with "
                "--sequence-parallel"]
    return []


def parallel_rules(f: Facts) -> list[str]:
    """torchtitan's rules; it pads nothing, so the vocabulary must split evenly over TP too.
    Qwen3's parallelize_qwen3 raises the same 'DDP has not supported > 1D parallelism'."""
    out = tp_divisibility(f.tp, f.num_heads, f.num_kv_heads, f.ffn, f.vocab, NAME)
    out += qwen3_rules(f)
    out += schedule_basics(f.pp, f.schedule, f.virtual_stages, f.sequence_parallel, f.tp, NAME)
    out += sequence_rules(f)
    if f.pp > 1:
        out += schedule_rules(f, NAME)
        multi_stage = getattr(find_schedule(f.schedule), "torch_multi_stage", False)
        if multi_stage and f.virtual_stages < 2:
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


def qwen3_rules(f: Facts) -> list[str]:
    """What 0.2.2 cannot run (or CI cannot check) for a Qwen3 flavor, known by its shape:
    - PP: train.py 'if not self.train_spec.pipelining_fn: raise RuntimeError(f"Pipeline Parallel
      is enabled but {job_config.model.name} does not support pipelining")', and Qwen3's
      TrainSpec sets 'pipelining_fn=None' (models/qwen3/__init__.py);
    - FSDP with tied embeddings: llama4's apply_fsdp (which parallelize_qwen3 imports) shards
      'model.tok_embeddings' and '[model.norm, model.output]' as two groups, and torch 2.13's
      fully_shard then raises 'Parameter ... is shared with a parameter already managed by
      another FSDP group' (_fsdp_state.py _validate_no_duplicate_params; run here on the tied
      debugmodel);
    - TP: apply_non_moe_tp keeps Q, K, V as DTensors ('"attention.wq":
      colwise_parallel(use_local_output=False)', for '"attention.q_norm":
      SequenceParallel(sequence_dim=2)'), and torch 2.13 on CPU has no sharding strategy for
      the attention ('aten._scaled_dot_product_flash_attention_for_cpu.default does not have a
      sharding strategy registered'), so CI here cannot run it: not exported, like CP."""
    if f.num_blocks is None:
        return []
    flv = by_facts((f.num_blocks, f.num_heads, f.num_kv_heads, f.ffn, f.vocab))
    if flv is None or flv.module != "qwen3":
        return []
    out = []
    if f.pp > 1:
        out.append(f"{NAME} {RELEASE}: qwen3 has no pipelining (its TrainSpec sets "
                   "'pipelining_fn=None': \"Pipeline Parallel is enabled but qwen3 does not "
                   "support pipelining\"); plan with --pp 1")
    if f.tp > 1:
        out.append(f"{NAME} {RELEASE}: qwen3's tensor parallelism passes DTensor Q/K/V to the "
                   "attention, which torch 2.13 on CPU cannot shard (\"does not have a sharding "
                   "strategy registered\"), so CI here does not run it; plan without --tp")
    if flv.tied and f.dp > 1 and f.zero >= 2:
        out.append(f"{NAME} {RELEASE}: qwen3 {flv.flavor} ties its embeddings, and FSDP2 shards "
                   "tok_embeddings and output in two groups (\"Parameter ... is shared with a "
                   "parameter already managed by another FSDP group\"); plan with --zero 0 "
                   "(DDP)")
    return out


def seq_len_rules(m: ModelSpec) -> list[str]:
    """qwen3/model/args.py update_from_config: 'if seq_len > self.max_seq_len: logger.warning(
    f"Sequence length {seq_len} exceeds original maximum {self.max_seq_len}.")' and then
    'self.max_seq_len = seq_len': it would train RoPE positions past the flavor's context."""
    f = flavor(m)
    if f is not None and f.max_seq_len and m.seq_length > f.max_seq_len:
        return [f"{NAME} {RELEASE}: sequence {m.seq_length} exceeds {f.module} {f.flavor}'s "
                f"max_seq_len {f.max_seq_len} (\"Sequence length {m.seq_length} exceeds "
                f"original maximum {f.max_seq_len}.\"); plan with --seq-len {f.max_seq_len} "
                "or less"]
    return []


MOE_REASON = ("torchtitan 0.2.2's MoE models (Qwen3 debugmodel_moe, 30B-A3B, 235B-A22B; "
              "DeepSeek-V3) need expert-parallel settings this export does not write and CI "
              "does not run; export it with --export megatron")


def check(plan: Plan) -> list[str]:
    par, m = plan.parallel, plan.model
    out = structure_problems(plan) + parallel_rules(Facts.of(par, m)) + moe_problems(
        plan, NAME, MOE_REASON)
    out += recompute_problems(plan, NAME, block_method=layer_sac(plan) is not None)
    divisor = 2 * par.tp * par.cp  # parallel_dims.py seq_len_divisor: 'self.tp * (self.cp * 2)'
    if m.seq_length % divisor:  # parallelize_llama and parallelize_qwen3 alike
        out.append(f"{NAME}: parallelize asserts 'seq_len % parallel_dims.seq_len_divisor "
                   f"== 0'; sequence {m.seq_length} is not divisible by 2 * tp * cp = {divisor}")
    out += seq_len_rules(m)
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
    """The rules on the model alone: torchtitan builds only its own dense flavors, so a solve
    for torchtitan checks them before searching (planner/launchers/__init__.py model_problems)."""
    if m.is_moe or any(layer.is_mla for layer in m.layers):
        return [f"{NAME}: {MOE_REASON}"]
    if not is_standard_gpt_model(m):
        return [f"{NAME}: model parts name tok_embeddings / layers.i / norm + the output; "
                "this model has other layer kinds"]
    if flavor(m) is None:
        return [f"{NAME}: no Llama 3 or Qwen3 flavor has this model's shape ({m.num_layers} "
                f"blocks, hidden {m.hidden_size}, {m.num_attention_heads} heads, "
                f"{m.num_kv_heads} KV, head_dim {m.kv_channels}, FFN {m.ffn_hidden_size}, "
                f"vocabulary {m.vocab_size}, QK norm {m.qk_norm or 'none'}, "
                f"{'tied' if m.tie_embeddings else 'untied'}, RoPE theta {m.rope_theta}); "
                f"torchtitan {RELEASE} builds only "
                f"{', '.join(f'{f.module} {f.flavor}' for f in FLAVORS)}"]
    return seq_len_rules(m)


def precision_rules(model: ModelSpec, stack) -> list[str]:
    """An FP8 plan is refused: 0.2.2 converts linears with ``[model] converters`` and
    ``[quantize.linear.float8]`` (job_config.py Float8Linear, torchao), which this exporter does
    not write and CI does not run (no torchao, no FP8 on CPU)."""
    if stack is not None and stack.precision == "fp8":
        return [f"{NAME} {RELEASE}: FP8 export is not supported ([quantize.linear.float8] needs "
                "torchao and is not run in CI here); plan with --precision bf16"]
    return []


def module_fqns_per_model_part(plan: Plan) -> list[list[str]]:
    """The modules of each model chunk, in stage order: Llama 3's names, which Qwen3Model shares
    ('self.tok_embeddings = nn.Embedding', 'self.layers[str(layer_id)]', 'self.norm',
    'self.output'); only Llama 3 is pipelined (qwen3_rules)."""
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
        p["pipeline_parallel_schedule"] = torch_class(par.schedule)[1]
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
    f = flavor(plan.model)
    out = {"target": TARGET, "supported": True, "module": f.module, "flavor": f.flavor,
           **settings["parallelism"]}
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
    lines = [header(plan, TARGET), "\n[model]\n", f"name = {toml_str(f.module)}\n",
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
