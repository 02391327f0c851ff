"""torchtitan: launch arguments for torchtitan 0.3.0 (``torchtitan_args.sh``), or a TOML job config
for torchtitan 0.2.x (``torchtitan.toml``), chosen by ``--torchtitan-version``.

torchtitan 0.3.0 reads no TOML (``torchtitan/config/manager.py``: ``--module`` and ``--config``
pick a function of ``torchtitan/models/<module>/config_registry.py``, then tyro parses
``--<section>.<field> value`` overrides; a ``list[str]`` field takes one comma-separated token, so
``module_fqns_per_model_part`` takes one token per model part; the activation-checkpoint policy
is a tyro subcommand, ``activation-checkpoint:{none,selective,full}``, given last; with pp > 1 its
trainer raises unless ``--training.disable_cuda_graphs`` is set). The output projection is
``lm_head``. torchtitan 0.2.0-0.2.2 read ``--job.config_file`` TOML
(``torchtitan/config/job_config.py``): ``[model] name, flavor``, ``[parallelism]
module_fqns_per_model_part`` (a list of lists; ``pipeline_parallel_split_points`` is gone), and
name the output projection ``output``. Both were checked by parsing the exported arguments with
each release's ConfigManager (see tests/test_torchtitan_export.py).

Rules, each refused with its reason:
- the model must be one of the release's Llama 3 configs (shapes below); torchtitan builds its
  own model, so any other shape would train a different model than the one planned;
- ZeRO maps onto FSDP2's ``reshard_after_forward`` (``torchtitan/distributed/fsdp.py``):
  ZeRO-3 -> "always" ("default", no reshard, under pipelining: see ``reshard_policy``), ZeRO-2 -> "never" (parameters stay gathered from forward to backward;
  gradients and optimizer state sharded). FSDP2 always shards gradients with the optimizer state,
  so ZeRO-1 has no equivalent; ZeRO-0 is replication (``data_parallel_replicate_degree``), which
  0.2.x runs only as 1-D DDP ("DDP has not supported > 1D parallelism" in parallelize.py);
- schedules are ``torch.distributed.pipelining``'s; a multi-stage class (interleaved, zero
  bubble) needs at least 2 stages per rank in torchtitan, and torch has no single-stage
  zero-bubble class, so a one-stage-per-rank ZB-H1 plan is refused here (torch itself runs it;
  see plan.json's ``engines.torch_pipelining``).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.launchers.torch_pipelining import SCHEDULES as TORCH_SCHEDULES, schedule_rules
from planner.launchers.common import (ExportError, Facts, block_counts, header,
                                      is_standard_gpt_model, launched_recompute, moe_problems,
                                      recompute_problems, schedule_basics, structure_problems,
                                      tp_divisibility)
from planner.launchers.quoting import comment, sh_word, toml_str
from planner.model.spec import ModelSpec
from planner.predict.plan import Plan

NAME = "torchtitan"
DEFAULT_VERSION = "0.3.0"
VERSIONS = {"0.3.0": "0.3.0", "0.3": "0.3.0", "0.2": "0.2.x", "0.2.x": "0.2.x",
            "0.2.0": "0.2.x", "0.2.1": "0.2.x", "0.2.2": "0.2.x"}
TARGETS = {
    "0.3.0": "torchtitan 0.3.0 (torchrun -m torchtitan.train --module --config + overrides)",
    "0.2.x": "torchtitan 0.2.0-0.2.2 TOML job config (torchrun -m torchtitan.train "
             "--job.config_file)",
}
FILES = {"0.3.0": "torchtitan_args.sh", "0.2.x": "torchtitan.toml"}
OUTPUT_MODULE = {"0.3.0": "lm_head", "0.2.x": "output"}
RESHARD = {3: "always", 2: "never"}


def reshard_policy(plan: Plan) -> str:
    """FSDP2's policy for the plan's ZeRO stage. Under pipelining a ZeRO-3 plan priced on a stack
    that holds each stage gathered through the step (``zero3_pipeline_hold``) runs torchtitan's
    "default", which for PP is no reshard: torchtitan/distributed/fsdp.py, 'case "default": #
    For PP, by default do not reshard after forward to avoid per-microbatch all-gathers, which
    can be expensive and non-overlapped / return not pp_enabled'."""
    par = plan.parallel
    held = plan.stack is None or plan.stack.zero3_pipeline_hold
    if par.zero == 3 and par.pp > 1 and held:
        return "default"
    return RESHARD[par.zero]


@dataclass(frozen=True)
class Flavor:
    """A Llama 3 shape torchtitan ships: (blocks, hidden, heads, kv heads, FFN, vocabulary)."""

    flavor: str
    config: str  # the 0.3.0 config_registry function
    shape: tuple[int, int, int, int, int, int]


# torchtitan/models/llama3/__init__.py (0.2.x llama3_args, 0.3.0 _8b/_70b/_405b): dim, n_layers,
# n_heads, n_kv_heads, vocab 128256, FFN = compute_ffn_hidden_dim(dim, multiple_of, multiplier):
# 8B 1024/1.3 -> 14336, 70B 4096/1.3 -> 28672, 405B 4096/1.2 -> 53248. All SwiGLU, RMSNorm, RoPE,
# no biases, untied. (0.3.0's 1B and 3B flavors have no config function, so --config cannot
# name them.)
FLAVORS = (
    Flavor("8B", "llama3_8b", (32, 4096, 32, 8, 14336, 128256)),
    Flavor("70B", "llama3_70b", (80, 8192, 64, 8, 28672, 128256)),
    Flavor("405B", "llama3_405b", (126, 16384, 128, 8, 53248, 128256)),
)


def version_key(version: str) -> str:
    try:
        return VERSIONS[version.strip().lower().removeprefix("v")]
    except KeyError:
        raise ExportError(f"{NAME}: unknown --torchtitan-version {version!r}; choose 0.3.0 or "
                          "0.2 (0.2.0-0.2.2)") from None


def flavor(model: ModelSpec) -> Flavor | None:
    """The torchtitan Llama 3 flavor with exactly this model's shape, if any."""
    if (model.mlp, model.norm, model.bias, model.tie_embeddings, model.position_embeddings) != \
            ("swiglu", "rmsnorm", False, False, 0):
        return None
    shape = (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_kv_heads,
             model.ffn_hidden_size, model.vocab_size)
    return next((f for f in FLAVORS if f.shape == shape), None)


def parallel_rules(f: Facts, version: str = DEFAULT_VERSION) -> list[str]:
    """torchtitan's rules; it pads nothing, so the vocabulary must split evenly over TP too."""
    key = version_key(version)
    out = tp_divisibility(f.tp, f.num_heads, f.num_kv_heads, f.ffn, f.vocab, NAME)
    out += schedule_basics(f.pp, f.schedule, f.virtual_stages, f.sequence_parallel, f.tp, NAME)
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
        if f.zero == 0 and key == "0.2.x" and (f.tp > 1 or f.pp > 1):
            out.append(f"{NAME} 0.2.x: ZeRO-0 is DDP, which it runs only without TP or PP "
                       "(\"DDP has not supported > 1D parallelism\"); plan with --zero 2 or 3")
    if f.cp > 1 and key == "0.2.x":
        out.append(f"{NAME} 0.2.x: context parallelism was not checked against this release's "
                   "config; export with --torchtitan-version 0.3.0 "
                   "(parallelism.context_parallel_degree)")
    return out


def check(plan: Plan, version: str = DEFAULT_VERSION) -> list[str]:
    par, m = plan.parallel, plan.model
    out = structure_problems(plan) + parallel_rules(Facts.of(par, m), version) + moe_problems(
        plan, NAME, "export it with --export megatron")
    # the 0.2.x TOML runs a block plan as layer SAC where that recomputes exactly as planned
    sac = layer_sac(plan) if version_key(version) == "0.2.x" else None
    out += recompute_problems(plan, NAME, block_method=sac is not None and sac[1])
    stack = plan.stack
    if stack is not None and stack.param_dtype != "bf16":
        out.append(f"{NAME}: training.mixed_precision_param is bfloat16 or float32; the plan's "
                   f"{stack.name} stack computes in {stack.param_dtype}")
    if stack is not None and stack.grad_dtype != "fp32":
        out.append(f"{NAME}: training.mixed_precision_reduce is float32 only; the plan's "
                   f"{stack.name} stack reduces gradients in {stack.grad_dtype}")
    out += precision_rules(plan.model, plan.stack, version)
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
                f"FFN {m.ffn_hidden_size}, vocabulary {m.vocab_size}); torchtitan builds only "
                f"{', '.join(f.flavor for f in FLAVORS)}"]
    return []


# torchtitan 0.3.0 has no Float8 option on the command line: the config_registry function picks
# the model's converters, and only llama3_405b converts its linears ("Float8LinearConverter.
# Config(filter_fqns=["lm_head"], ...)", recipe_name default "rowwise"; the converter's recipes
# are Literal["rowwise", "rowwise_with_gw_hp"]) in torchtitan/models/llama3/config_registry.py.
FLOAT8_CONFIGS = {"llama3_405b": "rowwise"}


def precision_rules(model: ModelSpec, stack, version: str = DEFAULT_VERSION) -> list[str]:
    """Where the run's precision would differ from the plan's: torchtitan 0.3.0 trains Float8
    exactly in the configs that convert (FLOAT8_CONFIGS), with their recipe; the 0.2.x TOML's
    Float8 names are not checked by this exporter, so an FP8 plan is refused there."""
    f = flavor(model)
    fp8 = stack is not None and stack.precision == "fp8"
    if version_key(version) != "0.3.0":
        return [f"{NAME} 0.2.x: FP8 export is not supported here (its Float8 settings are not "
                "checked); use --torchtitan-version 0.3.0"] if fp8 else []
    if f is None:
        return []
    recipe = FLOAT8_CONFIGS.get(f.config)
    if recipe and not fp8:
        return [f"{NAME} 0.3.0: the {f.config} config trains Float8 ({recipe}) linears; plan it "
                f"with --precision fp8 and a stack whose fp8_recipe is {recipe}"]
    if fp8 and not recipe:
        return [f"{NAME} 0.3.0: the {f.config} config has no Float8 converter (only "
                f"{', '.join(FLOAT8_CONFIGS)} converts); plan with --precision bf16"]
    if fp8 and stack.fp8_recipe != recipe:
        return [f"{NAME} 0.3.0: {f.config} runs Float8 with {recipe} scaling; the plan's stack "
                f"prices {stack.fp8_recipe} (override fp8_recipe to {recipe})"]
    return []


def module_fqns_per_model_part(plan: Plan, version: str = DEFAULT_VERSION) -> list[list[str]]:
    """The modules of each model chunk, in stage order (torchtitan's Llama names)."""
    output = OUTPUT_MODULE[version_key(version)]
    n = len(plan.model.layers)
    parts = []
    for s in plan.stages:
        names = []
        for i in range(s.first, s.last):
            if i == 0:
                names.append("tok_embeddings")
            elif i == n - 1:
                names += ["norm", output]
            else:
                names.append(f"layers.{i - 1}")
        parts.append(names)
    return parts


def _settings(plan: Plan, key: str) -> dict:
    """The values both formats set, by torchtitan section and field. The local batch is one
    pipeline step (split into microbatches) with pp > 1; without a pipeline it is one microbatch
    and global_batch_size > local * dp makes torchtitan accumulate gradients."""
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
    if par.cp > 1:  # torchtitan/config/configs.py (0.3.0): context_parallel_degree, head-tail
        settings["parallelism"]["context_parallel_degree"] = par.cp  # balanced by default
    if plan.stack is not None:  # the gradient reduction the stack priced (FSDP2's reduce dtype)
        settings["training"]["mixed_precision_reduce"] = "float32"
    if par.pp > 1 and key == "0.3.0":  # trainer.py: "CUDA graphs do not support pipeline
        settings["training"]["disable_cuda_graphs"] = True  # parallelism yet"
    p = settings["parallelism"]
    if par.tp > 1 and key == "0.3.0":  # 0.2.x always shards norms along the sequence under TP
        p["enable_sequence_parallel"] = par.sequence_parallel
    if par.dp > 1 and par.zero >= 2:
        p["fsdp_reshard_after_forward"] = reshard_policy(plan)
    if par.pp > 1:
        p["pipeline_parallel_schedule"] = TORCH_SCHEDULES[par.schedule][1]
        p["pipeline_parallel_microbatch_size"] = par.micro_batch
    if plan.stack is not None:  # eager element-wise kernels unless the stack compiled them
        settings["compile"] = {"enable": plan.stack.fused_elementwise}
    return settings


def entry(plan: Plan, version: str = DEFAULT_VERSION) -> dict:
    """plan.json's ``engines.torchtitan``: the names it takes, or the rule the plan breaks."""
    key = version_key(version)
    problems = check(plan, version)
    if problems:
        return {"target": TARGETS[key], "supported": False, "rule": problems[0]}
    f = flavor(plan.model)
    settings = _settings(plan, key)
    out = {"target": TARGETS[key], "supported": True, "module": "llama3", "config": f.config,
           "flavor": f.flavor, **settings["parallelism"]}
    if "compile" in settings:
        out["compile"] = settings["compile"]["enable"]
    if plan.parallel.pp > 1:
        out["module_fqns_per_model_part"] = module_fqns_per_model_part(plan, version)
    return out


def _args_sh(plan: Plan) -> str:
    f = flavor(plan.model)
    words = [("--module", "llama3"), ("--config", f.config)]
    for section, values in _settings(plan, "0.3.0").items():
        for field, value in values.items():
            if isinstance(value, bool):
                words.append((f"--{section}.{'' if value else 'no_'}{field}", None))
            else:
                words.append((f"--{section}.{field}", str(value)))
    if plan.parallel.pp > 1:
        parts = module_fqns_per_model_part(plan, "0.3.0")
        words.append(("--parallelism.module_fqns_per_model_part",
                       " ".join(sh_word(",".join(p)) for p in parts)))
    lines = [header(plan, TARGETS["0.3.0"]),
             "# Source this file and run, on every node (launch.sh does):\n"
             "#   torchrun ... -m torchtitan.train \"${TORCHTITAN_ARGS[@]}\" [your overrides] "
             "\"${TORCHTITAN_TAIL[@]}\"\n"
             "# TORCHTITAN_TAIL is tyro's activation-checkpoint subcommand, which must come last.\n",
             f"# Model: torchtitan llama3 flavor {f.flavor} ({comment(plan.model.name)}).\n",
             "TORCHTITAN_ARGS=(\n"]
    for flag, value in words:
        if flag == "--parallelism.module_fqns_per_model_part":  # one word per part, quoted
            lines.append(f"  {flag} {value}\n")
        else:
            lines.append(f"  {flag}" + (f" {sh_word(value)}" if value is not None else "")
                         + "\n")
    lines += [")\n",
              f"TORCHTITAN_TAIL=(activation-checkpoint:{launched_recompute(plan).mode})\n"]
    return "".join(lines)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return toml_str(value)


def _toml(plan: Plan) -> str:
    f = flavor(plan.model)
    lines = [header(plan, TARGETS["0.2.x"])]
    if plan.parallel.tp > 1 and not plan.parallel.sequence_parallel:
        lines.append("# Note: torchtitan 0.2.x's TP implies sequence parallelism (less activation "
                     "memory than this plan counted).\n")
    lines += ["\n[model]\n", 'name = "llama3"\n',
              f"flavor = {toml_str(f.flavor)}  # {comment(plan.model.name)}\n"]
    for section, values in _settings(plan, "0.2.x").items():
        lines.append(f"\n[{section}]\n")
        lines += [f"{field} = {_toml_value(value)}\n" for field, value in values.items()]
        if section == "parallelism" and plan.parallel.pp > 1:
            lines.append("module_fqns_per_model_part = "
                         f"{_toml_value(module_fqns_per_model_part(plan, '0.2.x'))}\n")
    recompute = launched_recompute(plan).mode
    sac = layer_sac(plan)
    if sac is not None:
        k, exact, asked = sac
        lines += ["\n[activation_checkpoint]\n",
                  "# layer SAC: every k-th transformer block of a rank is checkpointed, "
                  f"floor(blocks / k); the plan recomputes {', '.join(map(str, asked))} per "
                  "rank" + (": exactly that.\n" if exact else
                            f": k = {k} is the largest that recomputes at least that on every "
                            "rank (slower than planned, never more memory).\n"),
                  'mode = "selective"\n', f"selective_ac_option = {toml_str(str(k))}\n"]
        return "".join(lines)
    lines += ["\n[activation_checkpoint]\n", f"mode = {toml_str(recompute)}\n"]
    if recompute == "selective":
        lines.append('selective_ac_option = "op"\n')
    return "".join(lines)


def layer_sac(plan: Plan) -> tuple[int, bool, list[int]] | None:
    """torchtitan's layer SAC for a plan that recomputes only some blocks (Megatron's block
    method), or None for a plan without it: (k, exact, blocks each rank recomputes).

    torchtitan/config/job_config.py ActivationCheckpoint.selective_ac_option: "'int' (e.g., 2)
    for every nth layer"; torchtitan/distributed/activation_checkpoint.py _apply_layer_sac
    counts the blocks it wraps in a process-wide counter and checkpoints a block when
    ``_layer_sac_count % ac_freq == 0``, so a rank with n blocks recomputes floor(n / k) of
    them (every k-th, not the first ones: the same cost for identical Llama blocks). One k serves
    every rank: exact when floor(n_r / k) is each rank's planned count and each rank holds one
    chunk (with several, which chunk a recomputed block falls in changes the memory); else the
    largest k that recomputes at least the plan's count on every rank."""
    if not any(s.recompute_layers is not None for s in plan.stages):
        return None
    if any(s.recompute == "selective" for s in plan.stages):
        return None  # one policy per run: the strongest (full) is exported
    pp = plan.parallel.pp
    counts = block_counts(plan)
    held, asked = [0] * pp, [0] * pp
    for s, n in zip(plan.stages, counts):
        held[s.rank] += n
        asked[s.rank] += (s.recompute_layers if s.recompute_layers is not None else n) \
            if s.recompute == "full" else 0
    k = max(k for k in range(1, max(held) + 1)
            if all(n // k >= a for n, a in zip(held, asked)))
    exact = plan.parallel.virtual_stages == 1 and all(n // k == a for n, a in zip(held, asked))
    return k, exact, asked


def render(plan: Plan, version: str = DEFAULT_VERSION) -> dict[str, str]:
    key = version_key(version)
    if key == "0.3.0":
        return {FILES[key]: _args_sh(plan)}
    return {FILES[key]: _toml(plan)}
