"""DeepSpeed: ``ds_config.json``; with pp > 1 ``deepspeed_pipeline.py`` (the stage split and
the checkpointed layers), with pp = 1 and full recompute ``deepspeed_recompute.py``.

Targets DeepSpeed 0.19.8 (``deepspeed.pipe.PipelineModule``; JSON config keys
``train_batch_size``, ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``,
``zero_optimization.stage/overlap_comm``, ``bf16.enabled``, ``data_types.grad_accum_dtype``,
``optimizer.type/params``, ``gradient_clipping``, ``steps_per_print``).

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

What DeepSpeed 0.19.8 runs with bf16 (engine.py ``_do_optimizer_sanity_check``), and so what
the export writes: ZeRO-1 with ``grad_accum_dtype`` fp32 runs ``BF16_Optimizer`` ("if
model_dtype == torch.bfloat16 and grad_accum_dtype == torch.float32 and
self.zero_optimization_stage() == 1 and not self.zero_cpu_offload(): ... return BFLOAT16"); any
other ZeRO stage runs the ZeRO optimizer ("return ZERO_OPTIMIZATION": DeepSpeedZeroOptimizer,
DeepSpeedZeroOptimizer_Stage3); without ZeRO a bf16 accumulation dtype runs ``BF16_Optimizer``
under the pipeline engine ("if model_dtype == torch.bfloat16 and self.pipeline_parallelism: ...
return BFLOAT16") and ``FP16_Optimizer`` in bf16 otherwise ("return FP16 if model_dtype ==
torch.float16 else DDP_BFLOAT16"), and an fp32 one raises ("raise NotImplementedError(f\"unsupported
mix of {model_dtype=} and {grad_accum_dtype=}\")"). BF16_Optimizer shards the fp32 master and
Adam state over DP (bf16_optimizer.py: "partition_size = self.bf16_groups_flat[i].numel() //
real_dp_world_size"), which no ZeRO-0 price holds: a pp > 1 ZeRO-0 plan is refused (plan ZeRO-1).
"""

from __future__ import annotations

import json

from planner.launchers.common import (Facts, header, launched_recompute, moe_problems,
                                      recompute_problems, schedule_basics, structure_problems,
                                      tp_divisibility)
from planner.core.schedules import find_schedule
from planner.predict.plan import Plan

TARGET = ("DeepSpeed 0.19.8 (deepspeed.initialize config, deepspeed.pipe.PipelineModule, "
          "deepspeed.checkpointing)")
NAME = "DeepSpeed"
GRADIENT_CLIPPING = 1.0
STEPS_PER_PRINT = 10
# AdamW as Llama 2 was trained (Touvron et al. 2023, section 2.2: "beta1 = 0.9, beta2 = 0.95,
# eps = 10^-5 ... weight decay of 0.1"; peak learning rate 3.0 x 10^-4 for 7B, Table 1). The plan
# counts Adam's fp32 state; the values are a starting point to tune, not part of the plan.
OPTIMIZER = {"type": "AdamW",
             "params": {"lr": 3.0e-4, "betas": [0.9, 0.95], "eps": 1.0e-5, "weight_decay": 0.1}}
# The class name of the transformer block: partition_method='type:...' matches it as a regex,
# and PipelineModule checkpoints only layers whose class name is in checkpointable_layers
# (pipe/module.py _is_checkpointable: "return all(f.__class__.__name__ in
# self.checkpointable_layers for f in funcs)"), so the embedding and head never recompute
BLOCK_TYPE = "Block"
RECOMPUTE_FILE = "deepspeed_recompute.py"
# the ZeRO stage at which DeepSpeed 0.19.8 accepts an fp32 gradient accumulation with bf16
# weights and runs BF16_Optimizer (see the module docstring)
FP32_ACCUMULATION_ZERO = 1


def parallel_rules(f: Facts) -> list[str]:
    """DeepSpeed's rules over plain values."""
    out = tp_divisibility(f.tp, f.num_heads, f.num_kv_heads, f.ffn, None, NAME)
    out += schedule_basics(f.pp, f.schedule, f.virtual_stages, f.sequence_parallel, f.tp, NAME)
    if f.tp > 1:
        out.append(f"{NAME}: plain DeepSpeed has no tensor parallelism (without Megatron-"
                   f"DeepSpeed's mpu it runs the tp={f.tp} ranks as data parallel); plan with "
                   "--tp 1, or export for megatron")
    if f.pp > 1 and f.zero >= 2:
        out.append(f"{NAME}: the pipeline engine supports ZeRO stage <= 1 (ZeRO-2 and ZeRO-3 are "
                   f"incompatible with pipeline parallelism); got zero={f.zero} with pp={f.pp}")
    if f.pp > 1 and f.zero == 0:
        out.append(f"{NAME}: with pp > 1 and no ZeRO, DeepSpeed runs BF16_Optimizer, which "
                   "shards the fp32 master and Adam state over DP as ZeRO-1 does; plan with "
                   "--zero 1")
    if f.pp > 1 and not getattr(find_schedule(f.schedule), "deepspeed", False):
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
        parallel_rules(Facts.of(par, m)) + precision_rules(m, plan.stack) + \
        accumulation_rules(plan) + moe_problems(plan, NAME, "export it with --export megatron")


def precision_rules(model, stack) -> list[str]:
    """DeepSpeed's config has no FP8 training setting: FP8 plans are refused."""
    if stack is not None and stack.precision == "fp8":
        return [f"{NAME}: the DeepSpeed config has no FP8 training setting (bf16 and fp16 "
                "sections only); plan with --precision bf16, or for megatron"]
    return []


def accumulation_rules(plan: Plan) -> list[str]:
    """A stack that prices an fp32 gradient accumulation buffer where DeepSpeed 0.19.8 runs
    none (or raises) is refused: only ZeRO-1's BF16_Optimizer holds the one priced."""
    stack, zero = plan.stack, plan.parallel.zero
    if stack is None or not stack.fp32_accumulation(zero) or zero == FP32_ACCUMULATION_ZERO:
        return []
    return [f"{NAME}: the {stack.name} stack prices an fp32 gradient accumulation buffer at "
            f"ZeRO-{zero}, which DeepSpeed 0.19.8 runs only at ZeRO-1 (BF16_Optimizer); plan "
            "with --zero 1 or a stack without it"]


def grad_accum_dtype(plan: Plan) -> str:
    """The gradient accumulation dtype the engine runs: fp32 where the stack prices the fp32
    buffer (data_types.grad_accum_dtype), else the weights' 16-bit dtype (engine.py
    get_data_types: "if self._config.grad_accum_dtype is None: grad_accum_dtype = model_dtype")."""
    stack = plan.stack
    if stack is not None and stack.fp32_accumulation(plan.parallel.zero):
        return "fp32"
    return stack.param_dtype if stack is not None else "bf16"


def optimizer_wrapper(plan: Plan) -> str:
    """The class DeepSpeed 0.19.8 wraps the optimizer in for an exportable bf16 plan (module
    docstring; pp > 1 without ZeRO is refused)."""
    zero = plan.parallel.zero
    if zero == 0:
        return "FP16_Optimizer"  # DDP_BFLOAT16: _configure_fp16_optimizer(..., torch.bfloat16)
    if zero == FP32_ACCUMULATION_ZERO and grad_accum_dtype(plan) == "fp32":
        return "BF16_Optimizer"
    return "DeepSpeedZeroOptimizer_Stage3" if zero == 3 else "DeepSpeedZeroOptimizer"


def checkpointed_layers(plan: Plan) -> list[int]:
    """The layers the exported files checkpoint: every block of a full-recompute plan."""
    setting = launched_recompute(plan)
    if setting is None or setting.mode != "full":
        return []
    return [i for i, layer in enumerate(plan.model.layers) if layer.kind == "block"]


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
    if grad_accum_dtype(plan) == "fp32":  # ZeRO-1's BF16_Optimizer, as priced
        doc["data_types"] = {"grad_accum_dtype": "fp32"}
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
            "block_type": BLOCK_TYPE, "optimizer": optimizer_wrapper(plan),
            "grad_accum_dtype": grad_accum_dtype(plan),
            "checkpointed_layers": checkpointed_layers(plan)}


def _stage_lines(plan: Plan) -> str:
    names = {"embedding": "embedding", "block": "block", "head": "head (norm + output + loss)",
             "linear": "linear"}
    kinds = [layer.kind for layer in plan.model.layers]
    return "".join(
        f"#   stage {s.stage}: layers [{s.first}, {s.last}) = {s.last - s.first} layers, "
        f"first {names[kinds[s.first]]}, last {names[kinds[s.last - 1]]}, "
        f"recompute {s.recompute_label}\n" for s in plan.stages)


def _pipeline_py(plan: Plan) -> str:
    par = plan.parallel
    # DeepSpeed's PipelineModule checkpoints every run of activation_checkpoint_interval layers
    # whose classes are all in checkpointable_layers (pipe/module.py forward: "for start_idx,
    # is_checkpointable_result in zip(range(0, num_layers, self.activation_checkpoint_interval),
    # self.is_checkpointable_results)"): interval 1 and [BLOCK_TYPE] recompute every block and
    # never the embedding or the head, as priced (check() refuses any other recompute)
    interval = 1 if launched_recompute(plan).mode == "full" else 0
    method = partition_method(plan)
    head = (header(plan, TARGET)
            + "# The plan's pipeline stage boundaries for deepspeed.pipe.PipelineModule.\n"
            "# Your layer list must match the plan's: index 0 the embedding, 1..N the transformer\n"
            "# blocks, N+1 the head. Name the transformer block class exactly BLOCK_TYPE, and\n"
            "# no other layer class: PipelineModule checkpoints only the layers whose class\n"
            "# name is in CHECKPOINTABLE_LAYERS.\n"
            + _stage_lines(plan))
    common = (f"PARTS = {parts(plan)}\n"
              f"NUM_STAGES = {par.pp}\n"
              f"ACTIVATION_CHECKPOINT_INTERVAL = {interval}  # 1: every block recomputes\n"
              f'BLOCK_TYPE = "{BLOCK_TYPE}"\n'
              "CHECKPOINTABLE_LAYERS = [BLOCK_TYPE]  # never the embedding or the head\n")
    build = ("def planned_pipeline_module(layers, loss_fn, **kwargs):\n"
             "    \"\"\"PipelineModule split at the plan's stage boundaries.\"\"\"\n"
             "    module = {cls}(layers=layers, num_stages=NUM_STAGES, loss_fn=loss_fn,{method}\n"
             "        activation_checkpoint_interval=ACTIVATION_CHECKPOINT_INTERVAL,\n"
             "        checkpointable_layers=CHECKPOINTABLE_LAYERS, **kwargs)\n"
             "    if module.parts != PARTS:\n"
             "        raise ValueError(f\"DeepSpeed split the layers at {{module.parts}}, the plan "
             "at {{PARTS}}\")\n"
             "    return module\n\n\n"
             "# model = planned_pipeline_module(layer_specs, loss_fn)\n"
             "# engine, *_ = deepspeed.initialize(model=model, config=\"ds_config.json\",\n"
             "#                                   model_parameters=model.parameters())\n")
    if method is not None:
        return (head
                + "# DeepSpeed's public partition_method reproduces this split: it balances the\n"
                "# layers whose class name matches BLOCK_TYPE (case-insensitive regex).\n"
                "\nfrom deepspeed.pipe import PipelineModule\n\n"
                + common
                + 'PARTITION_METHOD = f"type:{BLOCK_TYPE}"\n\n\n'
                + build.format(cls="PipelineModule",
                               method="\n        partition_method=PARTITION_METHOD,"))
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
            + build.format(cls="PlannedPipelineModule", method=""))


def _recompute_py(plan: Plan) -> str:
    """pp = 1, full recompute: no PipelineModule (the pipeline engine refuses ZeRO-2/3), so
    the blocks are wrapped in deepspeed.checkpointing.checkpoint, DeepSpeed's reentrant
    checkpoint (activation_checkpointing/checkpointing.py: "CheckpointFunction.apply(function,
    all_outputs, *args)"). The ds_config ``activation_checkpointing`` section is not written:
    it is read only by ``deepspeed.checkpointing.configure(mpu, deepspeed_config=...)``
    ("config = DeepSpeedConfig(config, mpu=mpu).activation_checkpointing_config"), which the
    engine never calls, and none of its keys chooses which layers recompute."""
    return (header(plan, TARGET)
            + "# Full recompute of every transformer block, as priced (embedding and head keep\n"
            "# their activations). Call checkpoint_blocks(layers) on the model's top-level layer\n"
            "# list (embedding, blocks, head) before deepspeed.initialize.\n"
            + _stage_lines(plan)
            + "\nimport deepspeed\n\n"
            f'BLOCK_TYPE = "{BLOCK_TYPE}"  # the class name of the transformer block\n'
            f"BLOCKS = {sum(1 for layer in plan.model.layers if layer.kind == 'block')}\n\n\n"
            "def _checkpointed(forward):\n"
            "    def run(*args):\n"
            "        return deepspeed.checkpointing.checkpoint(forward, *args)\n"
            "    return run\n\n\n"
            "def checkpoint_blocks(layers):\n"
            "    \"\"\"Recompute every BLOCK_TYPE layer in the backward; the others are untouched.\"\"\"\n"
            "    blocks = [layer for layer in layers if type(layer).__name__ == BLOCK_TYPE]\n"
            "    if len(blocks) != BLOCKS:\n"
            "        raise ValueError(f\"the plan has {BLOCKS} {BLOCK_TYPE} layers, got {len(blocks)}\")\n"
            "    for block in blocks:\n"
            "        # the weights must sit in submodules: ZeRO-3 gathers a module's own weights\n"
            "        # in its forward hook, which the recompute (forward called directly) skips\n"
            "        if any(True for _ in block.parameters(recurse=False)):\n"
            "            raise ValueError(f\"{BLOCK_TYPE} holds weights itself; keep them in \"\n"
            "                             \"submodules\")\n"
            "        block.forward = _checkpointed(block.forward)\n"
            "    return blocks\n")


def render(plan: Plan) -> dict[str, str]:
    """ds_config.json (plain JSON: DeepSpeed reads no comments); with pp > 1 the split and its
    checkpointed layers, with pp = 1 and full recompute the blocks' checkpointing."""
    files = {"ds_config.json": json.dumps(config(plan), indent=2) + "\n"}
    if plan.parallel.pp > 1:
        files["deepspeed_pipeline.py"] = _pipeline_py(plan)
    elif checkpointed_layers(plan):
        files[RECOMPUTE_FILE] = _recompute_py(plan)
    return files
