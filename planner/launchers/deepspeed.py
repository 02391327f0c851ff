"""DeepSpeed: ``ds_config.json`` and, with pp > 1, ``deepspeed_pipeline.py`` with the stage split.

Targets DeepSpeed 0.14+ (``deepspeed.pipe.PipelineModule``, JSON config keys
``train_batch_size``, ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``,
``zero_optimization.stage``, ``bf16.enabled``, ``gradient_clipping``, ``steps_per_print``).

Checked in ``deepspeed/runtime/pipe/module.py`` and ``engine.py``: ``partition_method`` accepts
only ``"uniform"``, ``"parameters"`` and ``"type:REGEX"`` (``"profile"`` raises
NotImplementedError), so explicit boundaries cannot be passed as an argument. The generated
module subclasses PipelineModule and overrides ``_partition_layers`` to set ``self.parts`` (the
stage boundaries, a list of pp + 1 layer indices) -- a private method, so pin the DeepSpeed
version you test with. Rules: the PipelineEngine asserts ZeRO stage < 2 ("ZeRO-2 and ZeRO-3 are
incompatible with pipeline parallelism"); its TrainSchedule is 1F1B-style with one chunk per
rank (no interleaving, no zero-bubble); activation checkpointing is per layer
(``activation_checkpoint_interval``), so there is no selective recompute.
"""

from __future__ import annotations

import json

from planner.launchers.common import (Facts, header, schedule_basics, strongest_recompute,
                                   structure_problems, tp_divisibility)
from planner.predict.plan import Plan

TARGET = "DeepSpeed 0.14+ (deepspeed.initialize config, deepspeed.pipe.PipelineModule)"
NAME = "DeepSpeed"
GRADIENT_CLIPPING = 1.0
STEPS_PER_PRINT = 10


def parallel_rules(f: Facts) -> list[str]:
    """DeepSpeed's rules over plain values (TP itself comes from a Megatron-style mpu)."""
    out = tp_divisibility(f.tp, f.num_heads, f.num_kv_heads, f.ffn, None, NAME)
    out += schedule_basics(f.pp, f.schedule, f.virtual_stages, f.sequence_parallel, f.tp, NAME)
    if f.pp > 1 and f.zero >= 2:
        out.append(f"{NAME}: the pipeline engine supports ZeRO stage <= 1 (ZeRO-2/3 are "
                   f"incompatible with pipeline parallelism); got zero={f.zero} with pp={f.pp}")
    if f.pp > 1 and f.schedule in ("interleaved", "zb-h1"):
        out.append(f"{NAME}: the pipeline engine runs its 1F1B TrainSchedule only; "
                   f"{f.schedule} is not available")
    if f.recompute == "selective":
        out.append(f"{NAME}: PipelineModule checkpoints whole layers; selective recompute is "
                   "not available (use full or none)")
    return out


def check(plan: Plan) -> list[str]:
    par, m = plan.parallel, plan.model
    return structure_problems(plan) + parallel_rules(Facts.of(par, m))


def config(plan: Plan) -> dict:
    par, stack = plan.parallel, plan.stack
    dtype = stack.param_dtype if stack is not None else "bf16"
    zero = {"stage": par.zero}
    if stack is not None:  # what the stack assumed: overlapped reduction or not
        zero["overlap_comm"] = stack.overlap_grad_reduce
    doc = {
        "train_batch_size": par.micro_batch * par.num_microbatches * par.dp,
        "train_micro_batch_size_per_gpu": par.micro_batch,
        "gradient_accumulation_steps": par.num_microbatches,
        "zero_optimization": zero,
        "bf16": {"enabled": dtype == "bf16"},
        "gradient_clipping": GRADIENT_CLIPPING,
        "steps_per_print": STEPS_PER_PRINT,
    }
    if dtype == "fp16":
        doc["fp16"] = {"enabled": True}
    if stack is not None and stack.fp32_accumulation(par.zero):
        doc["data_types"] = {"grad_accum_dtype": "fp32"}  # BF16_Optimizer, as priced
    return doc


def parts(plan: Plan) -> list[int]:
    """PipelineModule's ``parts``: stage s holds layers[parts[s]:parts[s+1]]."""
    return [s.first for s in plan.stages] + [plan.stages[-1].last]


def _pipeline_py(plan: Plan) -> str:
    par = plan.parallel
    names = {"embedding": "embedding", "block": "block", "head": "head (norm + output + loss)",
             "linear": "linear"}
    kinds = [layer.kind for layer in plan.model.layers]
    interval = 1 if strongest_recompute(plan) == "full" else 0
    stage_lines = "".join(
        f"#   stage {s.stage}: layers [{s.first}, {s.last}) = {s.last - s.first} layers, "
        f"first {names[kinds[s.first]]}, last {names[kinds[s.last - 1]]}\n" for s in plan.stages)
    return (
        header(plan, TARGET)
        + "# Explicit pipeline stage boundaries for deepspeed.pipe.PipelineModule.\n"
        "# Your layer list must match the plan's: index 0 the embedding, 1..N the transformer\n"
        "# blocks, N+1 the head.\n"
        + stage_lines
        + "# DeepSpeed has no argument for explicit boundaries (partition_method is uniform,\n"
        "# parameters or type:REGEX), so PlannedPipelineModule overrides the private\n"
        "# PipelineModule._partition_layers; pin your DeepSpeed version.\n"
        + ("# tp > 1: pass a Megatron-style topology/mpu (e.g. Megatron-DeepSpeed) for TP.\n"
           if par.tp > 1 else "")
        + "\nfrom deepspeed.pipe import PipelineModule\n\n"
        f"PARTS = {parts(plan)}\n"
        f"NUM_STAGES = {par.pp}\n"
        f"ACTIVATION_CHECKPOINT_INTERVAL = {interval}  # 1: full recompute of every layer\n\n\n"
        "class PlannedPipelineModule(PipelineModule):\n"
        "    \"\"\"PipelineModule split at the plan's stage boundaries.\"\"\"\n\n"
        "    def _partition_layers(self, method=\"uniform\"):\n"
        "        if len(self._layer_specs) != PARTS[-1]:\n"
        "            raise ValueError(f\"plan3d plan expects {PARTS[-1]} layers, \"\n"
        "                             f\"got {len(self._layer_specs)}\")\n"
        "        self.parts = list(PARTS)\n"
        "        stage_id = self._topo.get_coord(self.global_rank).pipe\n"
        "        self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])\n\n\n"
        "# model = PlannedPipelineModule(layers=layer_specs, num_stages=NUM_STAGES,\n"
        "#                               loss_fn=loss_fn,\n"
        "#                               activation_checkpoint_interval="
        "ACTIVATION_CHECKPOINT_INTERVAL)\n"
        "# engine, *_ = deepspeed.initialize(model=model, config=\"ds_config.json\", ...)\n")


def render(plan: Plan) -> dict[str, str]:
    """ds_config.json (plain JSON: DeepSpeed reads no comments) and, with pp > 1, the split."""
    files = {"ds_config.json": json.dumps(config(plan), indent=2) + "\n"}
    if plan.parallel.pp > 1:
        files["deepspeed_pipeline.py"] = _pipeline_py(plan)
    return files
