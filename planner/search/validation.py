"""The request checked before any search: pins that contradict each other, the GPU count, the
stack or the model, and limits out of range, each refused in one line (exit 2).
"""

from __future__ import annotations

from planner.core.errors import PlanInputError
from planner.cost import context
from planner.cost.recompute import selective_refusal
from planner.launchers import LAUNCHERS
from planner.model.spec import ModelSpec
from planner.core.parallel import SCHEDULES
from planner.core.schedules import schedule_traits
from planner.predict.stages import METHODS
from planner.search.request import RECOMPUTE_PINS, Pins, Request
from planner.search.rules import context_problem


def validate_pins(req: Request) -> None:
    """Pins that contradict each other or the GPU count: one line, before any search."""
    pins, gpus = req.pins, req.cluster.gpus
    for name in ("tp", "pp", "dp", "micro_batch", "virtual_stages", "cp", "ep", "etp"):
        value = getattr(pins, name)
        if value is not None and value < 1:
            raise PlanInputError(f"--{name.replace('_', '-')} must be positive, got {value}")
    fixed = [v for v in (pins.tp, pins.pp, pins.dp) if v is not None]
    prod = pins.cp or 1
    for v in fixed:
        prod *= v
    if len(fixed) == 3 and prod != gpus:
        cp = f" x --cp {pins.cp}" if pins.cp else ""
        raise PlanInputError(f"--tp {pins.tp}{cp} x --pp {pins.pp} x --dp {pins.dp} = {prod}, "
                             f"but there are {gpus} GPUs; they must multiply to the GPU count")
    if pins.cp and pins.cp > 1:
        problem = context_problem(req.options, req.model.seq_length, pins.cp)
        if problem:
            raise PlanInputError(f"--cp {pins.cp}: {problem}")
        if pins.tp:
            problem = context.heads_problem(req.model.num_attention_heads, req.model.num_kv_heads,
                                            pins.tp, pins.cp, req.options.cp_comm)
            if problem:
                raise PlanInputError(f"--cp {pins.cp}: {problem}; choose another --cp or --tp")
        fixed = fixed or [1]
    if fixed and gpus % prod:
        raise PlanInputError(f"the pinned degrees multiply to {prod}, which does not divide "
                             f"{gpus} GPUs")
    if pins.schedule is not None and pins.schedule not in SCHEDULES:
        raise PlanInputError(f"--schedule must be one of {', '.join(SCHEDULES)}, "
                             f"got {pins.schedule!r}")
    if pins.recompute is not None and pins.recompute not in RECOMPUTE_PINS:
        raise PlanInputError(f"--recompute must be one of {', '.join(RECOMPUTE_PINS)}, "
                             f"got {pins.recompute!r}")
    if pins.recompute == "selective":
        unpriced = selective_refusal(req.model, req.options)
        if unpriced:
            raise PlanInputError(f"--recompute selective: {unpriced} ({req.model.name} on the "
                                 f"{req.options.name} stack); use --recompute full or none, or "
                                 "leave --recompute out")
    if pins.zero is not None and pins.zero not in (0, 1, 2, 3):
        raise PlanInputError(f"--zero must be 0, 1, 2 or 3, got {pins.zero}")
    expert_pin_problem(req.model, pins)
    if pins.sequence_parallel and pins.tp == 1:
        raise PlanInputError("--sequence-parallel needs --tp > 1 (it shards what TP replicates)")
    if pins.virtual_stages and pins.virtual_stages > 1 and not (
            pins.schedule and schedule_traits(pins.schedule).takes_virtual_stages):
        raise PlanInputError("--virtual-stages > 1 needs --schedule interleaved (the schedule "
                             "with virtual stages); add it")
    if req.global_batch is not None and req.global_batch < 1:
        raise PlanInputError(f"--global-batch must be positive, got {req.global_batch}")
    if req.batch_range is not None:
        low, high = req.batch_range
        if req.global_batch is not None:
            raise PlanInputError("give --global-batch or --global-batch-range, not both")
        if not 1 <= low <= high:
            raise PlanInputError(f"--global-batch-range needs 1 <= MIN <= MAX, got {low},{high}")
    if req.partition_method not in METHODS:
        raise PlanInputError(f"--partition must be one of {', '.join(METHODS)}, "
                             f"got {req.partition_method!r}")
    if req.top < 1:
        raise PlanInputError(f"--top must be at least 1, got {req.top}")
    if req.refine is not None and req.refine < 1:
        raise PlanInputError(f"--refine must be auto or at least 1, got {req.refine}")
    if req.launcher is not None and req.launcher not in LAUNCHERS:
        raise PlanInputError(f"--launcher must be one of {', '.join(LAUNCHERS)}, "
                             f"got {req.launcher!r}")
    if req.max_bubble is not None and not 0 < req.max_bubble <= 1:
        raise PlanInputError(f"--max-bubble is a fraction in (0, 1], got {req.max_bubble}")


def expert_pin_problem(model: ModelSpec, pins: Pins) -> None:
    """--ep / --etp pins that cannot run: one line, exit 2."""
    if (pins.ep or pins.etp) and not model.is_moe:
        raise PlanInputError(f"--ep and --etp split experts; {model.name} is a dense model (no "
                             "num_experts): drop them")
    if pins.ep and model.num_experts % pins.ep:
        raise PlanInputError(f"--ep {pins.ep} does not divide the {model.num_experts} experts of "
                             f"{model.name}: use a divisor of {model.num_experts}")
    if pins.etp and model.is_moe:
        widths = {layer.ffn_hidden_size for layer in model.layers if layer.is_moe}
        if any(w % pins.etp for w in widths):
            raise PlanInputError(f"--etp {pins.etp} does not divide the expert FFN width "
                                 f"({min(widths)})")
