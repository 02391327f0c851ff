"""The schema of a saved plan (plan.json from ``--export json``, or ``plan solve --json`` output)
as ``plan simulate --plan`` reads it: the parallel settings and per-stage times it uses, each
checked for type, finiteness and range; the stages numbered 0, 1, ... once each, their layer
ranges non-empty; the model's name printable. A v2 plan's top-level keys are the ones v2 writes
(a misspelt or foreign key is refused with the closest one); the contents of the keys it does not
read (metrics, layout, notes, ...) are not checked, and a v1 plan is read tolerantly."""

from __future__ import annotations

from planner.core.limits import MAX_CHUNKS, MAX_MICROBATCHES
from planner.core.parallel import RECOMPUTE_MODES, SCHEDULES
from planner.core.schema import (Bool, Free, Int, Name, Num, OneOf, Text, check_list,
                                 check_object, check_value)
from planner.core.errors import PlanInputError

MAX_SECONDS = 1e9

PARALLEL = {
    "tp": Int(1, 2**20, required=True),
    "pp": Int(1, MAX_CHUNKS, required=True),
    "dp": Int(1, 2**31, required=True),
    "micro_batch": Int(1, 2**20),
    "num_microbatches": Int(1, MAX_MICROBATCHES, required=True),
    "global_batch": Int(1, 2**53),
    "schedule": OneOf(*SCHEDULES, required=True),
    "virtual_stages": Int(1, MAX_CHUNKS, required=True),
    "recompute": OneOf(*RECOMPUTE_MODES),
    "zero": Int(0, 3),
    "sequence_parallel": Bool(),
    "cp": Int(1, 2**20),
}

# The plan formats `--plan` reads: v1 (``plan solve --json``, plan.json before v2) gives each
# stage's full backward ``bwd_s`` and its weight part ``wgrad_s``; v2 (plan.json) gives the two
# parts, ``bwd_input_s`` and ``bwd_weight_s``.
PLAN_SCHEMAS = ("plan3d/plan/v1", "plan3d/plan/v2")

# The top-level keys plan.json v2 writes (planner/launchers/plan_json.py); "plans" wraps them in
# the output of `plan solve --json`.
V2_KEYS = ("schema", "plan_digest", "conventions", "model", "precision", "layers", "cluster",
           "parallel", "stages", "loss_stage", "engines", "metrics", "layout", "notes", "stack",
           "memory", "error_band")  # error_band: --json's and plan.json's, optional (fidelity/band.py)

_STAGE_COMMON = {
    "stage": Int(0, MAX_CHUNKS),
    "rank": Int(0, MAX_CHUNKS),
    "layers": Free(),
    "recompute": Text(),
    "recompute_layers": Int(1, 2**20),
    "time_s": Num(0, MAX_SECONDS),
    "fwd_s": Num(0, MAX_SECONDS, required=True),
    "send_s": Num(0, MAX_SECONDS),
    "memory_bytes": Num(0, 2**60),
}
STAGE = {"plan3d/plan/v1": {**_STAGE_COMMON, "bwd_s": Num(0, MAX_SECONDS, required=True),
                            "wgrad_s": Num(0, MAX_SECONDS, required=True)},
         "plan3d/plan/v2": {**_STAGE_COMMON, "bwd_input_s": Num(0, MAX_SECONDS, required=True),
                            "bwd_weight_s": Num(0, MAX_SECONDS, required=True)}}


def check_plan_document(doc, origin: str) -> tuple[str, dict, list[dict]]:
    """(schema, parallel, stages) of a plan JSON, or of the best plan of ``plan solve --json``
    output."""
    if isinstance(doc, dict) and "plans" in doc:
        plans = doc["plans"]
        if not isinstance(plans, list) or not plans:
            raise PlanInputError(f"{origin}: holds no plans (nothing fitted when it was "
                                 "written); solve again")
        doc, origin = plans[0], f"{origin}: plans[0]"
    if not isinstance(doc, dict):
        raise PlanInputError(f"{origin}: expected a plan3d plan JSON object; write one with "
                             "plan solve --export json --out DIR")
    schema = doc.get("schema")
    if not isinstance(schema, str) or not schema.startswith("plan3d/plan/"):
        raise PlanInputError(f"{origin}: not a plan3d plan JSON (its 'schema' is not "
                             "plan3d/plan/...); write one with plan solve --export json --out DIR")
    if schema not in PLAN_SCHEMAS:
        raise PlanInputError(f"{origin}: plan schema {schema!r} is not one this plan3d reads "
                             f"({', '.join(PLAN_SCHEMAS)}); export the plan again with "
                             "plan solve --export json")
    for key in ("parallel", "stages"):
        if key not in doc:
            raise PlanInputError(f"{origin}: missing '{key}'; write the plan again with "
                                 "plan solve --export json --out DIR")
    if schema == "plan3d/plan/v2":
        check_object(doc, {key: Free() for key in V2_KEYS}, origin, "plan", tolerant=False)
    model = doc.get("model")
    if isinstance(model, dict) and "name" in model:  # printed in the summary and the Gantt
        check_value(model["name"], Name(), f"{origin}: model 'name'")
    par = check_object(doc["parallel"], PARALLEL, f"{origin}: parallel", "plan's parallel",
                       tolerant=True)
    chunks = par["pp"] * par["virtual_stages"]
    if chunks > MAX_CHUNKS:
        raise PlanInputError(f"{origin}: pp x virtual_stages = {chunks} chunks; at most "
                             f"{MAX_CHUNKS}")
    stages = check_list(doc["stages"], f"{origin}: 'stages'", "stage objects", MAX_CHUNKS)
    checked = [check_object(s, STAGE[schema], f"{origin}: stages[{i}]", "plan stage", tolerant=True)
               for i, s in enumerate(stages)]
    if len(checked) != chunks:
        raise PlanInputError(f"{origin}: {len(checked)} stages, but pp x virtual_stages = "
                             f"{chunks}; the plan is inconsistent")
    _check_stage_order(stages, origin)
    return schema, par, checked


def _check_stage_order(stages: list[dict], origin: str) -> None:
    """Stage numbers, where given, are 0, 1, ... in order (the simulator reads the list in
    order: a repeated or shuffled number means the file was edited into another plan), and each
    stage's layer range, where given, holds at least one layer."""
    for i, stage in enumerate(stages):
        if "stage" in stage and stage["stage"] != i:
            raise PlanInputError(f"{origin}: stages[{i}] is numbered {stage['stage']!r}; the "
                                 "stages must be numbered 0, 1, ... in order, once each")
        layers = stage.get("layers")
        if isinstance(layers, dict) and {"start", "stop"} <= set(layers):
            start, stop = layers["start"], layers["stop"]
            if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start < stop):
                raise PlanInputError(f"{origin}: stages[{i}] layers run from {start!r} to "
                                     f"{stop!r}; a stage holds layers start <= i < stop, at "
                                     "least one")
