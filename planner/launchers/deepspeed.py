"""DeepSpeed: ``ds_config.json`` and, with pp > 1, ``deepspeed_pipeline.py`` with the stage split.

Targets DeepSpeed 0.19.8 (``deepspeed.pipe.PipelineModule``; JSON config keys
``train_batch_size``, ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``,
``zero_optimization.stage``, ``bf16.enabled``, ``optimizer.type/params``, ``gradient_clipping``,
``steps_per_print``).

Checked in ``deepspeed/runtime/pipe/module.py``, ``engine.py`` and ``runtime/utils.py``:
``partition_method`` is ``"uniform"``, ``"parameters"`` or ``"type:REGEX"`` (``"profile"``
raises NotImplementedError). ``type:REGEX`` gives weight 1 to every layer whose class name
matches REGEX (case-insensitive) and 0 to the others, then ``partition_balanced`` splits the
weights by dynamic programming over (layers, parts), minimising the largest minus the smallest
part sum, a later split point winning a tie, and the plain uniform split when there are no more
layers than parts. When that reproduces the plan's boundaries (the usual split: equal blocks per
stage, embedding first, head last) the generated file uses the public ``type:`` method; otherwise
it overrides the private ``_partition_layers`` (pin your DeepSpeed version then). Rules: the
PipelineEngine asserts ZeRO stage < 2 ("ZeRO-2 and ZeRO-3 are incompatible with pipeline
parallelism"); it always runs its own 1F1B ``TrainSchedule`` with one chunk per rank, so GPipe,
interleaved and zero-bubble plans are refused; activation checkpointing is per layer
(``activation_checkpoint_interval``), so there is no selective recompute.
"""

from __future__ import annotations

import json

from planner.launchers.common import (Facts, header, launched_recompute, moe_problems,
                                      recompute_problems, schedule_basics, structure_problems,
                                      tp_divisibility)
from planner.predict.plan import Plan

TARGET = "DeepSpeed 0.19.8 (deepspeed.initialize config, deepspeed.pipe.PipelineModule)"
NAME = "DeepSpeed"
GRADIENT_CLIPPING = 1.0
STEPS_PER_PRINT = 10
# AdamW as Llama 2 was trained (Touvron et al. 2023, section 2.2: "beta1 = 0.9, beta2 = 0.95,
# eps = 10^-5 ... weight decay of 0.1"; peak learning rate 3.0 x 10^-4 for 7B, Table 1). The plan
# counts Adam's fp32 state; the values are a starting point to tune, not part of the plan.
OPTIMIZER = {"type": "AdamW",
             "params": {"lr": 3.0e-4, "betas": [0.9, 0.95], "eps": 1.0e-5, "weight_decay": 0.1}}
BLOCK_TYPE = "Block"  # the regex partition_method='type:...' matches against layer class names


def parallel_rules(f: Facts) -> list[str]:
    """DeepSpeed's rules over plain values (TP itself comes from a Megatron-style mpu)."""
    out = tp_divisibility(f.tp, f.num_heads, f.num_kv_heads, f.ffn, None, NAME)
    out += schedule_basics(f.pp, f.schedule, f.virtual_stages, f.sequence_parallel, f.tp, NAME)
    if f.pp > 1 and f.zero >= 2:
        out.append(f"{NAME}: the pipeline engine supports ZeRO stage <= 1 (ZeRO-2/3 are "
                   f"incompatible with pipeline parallelism); got zero={f.zero} with pp={f.pp}")
    if f.pp > 1 and f.schedule != "1f1b":
        out.append(f"{NAME}: the pipeline engine runs its own 1F1B TrainSchedule only; a "
                   f"{f.schedule} plan would run as 1F1B; plan with --schedule 1f1b")
    if f.recompute == "selective":
        out.append(f"{NAME}: PipelineModule checkpoints whole layers; selective recompute is "
                   "not available (use full or none)")
    if f.cp > 1:
        out.append(f"{NAME}: no context parallelism in this export (DeepSpeed splits sequences "
                   "only with Ulysses, deepspeed.sequence.layer.DistributedAttention, which the "
                   "model code must call); plan with --cp 1 or export for megatron")
    return out


def check(plan: Plan) -> list[str]:
    par, m = plan.parallel, plan.model
    return structure_problems(plan) + recompute_problems(plan, NAME, block_method=False) + \
        parallel_rules(Facts.of(par, m)) + precision_rules(
        m, plan.stack) + moe_problems(plan, NAME, "export it with --export megatron")


def precision_rules(model, stack) -> list[str]:
    """DeepSpeed's config has no FP8 training setting: FP8 plans are refused."""
    if stack is not None and stack.precision == "fp8":
        return [f"{NAME}: the DeepSpeed config has no FP8 training setting (bf16 and fp16 "
                "sections only); plan with --precision bf16, or for megatron"]
    return []


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
        "optimizer": OPTIMIZER,
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


def uniform_parts(items: int, num_parts: int) -> list[int]:
    """DeepSpeed's uniform split: ``items // parts`` each, the first ``items % parts`` one more;
    with no more items than parts, one each and the rest empty."""
    if items <= num_parts:
        return [min(p, items) for p in range(num_parts + 1)]
    size, extra = divmod(items, num_parts)
    return [p * size + min(p, extra) for p in range(num_parts + 1)]


def balanced_parts(weights: list[int], num_parts: int) -> list[int]:
    """The boundaries DeepSpeed's ``partition_balanced`` picks (see the module docstring):
    least (largest - smallest part sum), ties to the later split point."""
    n = len(weights)
    if n <= num_parts:
        return uniform_parts(n, num_parts)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    # state[i][j]: (cost, largest, smallest, split) for the first i layers in j parts
    state = [[(inf, inf, inf, 0)] * (num_parts + 1) for _ in range(n + 1)]
    state[0][0] = (0.0, 0.0, inf, 0)
    for i in range(1, n + 1):
        for j in range(1, min(i, num_parts) + 1):
            best = state[i][j]
            for k in range(i):
                part = prefix[i] - prefix[k]
                high, low = max(state[k][j - 1][1], part), min(state[k][j - 1][2], part)
                if best[0] >= high - low:
                    best = (high - low, high, low, k)
            state[i][j] = best
    bounds = [n]
    for j in range(num_parts, 0, -1):
        bounds.append(state[bounds[-1]][j][3])
    return bounds[::-1]


def partition_method(plan: Plan) -> str | None:
    """``type:<BLOCK_TYPE>`` when DeepSpeed's balanced split of the blocks is the plan's split."""
    weights = [1 if layer.kind == "block" else 0 for layer in plan.model.layers]
    if any(weights) and balanced_parts(weights, len(plan.stages)) == parts(plan):
        return f"type:{BLOCK_TYPE}"
    return None


def entry(plan: Plan) -> dict:
    """plan.json's ``engines.deepspeed``: the split it takes, or the rule the plan breaks."""
    problems = check(plan)
    if problems:
        return {"target": TARGET, "supported": False, "rule": problems[0]}
    return {"target": TARGET, "supported": True, "num_stages": plan.parallel.pp,
            "parts": parts(plan), "partition_method": partition_method(plan),
            "block_type": BLOCK_TYPE}


def _pipeline_py(plan: Plan) -> str:
    par = plan.parallel
    names = {"embedding": "embedding", "block": "block", "head": "head (norm + output + loss)",
             "linear": "linear"}
    kinds = [layer.kind for layer in plan.model.layers]
    # DeepSpeed's PipelineModule checkpoints every run of activation_checkpoint_interval layers
    # (deepspeed/runtime/pipe/module.py forward: ``for start_idx in range(0, num_layers,
    # self.activation_checkpoint_interval)``): all blocks or none (check() refuses the rest)
    interval = 1 if launched_recompute(plan).mode == "full" else 0
    stage_lines = "".join(
        f"#   stage {s.stage}: layers [{s.first}, {s.last}) = {s.last - s.first} layers, "
        f"first {names[kinds[s.first]]}, last {names[kinds[s.last - 1]]}\n" for s in plan.stages)
    method = partition_method(plan)
    head = (header(plan, TARGET)
            + "# The plan's pipeline stage boundaries for deepspeed.pipe.PipelineModule.\n"
            "# Your layer list must match the plan's: index 0 the embedding, 1..N the transformer\n"
            "# blocks, N+1 the head.\n"
            + stage_lines
            + ("# tp > 1: pass a Megatron-style topology/mpu (e.g. Megatron-DeepSpeed) for TP.\n"
               if par.tp > 1 else ""))
    common = (f"PARTS = {parts(plan)}\n"
              f"NUM_STAGES = {par.pp}\n"
              f"ACTIVATION_CHECKPOINT_INTERVAL = {interval}  # 1: full recompute of every layer\n")
    if method is not None:
        return (head
                + "# DeepSpeed's public partition_method reproduces this split: it balances the\n"
                "# layers whose class name matches BLOCK_TYPE (case-insensitive regex), so name\n"
                "# your transformer block class to match it and no other layer class.\n"
                "\nfrom deepspeed.pipe import PipelineModule\n\n"
                + common
                + f'BLOCK_TYPE = "{BLOCK_TYPE}"\n'
                'PARTITION_METHOD = f"type:{BLOCK_TYPE}"\n\n\n'
                "def planned_pipeline_module(layers, loss_fn, **kwargs):\n"
                "    \"\"\"PipelineModule split at the plan's stage boundaries.\"\"\"\n"
                "    module = PipelineModule(layers=layers, num_stages=NUM_STAGES, loss_fn=loss_fn,\n"
                "                            partition_method=PARTITION_METHOD,\n"
                "                            activation_checkpoint_interval="
                "ACTIVATION_CHECKPOINT_INTERVAL, **kwargs)\n"
                "    if module.parts != PARTS:\n"
                "        raise ValueError(f\"DeepSpeed split the layers at {module.parts}, the plan "
                "at {PARTS}\")\n"
                "    return module\n\n\n"
                "# model = planned_pipeline_module(layer_specs, loss_fn)\n"
                "# engine, *_ = deepspeed.initialize(model=model, config=\"ds_config.json\", ...)\n")
    return (head
            + "# DeepSpeed's public partition methods (uniform, parameters, type:REGEX) do not\n"
            "# give this split, so PlannedPipelineModule overrides the private\n"
            "# PipelineModule._partition_layers; pin your DeepSpeed version.\n"
            "\nfrom deepspeed.pipe import PipelineModule\n\n"
            + common + "\n\n"
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
