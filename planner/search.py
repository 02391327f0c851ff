"""The search: every parallel configuration of a model on a cluster, screened, refined, ranked.

Screening enumerates (tp, pp, dp, micro-batch, M, schedule, virtual stages, recompute, ZeRO, SP)
and predicts each with the closed-form evaluation (even split); every rejection is counted by
reason. The best candidates are then refined (stage partition, schedule simulation) and ranked by
step time, ties broken by lower memory, then by the configuration itself, so the same inputs always
give the same ranking.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from itertools import product

from planner import calibration
from planner.cost import RunOptions
from planner.errors import NoFeasiblePlan, PlanInputError
from planner.evaluate import (CostTable, Stages, evaluate, even_split, layer_costs, predict,
                              split_stages)
from planner.export import LAUNCHERS, launcher_allows
from planner.partition import PartitionError
from planner.split import METHODS, allowed_modes, best_split
from planner.hardware import Cluster
from planner.model import ModelSpec
from planner.plan import RECOMPUTE_MODES, SCHEDULES, Parallel, Plan

DEFAULT_TOKENS_PER_BATCH = 4 * 1024 * 1024  # ~4M tokens: Llama-2/3 and GPT-3 scale batches
MICRO_BATCHES = (1, 2, 4, 8, 16, 32)
VIRTUAL_STAGES = (2, 3, 4, 6, 8)


@dataclass(frozen=True)
class Pins:
    """Dimensions the user fixed; None means search it."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    micro_batch: int | None = None
    schedule: str | None = None
    virtual_stages: int | None = None
    recompute: str | None = None
    zero: int | None = None
    sequence_parallel: bool | None = None


@dataclass(frozen=True)
class Request:
    model: ModelSpec
    cluster: Cluster
    global_batch: int | None = None
    batch_range: tuple[int, int] | None = None  # let the search choose the batch in [min, max]
    max_bubble: float | None = None
    pins: Pins = Pins()
    options: RunOptions = RunOptions()
    top: int = 10
    refine: int = 20
    launcher: str | None = None  # only configurations this launcher runs
    partition_method: str = "dp"  # exact DP (same optimum as the ILP, tests prove it) or "ilp"
    profile: object = None  # a measured Profile (planner/profile.py) replacing analytical times

    @property
    def batch(self) -> int:
        return self.global_batch or default_global_batch(self.model.seq_length)


@dataclass(frozen=True)
class SearchResult:
    plans: tuple[Plan, ...]
    rejected: dict[str, int]
    screened: int
    elapsed_s: float
    notes: tuple[str, ...] = field(default=())


def default_global_batch(seq_len: int) -> int:
    return max(1, DEFAULT_TOKENS_PER_BATCH // seq_len)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def validate_pins(req: Request) -> None:
    """Pins that contradict each other or the GPU count: one line, before any search."""
    pins, gpus = req.pins, req.cluster.gpus
    for name in ("tp", "pp", "dp", "micro_batch", "virtual_stages"):
        value = getattr(pins, name)
        if value is not None and value < 1:
            raise PlanInputError(f"--{name.replace('_', '-')} must be positive, got {value}")
    fixed = [v for v in (pins.tp, pins.pp, pins.dp) if v is not None]
    prod = 1
    for v in fixed:
        prod *= v
    if len(fixed) == 3 and prod != gpus:
        raise PlanInputError(f"--tp {pins.tp} x --pp {pins.pp} x --dp {pins.dp} = {prod}, but "
                             f"there are {gpus} GPUs; the three must multiply to the GPU count")
    if fixed and gpus % prod:
        raise PlanInputError(f"the pinned degrees multiply to {prod}, which does not divide "
                             f"{gpus} GPUs")
    if pins.schedule is not None and pins.schedule not in SCHEDULES:
        raise PlanInputError(f"--schedule must be one of {', '.join(SCHEDULES)}, "
                             f"got {pins.schedule!r}")
    if pins.recompute is not None and pins.recompute not in RECOMPUTE_MODES:
        raise PlanInputError(f"--recompute must be one of {', '.join(RECOMPUTE_MODES)}, "
                             f"got {pins.recompute!r}")
    if pins.zero is not None and pins.zero not in (0, 1, 2, 3):
        raise PlanInputError(f"--zero must be 0, 1, 2 or 3, got {pins.zero}")
    if pins.sequence_parallel and pins.tp == 1:
        raise PlanInputError("--sequence-parallel needs --tp > 1 (it shards what TP replicates)")
    if pins.virtual_stages and pins.virtual_stages > 1 and pins.schedule not in (
            None, "interleaved"):
        raise PlanInputError("--virtual-stages > 1 needs --schedule interleaved")
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
    if req.refine < 1:
        raise PlanInputError(f"--refine must be at least 1, got {req.refine}")
    if req.launcher is not None and req.launcher not in LAUNCHERS:
        raise PlanInputError(f"--launcher must be one of {', '.join(LAUNCHERS)}, "
                             f"got {req.launcher!r}")
    if req.max_bubble is not None and not 0 < req.max_bubble <= 1:
        raise PlanInputError(f"--max-bubble is a fraction in (0, 1], got {req.max_bubble}")


def tp_rule(model: ModelSpec, cluster: Cluster, tp: int) -> str | None:
    """Why tensor parallelism of this degree cannot run here (None when it can)."""
    if tp > cluster.gpus_per_node or cluster.gpus_per_node % tp:
        return "TP across nodes"
    for what, n in (("heads", model.num_attention_heads), ("KV heads", model.num_kv_heads),
                    ("FFN", model.ffn_hidden_size), ("vocabulary", model.vocab_size)):
        if n % tp:
            return f"{what} not divisible by TP"
    return None


def enumerate_configs(req: Request, rejected: Counter):
    """Yield every Parallel the pins allow; count each rejection by its reason."""
    model, cluster, pins, batch = req.model, req.cluster, req.pins, req.batch
    gpus = cluster.gpus
    blocks = max(model.num_layers, 1)
    tps = [pins.tp] if pins.tp else divisors(gpus)
    for tp in tps:
        if gpus % tp:
            continue
        reason = tp_rule(model, cluster, tp)
        if reason:
            rejected[reason] += 1
            continue
        pps = [pins.pp] if pins.pp else divisors(gpus // tp)
        for pp in pps:
            if (gpus // tp) % pp:
                continue
            dp = gpus // (tp * pp)
            if pins.dp and dp != pins.dp:
                continue
            if pp > len(model.layers):
                rejected["more stages than layers"] += 1
                continue
            for mb in ([pins.micro_batch] if pins.micro_batch else MICRO_BATCHES):
                m = _microbatches(req, mb * dp)
                if m is None:
                    rejected["batch not divisible"] += 1
                    continue
                yield from _knobs(req, tp, pp, dp, mb, m, blocks, rejected)


def _microbatches(req: Request, per_microbatch_step: int) -> int | None:
    """M for an exact batch, or the most microbatches that keep the batch inside the range
    (more microbatches shrink the pipeline bubble); None when no M fits."""
    if req.batch_range is None:
        batch = req.batch
        return batch // per_microbatch_step if batch % per_microbatch_step == 0 else None
    low, high = req.batch_range
    m = high // per_microbatch_step
    return m if m >= 1 and m * per_microbatch_step >= low else None


def _knobs(req: Request, tp, pp, dp, mb, m, blocks, rejected: Counter):
    pins = req.pins
    schedules = [pins.schedule] if pins.schedule else (
        ["1f1b"] if pp == 1 else list(SCHEDULES))
    recomputes = [pins.recompute] if pins.recompute else [
        r for r in RECOMPUTE_MODES if not (r == "selective" and req.options.flash_attention)]
    zeros = [pins.zero] if pins.zero is not None else [0, 1, 2, 3]
    sps = [pins.sequence_parallel] if pins.sequence_parallel is not None else (
        [True, False] if tp > 1 else [False])
    for schedule in schedules:
        vs = [1]
        if schedule == "interleaved":
            vs = [pins.virtual_stages] if pins.virtual_stages else list(VIRTUAL_STAGES)
            if pp == 1:
                rejected["schedule rule"] += 1
                continue
            if m % pp:
                rejected["schedule rule"] += len(vs)
                continue
        elif pins.virtual_stages and pins.virtual_stages > 1:
            continue
        for v in vs:
            if pp * v > len(req.model.layers) or (v > 1 and blocks % (pp * v)):
                rejected["schedule rule"] += 1
                continue
            for recompute, zero, sp in product(recomputes, zeros, sps):
                if sp and tp == 1:
                    rejected["sequence parallel needs TP"] += 1
                    continue
                par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=mb, num_microbatches=m,
                               schedule=schedule, virtual_stages=v, recompute=recompute,
                               zero=zero, sequence_parallel=sp)
                if req.launcher and _launcher_refuses(req, par):
                    rejected[f"{req.launcher} cannot run it"] += 1
                    continue
                yield par


def _launcher_refuses(req: Request, par: Parallel) -> str | None:
    m = req.model
    return launcher_allows(
        req.launcher, tp=par.tp, pp=par.pp, dp=par.dp, micro_batch=par.micro_batch,
        num_microbatches=par.num_microbatches, schedule=par.schedule,
        virtual_stages=par.virtual_stages, recompute=par.recompute, zero=par.zero,
        sequence_parallel=par.sequence_parallel, num_heads=m.num_attention_heads,
        num_kv_heads=m.num_kv_heads, ffn=m.ffn_hidden_size, vocab=m.vocab_size,
        num_blocks=m.num_layers)


def capacity_bytes(cluster: Cluster) -> float:
    return cluster.hardware.memory_bytes


def _rank_key(par: Parallel, step_s: float, memory_bytes: float):
    """Fastest first, then least memory, then the configuration itself: a total order, so the
    same inputs always give the same ranking."""
    return (round(step_s, 9), round(memory_bytes), par.tp, par.pp, par.micro_batch,
            SCHEDULES.index(par.schedule), par.virtual_stages,
            RECOMPUTE_MODES.index(par.recompute), par.zero, par.sequence_parallel)


def _plan_key(plan: Plan):
    return _rank_key(plan.parallel, plan.metrics.step_time_s, plan.metrics.peak_memory_bytes)


class _Costs:
    """Layer-cost tables and even-split stage totals shared by the configurations of a search."""

    def __init__(self, req: Request):
        self.req = req
        self.tables: dict = {}
        self.stages: dict = {}
        self.simulations: dict = {}

    def table(self, par: Parallel, mode: str) -> CostTable:
        key = (par.tp, par.sequence_parallel, par.micro_batch, mode)
        if key not in self.tables:
            r = self.req
            self.tables[key] = CostTable(layer_costs(r.model, par, r.cluster.hardware, r.options,
                                                     mode, r.profile))
        return self.tables[key]

    def even_stages(self, par: Parallel) -> Stages:
        key = (par.tp, par.sequence_parallel, par.micro_batch, par.recompute, par.num_chunks)
        if key not in self.stages:
            bounds = even_split(self.req.model, par.num_chunks)
            self.stages[key] = split_stages({par.recompute: self.table(par, par.recompute)},
                                            bounds, [par.recompute] * par.num_chunks)
        return self.stages[key]

    def refined(self, par: Parallel) -> Plan | str:
        """Partition (compute-balanced under memory) and simulate one configuration; a
        rejection reason when no split fits."""
        r = self.req
        known = {m: self.table(par, m) for m in allowed_modes(par, r.options,
                                                               r.pins.recompute is not None)}
        try:
            split = best_split(r.model, r.cluster, par, r.options, known, r.partition_method)
        except PartitionError:
            return "memory (no stage split fits)"
        return evaluate(r.model, r.cluster, par, r.options, bounds=list(split.bounds),
                        recompute_per_chunk=list(split.recompute), tables=known,
                        profile=r.profile, simulated=True, sim_cache=self.simulations)


def search(req: Request, progress=None) -> SearchResult:
    """Screen every configuration, keep the ones that fit, rank them (best first)."""
    validate_pins(req)
    start = time.perf_counter()
    rejected: Counter = Counter()
    configs = list(enumerate_configs(req, rejected))
    capacity = capacity_bytes(req.cluster)
    costs = _Costs(req)
    kept = []
    for n, par in enumerate(configs):
        if progress and n % 256 == 0:
            progress(n, len(configs))
        pred = predict(req.model, req.cluster, par, req.options, costs.even_stages(par))
        if pred.peak_memory_bytes > capacity:
            rejected["memory"] += 1
        elif req.max_bubble is not None and pred.bubble > req.max_bubble:
            rejected["bubble above limit"] += 1
        else:
            kept.append((_rank_key(par, pred.step_s, pred.peak_memory_bytes), par))
    if progress:
        progress(len(configs), len(configs))
    kept.sort(key=lambda item: item[0])
    refined = []
    for par in _best_groups([par for _, par in kept], max(req.refine, req.top)):
        plan = costs.refined(par)
        if isinstance(plan, str):
            rejected[plan] += 1
        elif plan.metrics.peak_memory_bytes > capacity:
            rejected["memory (simulated in-flight)"] += 1
        elif req.max_bubble is not None and plan.metrics.bubble_fraction > req.max_bubble:
            rejected["bubble above limit"] += 1
        else:
            refined.append(plan)
    if not refined:
        raise NoFeasiblePlan(_no_plan_message(req, rejected, len(configs)), dict(rejected))
    refined.sort(key=_plan_key)
    plans, hidden = _distinct_beyond_zero(refined)
    return SearchResult(plans=tuple(plans[: req.top]), rejected=dict(sorted(rejected.items())),
                        screened=len(configs), elapsed_s=time.perf_counter() - start,
                        notes=(f"{hidden} plans that differ from a better one only in ZeRO stage "
                               "are not shown",) if hidden else ())


def _best_groups(ranked: list[Parallel], groups: int) -> list[Parallel]:
    """The configurations of the ``groups`` best configurations-up-to-ZeRO, with every ZeRO
    stage of each (refinement may reorder them: the simulated memory decides which fit)."""
    chosen: dict = {}
    for par in ranked:
        key = replace(par, zero=0)
        if key in chosen:
            chosen[key].append(par)
        elif len(chosen) < groups:
            chosen[key] = [par]
    return [par for variants in chosen.values() for par in variants]


def _distinct_beyond_zero(plans: list[Plan]) -> tuple[list[Plan], int]:
    """Keep the best plan of each configuration that differs in more than the ZeRO stage: a
    ZeRO-2 twin of a ZeRO-1 plan at the same speed tells the user nothing new."""
    seen, out = set(), []
    for plan in plans:
        key = replace(plan.parallel, zero=0)
        if key not in seen:
            seen.add(key)
            out.append(plan)
    return out, len(plans) - len(out)


def check_profile_matches(profile, model: ModelSpec) -> None:
    if len(profile.layers) != len(model.layers) or profile.model_name != model.name:
        raise PlanInputError(
            f"the profile is of {profile.model_name} ({len(profile.layers)} layers), not of "
            f"{model.name} ({len(model.layers)} layers): profile this model or pass --model "
            f"{profile.model_name}")


def analytical_comparison(req: Request, plan: Plan) -> str:
    """The best plan's step time from the measured profile beside the analytical model's."""
    p = plan.parallel
    analytical = evaluate(req.model, req.cluster, p, req.options,
                          bounds=[(s.first, s.last) for s in plan.stages],
                          recompute_per_chunk=[s.recompute for s in plan.stages],
                          simulated=True)
    return (f"step time of plan 1: {plan.metrics.step_time_s:.3f} s from the measured profile "
            f"({req.profile.device_name}, {req.profile.dtype}), "
            f"{analytical.metrics.step_time_s:.3f} s from the analytical model of "
            f"{req.cluster.hardware.name}. Compute times come from the profile; memory, links and "
            f"MFU's peak from {req.cluster.hardware.name} (for a cluster of the profiled device, "
            "pass --hardware with the file `plan profile --calibrate` writes on it)")


@dataclass(frozen=True)
class Explanation:
    """One pinned configuration: its prediction, whether it fits, and why not if not."""

    parallel: Parallel | None
    plan: Plan | None
    capacity_bytes: float
    rule: str | None  # a rule that forbids it before any prediction

    @property
    def fits(self) -> bool:
        return (self.rule is None and self.plan is not None
                and self.plan.metrics.peak_memory_bytes <= self.capacity_bytes)


def explain(req: Request) -> Explanation:
    """Evaluate the pinned configuration (defaults for what is not pinned: 1f1b, v = 1, no
    recompute, ZeRO-1, SP when tp > 1), whatever its fate in the search."""
    validate_pins(req)
    pins, gpus = req.pins, req.cluster.gpus
    capacity = capacity_bytes(req.cluster)
    tp, pp = pins.tp or 1, pins.pp or 1
    dp = pins.dp or gpus // (tp * pp)
    mb = pins.micro_batch or 1
    if tp * pp * dp != gpus:
        return Explanation(None, None, capacity,
                           f"tp {tp} x pp {pp} x dp {dp} != {gpus} GPUs: pin two of them or all "
                           "three consistently")
    rule = tp_rule(req.model, req.cluster, tp)
    m = _microbatches(req, mb * dp)
    if m is None:
        rule = rule or f"global batch {req.batch} is not a multiple of micro-batch x dp = {mb * dp}"
        m = 1
    par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=mb, num_microbatches=m,
                   schedule=pins.schedule or "1f1b", virtual_stages=pins.virtual_stages or 1,
                   recompute=pins.recompute or "none",
                   zero=1 if pins.zero is None else pins.zero,
                   sequence_parallel=tp > 1 if pins.sequence_parallel is None
                   else pins.sequence_parallel)
    if rule is None:
        rule = _schedule_rule(req, par)
    if rule is None and req.launcher:
        rule = _launcher_refuses(req, par)
    if rule is not None and rule.startswith("TP across"):
        rule = (f"TP {tp} crosses nodes: it must divide the {req.cluster.gpus_per_node} GPUs "
                "of a node")
    if rule is not None:
        return Explanation(par, None, capacity, rule)
    plan = _Costs(req).refined(par)
    if isinstance(plan, str):  # no split fits: show how far Megatron's even split is over
        plan = evaluate(req.model, req.cluster, par, req.options, profile=req.profile,
                        simulated=True)
    return Explanation(par, plan, capacity, None)


def _schedule_rule(req: Request, par: Parallel) -> str | None:
    layers = len(req.model.layers)
    if par.num_chunks > layers:
        return f"{par.num_chunks} chunks for {layers} layers: use fewer stages"
    if par.schedule == "interleaved":
        if par.pp == 1:
            return "interleaved needs pp > 1"
        if par.num_microbatches % par.pp:
            return (f"interleaved needs the microbatch count ({par.num_microbatches}) divisible "
                    f"by pp ({par.pp})")
    if par.virtual_stages > 1 and req.model.num_layers % par.num_chunks:
        return (f"{req.model.num_layers} blocks do not split evenly into {par.num_chunks} "
                "virtual stages")
    return None


def _no_plan_message(req: Request, rejected: Counter, screened: int) -> str:
    gib = (capacity_bytes(req.cluster) - calibration.RESERVED_BYTES) / 1024**3
    reasons = ", ".join(f"{n} {r}" for r, n in rejected.most_common())
    top = rejected.most_common(1)[0][0] if rejected else ""
    if top.startswith("memory"):
        hint = (f"the model does not fit in {gib:.0f} GiB per GPU with the options tried: add "
                "GPUs, allow recompute and ZeRO (drop pins) or use a larger GPU")
    elif top == "batch not divisible":
        hint = (f"the global batch ({req.batch}) cannot be split over this many data-parallel "
                "ranks: raise --global-batch, give --global-batch-range, or use fewer GPUs")
    else:
        hint = "relax the pins or limits that rejected the most"
    return (f"{req.model.name} on {req.cluster.gpus} x {req.cluster.hardware.name}: "
            f"{screened} configurations screened; rejected: {reasons or 'none'}. {hint}")
