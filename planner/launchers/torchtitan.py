"""torchtitan: ``torchtitan.toml`` job config (TOML-config releases, e.g. v0.1/v0.2).

Field names checked against ``torchtitan/config/job_config.py`` (dataclasses Parallelism,
Training, ActivationCheckpoint) and ``torchtitan/distributed/pipeline.py``:
``[parallelism] tensor_parallel_degree, pipeline_parallel_degree, data_parallel_shard_degree,
data_parallel_replicate_degree, pipeline_parallel_schedule, pipeline_parallel_microbatch_size,
pipeline_parallel_split_points`` (module names where each stage after the first begins, e.g.
"layers.4"); ``[training] local_batch_size, global_batch_size, seq_len``;
``[activation_checkpoint] mode``. Schedule names are those of
``torch.distributed.pipelining.schedules.get_schedule_class``.

Mapping notes: torchtitan's TP always shards norms/dropout along the sequence (sequence parallel
is implied by tp > 1); DDP (replicate) composes with no other parallelism, so data parallelism
with TP or PP is FSDP2 (shard) -- ZeRO-3 keeps the default resharding, ZeRO-0/1/2 use
``fsdp_reshard_after_forward = "never"`` (parameters stay gathered from forward to backward, the
ZeRO-2-like setting; it stores no more than the plan counted). ZB-H1 has no single-stage schedule
in torch.distributed.pipelining; the closest is "InterleavedZeroBubble".
"""

from __future__ import annotations

from planner.launchers.common import (Facts, header, is_standard_gpt, schedule_basics,
                                   strongest_recompute, structure_problems, tp_divisibility)
from planner.predict.plan import Plan

TARGET = "torchtitan v0.1+ TOML job config (torchrun -m torchtitan.train --job.config_file)"
NAME = "torchtitan"
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B",
             "zb-h1": "InterleavedZeroBubble"}
FLAVORS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"),
           "llama3-405b": ("llama3", "405B")}


def parallel_rules(f: Facts) -> list[str]:
    """torchtitan's rules; it pads nothing, so the vocabulary must split evenly over TP too."""
    out = tp_divisibility(f.tp, f.num_heads, f.num_kv_heads, f.ffn, f.vocab, NAME)
    out += schedule_basics(f.pp, f.schedule, f.virtual_stages, f.sequence_parallel, f.tp, NAME)
    if f.pp > 1 and f.schedule not in SCHEDULES:
        out.append(f"{NAME}: no pipeline schedule for '{f.schedule}'")
    if f.pp > 1 and f.num_blocks is not None and f.pp * f.virtual_stages > f.num_blocks + 1:
        out.append(f"{NAME}: {f.pp * f.virtual_stages} stages need that many split points among "
                   f"{f.num_blocks} blocks")
    return out


def check(plan: Plan) -> list[str]:
    par, m = plan.parallel, plan.model
    out = structure_problems(plan) + parallel_rules(Facts.of(par, m))
    if not is_standard_gpt(plan):
        out.append(f"{NAME}: split points name tok_embeddings / layers.i / norm + output; this "
                   "model has other layer kinds")
    return out


def split_points(plan: Plan) -> list[str]:
    """Module where each stage after the first begins: "layers.{i}" or "norm" (head-only)."""
    layers = plan.model.layers
    points = []
    for s in plan.stages[1:]:
        kind = layers[s.first].kind
        points.append("norm" if kind == "head" else f"layers.{s.first - 1}")
    return points


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{x}"' for x in items) + "]"


def _stack_training_keys(plan: Plan) -> list[str]:
    """The gradient reduction dtype the plan's stack priced (FSDP2's reduce dtype)."""
    if plan.stack is None:
        return []
    reduce = "float32" if plan.stack.grad_dtype == "fp32" else "bfloat16"
    return [f'mixed_precision_reduce = "{reduce}"\n']


def render(plan: Plan) -> dict[str, str]:
    par, m = plan.parallel, plan.model
    shard = par.zero >= 3 or par.tp > 1 or par.pp > 1
    local_batch = par.micro_batch * par.num_microbatches if par.pp > 1 else par.micro_batch
    model_name, flavor = FLAVORS.get(m.name, ("llama3", "SET-ME"))
    recompute = strongest_recompute(plan)
    lines = [header(plan, TARGET)]
    lines.append(f"# Model: {m.name}, {m.num_layers} blocks, hidden {m.hidden_size}, "
                 f"{m.num_attention_heads} heads ({m.num_kv_heads} KV), FFN {m.ffn_hidden_size}.\n")
    if par.tp > 1 and not par.sequence_parallel:
        lines.append("# Note: torchtitan's TP implies sequence parallelism (less activation "
                     "memory than this plan counted).\n")
    lines += ["\n[model]\n", f'name = "{model_name}"\n',
              f'flavor = "{flavor}"' + ("  # pick the flavor matching the model above"
                                        if flavor == "SET-ME" else "") + "\n",
              "\n[training]\n",
              f"local_batch_size = {local_batch}\n",
              f"global_batch_size = {par.global_batch}"
              + ("  # > local_batch_size*dp: gradient accumulation over the microbatches"
                 if par.pp == 1 and par.num_microbatches > 1 else "") + "\n",
              f"seq_len = {m.seq_length}\n",
              'mixed_precision_param = "bfloat16"\n',
              *_stack_training_keys(plan),
              "\n[parallelism]\n",
              f"tensor_parallel_degree = {par.tp}\n",
              f"pipeline_parallel_degree = {par.pp}\n",
              f"data_parallel_shard_degree = {par.dp if shard else 1}\n",
              f"data_parallel_replicate_degree = {1 if shard else par.dp}\n"]
    if shard and par.zero < 3 and par.dp > 1:
        lines.append(f'fsdp_reshard_after_forward = "never"  # ZeRO-{par.zero} plan: keep '
                     "parameters gathered between forward and backward\n")
    if par.pp > 1:
        sched = SCHEDULES.get(par.schedule, par.schedule)
        note = "  # closest to ZB-H1 available" if par.schedule == "zb-h1" else ""
        lines += [f'pipeline_parallel_schedule = "{sched}"{note}\n',
                  f"pipeline_parallel_microbatch_size = {par.micro_batch}\n",
                  f"pipeline_parallel_split_points = {_toml_list(split_points(plan))}\n"]
    lines += ["\n[activation_checkpoint]\n", f'mode = "{recompute}"\n']
    if plan.stack is not None:  # eager element-wise kernels unless the stack compiled them
        lines += ["\n[compile]\n", f"enable = {str(plan.stack.fused_elementwise).lower()}\n"]
    if recompute == "selective":
        lines.append('selective_ac_option = "op"\n')
    return {"torchtitan.toml": "".join(lines)}
