"""A published case's software stack: its bundled stack running its named components, with its
quoted launch flags and what its own configuration sets (FP8, the routed expert load), and the
notes saying what that stack does that moves the prediction."""

from __future__ import annotations

from planner.core.errors import PlanInputError
from planner.stack import userbuffers
from planner.stack import Stack, load_stack, with_components, with_overrides


def case_stack(case: dict, stack: Stack | None = None) -> Stack:
    """The case's own stack (its bundled ``stack`` running its ``components``, with its
    ``stack_overrides``: launch flags its source quotes), or ``stack`` for every case when
    given."""
    name = case.get("name", "a case")
    if stack is None:
        if "stack" not in case:
            raise PlanInputError(f"{name}: no 'stack'; every case names the stack it ran on "
                                 "(`plan stacks` lists them)")
        overrides = case.get("stack_overrides") or {}
        if not isinstance(overrides, dict):
            raise PlanInputError(f"{name}: 'stack_overrides' must be an object of stack fields")
        stack = with_components(load_stack(case["stack"]), case.get("components") or [],
                                f"{name}: components")
        stack = with_overrides(stack, f"{name}: stack_overrides", **overrides)
    return with_overrides(stack, f"{name}: config", **run_options(case))


def run_options(case: dict) -> dict:
    """Stack fields the run's own configuration sets, whatever stack it is priced on: FP8
    linears where its ``precision`` names fp8 or Float8 (Transformer Engine under NeMo, torchao
    Float8 under torchtitan), each priced with its stack's recipe (cost/precision.py); the
    routed load of its busiest GPU where it states one (``expert_load``: a property of the
    model's routing on its data, as `plan solve --expert-load`, not of the software)."""
    config = case.get("config") or {}
    precision = str(config.get("precision") or "").lower()
    options = {"precision": "fp8"} if "fp8" in precision or "float8" in precision else {}
    if config.get("expert_load") is not None:
        options["moe_expert_load"] = config["expert_load"]
    return options


def stack_notes(cf: dict, opts: Stack) -> list[str]:
    """What the case's stack does beyond the defaults that moves its prediction, said once."""
    zero3 = int(cf.get("zero") or 0) >= 3
    notes = []
    if opts.precision == "fp8":  # set by run_options
        notes.append(f"FP8 block GEMMs, {opts.fp8_recipe} scaling (the stack's recipe)")
        if opts.fp8_all_gather and zero3:
            notes.append("ZeRO-3 gathers FP8 weights")
        if opts.fp8_params and not zero3:
            notes.append("FP8 primary weights: no 16-bit copy, gathered in FP8")
    if opts.zero3_pipeline_hold and zero3 and int(cf["pp"]) > 1:
        notes.append("ZeRO-3 weights and gradients held unsharded through the step (PP)")
    if opts.tp_comm_overlap and int(cf["tp"]) > 1:
        notes.append("TP overlap: Transformer Engine userbuffers per GEMM (" + userbuffers.summary(
            opts.tp_overlap_ub) + ")" if opts.tp_overlap_ub is not None else
            f"TP overlap hides {opts.tp_overlap_hidden:.0%} of the TP collectives")
    return notes
