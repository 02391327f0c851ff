"""One pinned configuration explained (`plan solve --explain`): its prediction, whether it fits,
and the rule or the memory that rules it out, whatever its fate in the search.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from planner.predict.step import evaluate, predict_plan
from planner.core.parallel import Parallel
from planner.core.schedules import DEFAULT_SCHEDULE
from planner.predict.plan import Plan
from planner.search.costs import SearchCosts
from planner.search.request import Request, pinned_recompute
from planner.search.rules import MOE_NEEDS_SP, launcher_rule, schedule_rule, stack_rule, tp_rule
from planner.search.solver import capacity_bytes
from planner.search.space import microbatches
from planner.search.validation import validate_pins


@dataclass(frozen=True)
class Explanation:
    """One pinned configuration: its prediction, whether it fits, and why not if not."""

    parallel: Parallel | None
    plan: Plan | None
    capacity_bytes: float
    rule: str | None  # a rule that forbids it before any prediction
    # why no stage split fits (the plan is then Megatron's even split, to show by how much)
    no_split: str | None = None
    # per pipeline rank, bytes by part (planner/predict/memory.py MEMORY_PARTS)
    memory_parts: dict | None = None
    # per pipeline rank, reserved on ZeRO-3's side streams beside the parts (not in what must
    # fit: planner/cost/side_streams.py)
    side_stream_bytes: tuple[float, ...] = ()
    pinned: tuple[str, ...] = ()  # the Pins fields given; the rest took explain's defaults

    @property
    def fits(self) -> bool:
        return (self.rule is None and self.plan is not None and self.no_split is None
                and self.plan.metrics.peak_memory_bytes <= self.capacity_bytes)


def explain(req: Request) -> Explanation:
    """Evaluate the pinned configuration (defaults for what is not pinned: 1f1b, v = 1, no
    recompute, ZeRO-1, SP when tp > 1), whatever its fate in the search."""
    validate_pins(req)
    pins, gpus = req.pins, req.cluster.gpus
    pinned = tuple(f.name for f in fields(pins) if getattr(pins, f.name) is not None)
    capacity = capacity_bytes(req.cluster)
    tp, pp, cp = pins.tp or 1, pins.pp or 1, pins.cp or 1
    dp = pins.dp or gpus // (tp * cp * pp)
    mb = pins.micro_batch or 1
    if tp * cp * pp * dp != gpus:
        return Explanation(None, None, capacity,
                           f"tp {tp} x cp {cp} x pp {pp} x dp {dp} != {gpus} GPUs: pin them "
                           "consistently", pinned=pinned)
    rule = tp_rule(req.model, req.cluster, tp)
    m = microbatches(req, mb * dp)
    if m is None:
        rule = rule or f"global batch {req.batch} is not a multiple of micro-batch x dp = {mb * dp}"
        m = 1
    par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=mb, num_microbatches=m,
                   schedule=pins.schedule or DEFAULT_SCHEDULE, virtual_stages=pins.virtual_stages or 1,
                   recompute=pinned_recompute(pins.recompute) or "none",
                   zero=1 if pins.zero is None else pins.zero,
                   sequence_parallel=tp > 1 if pins.sequence_parallel is None
                   else pins.sequence_parallel, cp=cp,
                   ep=pins.ep or 1, etp=None if pins.etp in (None, tp) else pins.etp)
    if rule is None and req.model.is_moe and tp > 1 and not par.sequence_parallel:
        rule = MOE_NEEDS_SP
    if rule is None:
        rule = stack_rule(req.options, par) or schedule_rule(req.model, par)
    if rule is None and req.runs_on:
        rule = launcher_rule(req, par)
    if rule is not None and rule.startswith("TP across"):
        domain = req.cluster.nvlink_domain
        rule = (f"TP {tp} crosses nodes: it must divide the {domain} GPUs of a node"
                if domain == req.cluster.gpus_per_node else
                f"TP {tp} crosses NVLink domains: it must divide the {domain} GPUs of a domain")
    if rule is not None:
        return Explanation(par, None, capacity, rule, pinned=pinned)
    plan = SearchCosts(req).refined(par)
    no_split = None
    if isinstance(plan, str):  # no split fits: show how far Megatron's even split is over
        no_split = plan
        plan = evaluate(req.model, req.cluster, par, req.options, profile=req.profile,
                        simulated=True)
    _, pred = predict_plan(req.model, req.cluster, par, req.options,
                           bounds=[(s.first, s.last) for s in plan.stages],
                           recompute_per_chunk=[s.recompute for s in plan.stages],
                           recompute_layers=[s.recompute_layers for s in plan.stages],
                           profile=req.profile, simulated=True)
    parts = {k: [float(x) for x in v] for k, v in pred.memory_parts.items()}
    return Explanation(par, plan, capacity, None, no_split, parts,
                       tuple(float(x) for x in pred.side_stream_bytes), pinned)
