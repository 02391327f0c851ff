"""Tables as pandas DataFrames: the plans, one plan's stages, validation rows, a profile's layers.

One frame per table, with typed columns (numbers stay numbers, in SI units: seconds, bytes,
fractions), so a notebook can sort, filter and plot them; the CSV of ``plan solve --csv`` and the
validation table of ``plan validate`` are rendered from the same frames. pandas is imported
inside each function: it costs ~0.4 s, which the CLI pays only for the commands that use a frame.
"""

from __future__ import annotations

from dataclasses import asdict

from planner.predict.plan import Plan

# The plans frame's columns, in order: the plan JSON's field names (parallel, then metrics), the
# CSV header of `plan solve --csv`, then what the table shows besides (per-stage recompute, blocks).
# Every degree is a column, 1 where plan.json leaves it out (cp; ep and etp of a dense model), so
# a row always names the GPUs it uses: tp * cp * pp * dp.
PLAN_COLUMNS = ("tp", "cp", "pp", "dp", "ep", "etp", "micro_batch", "num_microbatches", "global_batch", "schedule",
                "virtual_stages", "recompute", "zero", "sequence_parallel", "step_time_s",
                "tokens_per_s", "tflops_per_gpu", "mfu", "hfu", "peak_memory_bytes",
                "bubble_fraction", "stage_recompute", "blocks_per_stage")


def _blocks(plan: Plan) -> list[int]:
    layers = plan.model.layers
    return [sum(1 for layer in layers[s.first:s.last] if layer.kind == "block")
            for s in plan.stages]


def blocks_per_stage(plan: Plan) -> str:
    """Transformer blocks per chunk, compactly: "8x4" when even, "7|9x2|6" when only the edge
    stages differ (Megatron's first/last-stage flags), "5-9" otherwise."""
    layers = plan.model.layers
    counts = [sum(1 for layer in layers[s.first:s.last] if layer.kind == "block")
              for s in plan.stages]
    if len(set(counts)) == 1:
        return f"{counts[0]}x{len(counts)}"
    middle = counts[1:-1]
    if len(counts) > 2 and len(set(middle)) == 1:
        return f"{counts[0]}|{middle[0]}x{len(middle)}|{counts[-1]}"
    if len(counts) == 2:
        return f"{counts[0]}|{counts[1]}"
    return f"{min(counts)}-{max(counts)}"


def stage_recompute(plan: Plan) -> str:
    """The recompute modes the stages use, in order none/selective/block/full ("none/full" when
    mixed; "block": only some of a stage's blocks recompute, Megatron's block method): the
    partitioner picks one per stage, at most the plan-level mode."""
    kind = ["block" if s.recompute_layers is not None else s.recompute for s in plan.stages]
    return "/".join(m for m in ("none", "selective", "block", "full") if m in kind)


def plan_record(plan: Plan) -> dict:
    """One plan as a flat dict of the frame's columns (the plan JSON's values and rounding)."""
    d = plan.to_dict(with_layout=False)
    par = plan.parallel
    degrees = {"cp": par.cp, "ep": par.ep, "etp": par.expert_tp}
    return {**degrees, **d["parallel"], **d["metrics"], "stage_recompute": stage_recompute(plan),
            "blocks_per_stage": blocks_per_stage(plan)}


def plans_frame(plans):
    """One row per plan, best first; the index is the rank shown in the table (1 = best)."""
    import pandas as pd

    frame = pd.DataFrame([plan_record(p) for p in plans], columns=list(PLAN_COLUMNS))
    frame.index = pd.RangeIndex(1, len(frame) + 1, name="rank")
    return frame


def plans_csv(plans) -> str:
    """The plans frame as CSV (no index column: the row order is the rank)."""
    return plans_frame(plans).to_csv(index=False, lineterminator="\n")


def stages_frame(plan: Plan):
    """One row per pipeline stage (model chunk) of one plan: its layers, recompute, per-microbatch
    times and memory; ``rank_memory_bytes`` is the peak of the pipeline rank that holds it."""
    import pandas as pd

    blocks = _blocks(plan)
    rows = [{"stage": s.stage, "rank": s.rank, "first_layer": s.first, "last_layer": s.last,
             "blocks": blocks[k], "recompute": s.recompute_label, "time_s": s.time_s,
             "fwd_s": s.fwd_s, "bwd_s": s.bwd_s, "wgrad_s": s.wgrad_s, "send_s": s.send_s,
             "memory_bytes": s.memory_bytes,
             "rank_memory_bytes": (plan.rank_memory_bytes[s.rank]
                                   if plan.rank_memory_bytes else float("nan"))}
            for k, s in enumerate(plan.stages)]
    return pd.DataFrame(rows).set_index("stage")


def validation_frame(rows, held_out=()):
    """One row per published case: its fields, and the signed errors (predicted / measured - 1);
    with ``held_out`` (the same cases priced with each source held out) its step-time error as
    ``held_out_time_error``."""
    import pandas as pd

    held = {r.case: r.time_error for r in held_out}
    records = [{**asdict(r), "time_error": r.time_error, "memory_error": r.memory_error,
                **({"held_out_time_error": held.get(r.case)} if held else {})}
               for r in rows]
    return pd.DataFrame(records).set_index("case")


def profile_frame(profile):
    """One row per model layer (index = layer number): the measured passes in seconds with their
    spread (min/max over the repeats), the full shape's FLOPs and the achieved TFLOP/s."""
    import pandas as pd

    rows = []
    for i, t in enumerate(profile.layers):
        row = {"layer": i, **asdict(t)}
        row["total_s"] = t.total_s
        row["tflops"] = t.total_flops / t.total_s / 1e12 if t.total_s else 0.0
        rows.append(row)
    return pd.DataFrame(rows).set_index("layer")
