"""The schema of a published-runs file (``plan validate FILE``): a list of cases, each with its
model, cluster, parallel configuration and measurements. The bundled files
(profiles/validation/*.json) define the keys; a misspelled one is refused, not read as missing."""

from __future__ import annotations

from planner.core.schema import (Bool, Free, Int, Name, Num, OneOf, Text, check_list,
                                 check_object)
from planner.core.errors import PlanInputError
from planner.core.limits import MAX_CHUNKS, MAX_GPUS, MAX_GPUS_PER_NODE, MAX_MICROBATCHES
from planner.model.schema import MAX_FFN, MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_SEQ, MAX_VOCAB

# Runs in one file. `plan validate` simulates each run (~0.06 s of CPU for a bundled one on a
# 2-core machine), so 256 runs take seconds, where 10,000 took minutes (issue #31); the bundled
# files hold 41, 34 and 7.
MAX_CASES = 256
_COUNT = 2**31  # batches: far beyond any published run
_RATE = 1e18  # tokens/s, TFLOP/s, PFLOP/s, GB/s

MODEL = {
    "layers": Int(1, MAX_LAYERS, required=True),
    "hidden": Int(1, MAX_HIDDEN, required=True),
    "heads": Int(1, MAX_HEADS, required=True),
    "kv_heads": Int(1, MAX_HEADS, nullable=True),
    "ffn_hidden": Int(1, MAX_FFN, required=True),
    "vocab": Int(1, MAX_VOCAB, nullable=True),
    "seq_len": Int(1, MAX_SEQ, required=True),
    "params_b": Num(0, 1e6, low_open=True, nullable=True),
    "mlp": Text(nullable=True),
    # an MoE case's model: a HuggingFace config under profiles/validation/configs/ (moe_runs.json)
    "hf_config": Name(nullable=True),
}

CLUSTER = {
    "gpu": Name(nullable=True),
    "gpus": Int(1, MAX_GPUS, required=True),  # core/limits.py, as plan solve --gpus
    "gpus_per_node": Int(1, MAX_GPUS_PER_NODE, required=True),
    "hbm_gb": Num(0, 1e6, low_open=True, nullable=True),
    # the source's own HBM bandwidth where its part differs from the bundled profile's (GB/s)
    "hbm_GBps": Num(0, 1e6, low_open=True, nullable=True),
    "peak_tflops_bf16": Num(0, 1e6, low_open=True, required=True),
    # the board power limit the source ran at, where below the part's rated power (watts)
    "power_limit_w": Num(0, 1e5, low_open=True, nullable=True),
    "intra_node_GBps": Num(0, 1e6, low_open=True, required=True),
    "inter_node_GBps": Num(0, 1e6, low_open=True, nullable=True),
    "network": Text(nullable=True),
}

CONFIG = {
    "tp": Int(1, 4096, required=True),
    "pp": Int(1, MAX_CHUNKS, required=True),  # a stage is at least one chunk
    "dp": Int(1, MAX_GPUS, required=True),
    "cp": Int(1, 4096, nullable=True),
    "ep": Int(1, 4096, nullable=True),
    "etp": Int(1, 4096, nullable=True),
    "micro_batch": Int(1, 2**20, nullable=True),
    "global_batch": Int(1, _COUNT, required=True),
    "batch_size_per_dp": Int(1, _COUNT, nullable=True),
    "local_batch": Int(1, _COUNT, nullable=True),
    "grad_accum": Int(1, _COUNT, nullable=True),
    "schedule": Text(nullable=True),
    "virtual_stages": Free(),  # a count, or a sentence such as "max: one transformer layer ..."
    "recompute": Text(nullable=True),
    "zero": Int(0, 3, nullable=True),
    "sequence_parallel": Bool(nullable=True),
    "flash_attention": Bool(nullable=True),
    "overlap": Text(nullable=True),
    "precision": Text(nullable=True),
    "techniques": Text(nullable=True),
    # MoE: routed tokens on the busiest GPU over the mean, where the source states or measures
    # it (the stack field moe_expert_load's range, planner/stack/spec.py)
    "expert_load": Num(1.0, 64.0, nullable=True),
    # blocks per pipeline stage where the source gives the split (MoE cases, cases.py
    # stage_bounds); the embedding joins the first stage and the head the last
    "stage_blocks": Free(),
}

# A measured step's seconds. At least 100 us: a training step (forward, backward, optimizer)
# launches hundreds of kernels of a few us each, so no real one is shorter; the bundled runs take
# 0.85-160 s. Calibration fits log(predicted / measured): at 1e-300 s the fit overflowed exp().
# At most 10^9 s (32 years).
MIN_STEP_S = 1e-4

MEASURED = {
    "step_time_s": Num(MIN_STEP_S, 1e9, required=True),
    "tokens_per_s": Num(0, _RATE, low_open=True, nullable=True),
    "tokens_per_s_per_gpu": Num(0, _RATE, low_open=True, nullable=True),
    "samples_per_s": Num(0, _RATE, low_open=True, nullable=True),
    "samples_per_gpu_per_s": Num(0, _RATE, low_open=True, nullable=True),
    "tflops_per_gpu": Num(0, 1e6, low_open=True, nullable=True),
    "tflops_definition": Text(nullable=True),
    "aggregate_pflops": Num(0, _RATE, low_open=True, nullable=True),
    "mfu": Num(0, 1, low_open=True, nullable=True),
    "hfu": Num(0, 1, low_open=True, nullable=True),
    "memory_gb_per_gpu": Num(0, 1e6, low_open=True, nullable=True),
    "memory_gib_per_gpu": Num(0, 1e6, low_open=True, nullable=True),
    # what the memory reading counts: "device" (nvidia-smi: everything the process holds; the
    # default) or "allocator" (PyTorch's caching-allocator reserve, torch.cuda
    # max_memory_reserved: not the CUDA context nor NCCL's own buffers; planner/fidelity)
    "memory_scope": OneOf("device", "allocator", nullable=True),
    "bubble_rate_theoretical": Num(0, 1e6, nullable=True),
}

CASE = {
    "name": Name(required=True),
    "group": Name(required=True),
    "source": Text(nullable=True),
    "reliability": Text(nullable=True),
    "notes": Text(nullable=True),
    "provenance": Free(),
    "model": Free(required=True),
    "cluster": Free(required=True),
    "config": Free(required=True),
    "measured": Free(required=True),
    "stack": Name(nullable=True),  # a bundled stack or stack file (planner/stack)
    "components": Free(),  # checked by stack.with_components
    "stack_overrides": Free(),  # checked field by field by stack.with_overrides
}


def check_runs_document(data, origin: str) -> None:
    """Refuse a runs file that breaks the schema: one line naming the case and the field."""
    if isinstance(data, list) and not data:
        raise PlanInputError(f"{origin}: the file holds no runs (an empty list); add at least "
                             "one published run")
    check_list(data, origin, "published runs", MAX_CASES)
    for n, case in enumerate(data):
        where = f"{origin}: runs[{n}]"
        try:
            values = check_object(case, CASE, where, "run")
        except PlanInputError as e:
            raise PlanInputError(f"{e} (not a published-run record)") from None
        where = f"{origin}: run '{values['name']}'"
        for key, schema in (("model", MODEL), ("cluster", CLUSTER), ("config", CONFIG),
                            ("measured", MEASURED)):
            check_object(case[key], schema, f"{where} {key}", f"run's {key}")
        _check_consistent(case, where)


def _check_consistent(case: dict, where: str) -> None:
    """What each field allows alone can still describe no run: TP splits the attention heads
    (Megatron asserts num_attention_heads % tensor_model_parallel_size == 0), the degrees
    multiply to the GPUs (tp x cp x pp x dp, experts within them), and a count is not a bool."""
    model, cluster, config = case["model"], case["cluster"], case["config"]
    tp, cp = config["tp"], config.get("cp") or 1
    if model["heads"] % tp:
        raise PlanInputError(f"{where} config: tp {tp} does not divide the model's "
                             f"{model['heads']} attention heads; TP splits the heads evenly")
    product = tp * cp * config["pp"] * config["dp"]
    if product != cluster["gpus"]:
        raise PlanInputError(f"{where}: tp x cp x pp x dp = {product}, but cluster.gpus is "
                             f"{cluster['gpus']}; the degrees multiply to the GPUs")
    v = config.get("virtual_stages")
    if isinstance(v, bool) or (not isinstance(v, (int, str)) and v is not None):
        raise PlanInputError(f"{where} config: 'virtual_stages' must be a count (a whole "
                             f"number, or a sentence saying why it is unpublished), got {v!r}")
    if isinstance(v, int) and v < 1:
        raise PlanInputError(f"{where} config: 'virtual_stages' must be at least 1, got {v}")
    if isinstance(v, int) and config["pp"] * v > MAX_CHUNKS:
        raise PlanInputError(f"{where} config: pp {config['pp']} x virtual_stages {v} = "
                             f"{config['pp'] * v:,} pipeline chunks; at most {MAX_CHUNKS} "
                             "(core/limits.py)")
    per_step = config.get("micro_batch") or 1
    microbatches = -(-config["global_batch"] // (per_step * config["dp"]))
    if microbatches > MAX_MICROBATCHES:
        raise PlanInputError(f"{where} config: global_batch {config['global_batch']} makes "
                             f"{microbatches:,} microbatches of {per_step} per DP rank; at most "
                             f"{MAX_MICROBATCHES:,} (core/limits.py)")
