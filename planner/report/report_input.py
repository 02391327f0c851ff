"""What `plan report` shows, read from plan documents and checked: the ranked plans (plan.json v2
each, as `plan solve --export json` writes one and `plan solve --json` lists them), each plan's
metrics, memory by part per rank, rank layout and error band where it has them, and the feasible
candidates for the step-time-against-memory chart.

A saved file is user input like any other: every field the report draws is checked for type and
range here (core/schema.py), so a hand-edited file gives one PlanInputError line, never a
traceback or a chart of nonsense. What a file lacks (a plan.json holds one plan, not the search's
other candidates; a plan written before plan.json had ``memory`` has no breakdown) is left empty,
and the page says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.core.errors import PlanInputError
from planner.core.limits import MAX_CHUNKS
from planner.core.plan_schema import PARALLEL, check_plan_document
from planner.core.schema import (Bool, Free, Int, Num, Text, check_list, check_object,
                                 check_value)

MAX_PLANS = 10_000  # plans one report reads (`plan solve --top` is far below)
BIG = 2.0**60  # bytes, tokens/s: beyond any machine, below float trouble

METRICS = {"step_time_s": Num(0, BIG, low_open=True, required=True),
           "tokens_per_s": Num(0, BIG, required=True),
           "tflops_per_gpu": Num(0, BIG, required=True), "mfu": Num(0, 10, required=True),
           "hfu": Num(0, 10), "bubble_fraction": Num(0, 1, required=True),
           "peak_memory_bytes": Num(0, BIG, required=True)}
CLUSTER = {"gpu": Text(required=True), "nodes": Int(1, 2**31, required=True),
           "gpus_per_node": Int(1, 2**20, required=True), "gpus": Int(1, 2**31, required=True)}
MAX_RANKS = 2**20  # GPUs of one layout
RANK = {k: Int(0, MAX_RANKS, required=k != "cp")
        for k in ("rank", "node", "local_rank", "tp", "cp", "pp", "dp")}
GROUPS = ("tp_groups", "cp_groups", "pp_groups", "dp_groups", "ep_groups", "expert_tp_groups",
          "expert_dp_groups", "embedding_groups")
# the per-plan field another part of plan3d writes: the model's error band around its prediction
BAND = {"step_time_s": Free(required=True), "mfu": Free(), "basis": Text(required=True),
        "calibrated": Bool()}


@dataclass(frozen=True)
class BandView:
    """The prediction's error band as the plan states it (never computed here)."""

    step_time_s: tuple[float, float]
    mfu: tuple[float, float] | None
    basis: str
    calibrated: bool | None


@dataclass(frozen=True)
class RankMemory:
    """One pipeline rank's peak: its total and its parts in the plan's order, in bytes."""

    rank: int
    total_bytes: float
    parts: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class Layout:
    """A plan's rank layout: the order, each rank's coordinates (dicts of ints: rank, node,
    local_rank, tp, pp, dp and cp in a 5D plan) and the process groups by dimension."""

    order: str
    ranks: tuple[dict, ...]
    groups: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...]


@dataclass(frozen=True)
class PlanView:
    """One ranked plan as the report draws it; ``doc`` is its document (the Gantt re-reads it)."""

    rank: int  # 1 = best
    doc: dict
    model: str
    cluster: dict
    parallel: dict
    metrics: dict
    memory: tuple[RankMemory, ...]
    error_band: BandView | None
    stack: str | None  # the stack's name (the validation record's key)
    stack_label: str | None  # name and version, as the page prints it
    layout: Layout | None
    notes: tuple[str, ...]

    def __post_init__(self):
        if self.rank < 1:
            raise ValueError(f"a plan's rank counts from 1, got {self.rank}")


@dataclass(frozen=True)
class Candidate:
    """One feasible configuration: a point of step time against memory."""

    step_time_s: float
    peak_memory_bytes: float
    label: str
    rank: int | None = None  # its row in the ranked table, if shown there

    def __post_init__(self):
        if not (self.step_time_s > 0 and self.peak_memory_bytes >= 0):
            raise ValueError(f"a candidate needs a positive step and memory, got {self!r}")


@dataclass(frozen=True)
class ReportInput:
    """Everything one report shows: the plans, best first, and the candidates plotted."""

    origin: str  # where the plans came from, in words
    plans: tuple[PlanView, ...]
    candidates: tuple[Candidate, ...]
    feasible: int | None = None  # the search's feasible count, when known
    capacity_bytes: float | None = None  # one GPU's memory, when known

    def __post_init__(self):
        if not self.plans:
            raise ValueError("a report needs at least one plan")

    @property
    def best(self) -> PlanView:
        return self.plans[0]


def configuration_label(parallel: dict) -> str:
    """tp·cp·pp·dp, micro-batch x M and the schedule of a plan's ``parallel`` block."""
    dims = "·".join(str(parallel.get(k, 1)) for k in ("tp", "cp", "pp", "dp"))
    v = parallel.get("virtual_stages", 1)
    schedule = parallel["schedule"] + (f" v{v}" if v > 1 else "")
    return (f"tp·cp·pp·dp {dims}, mb {parallel.get('micro_batch', '?')}×"
            f"{parallel['num_microbatches']}, {schedule}")


def _pair(value, where: str, low: float, high: float) -> tuple[float, float]:
    pair = check_list(value, where, "numbers (low, high)", 2)
    if len(pair) != 2:
        raise PlanInputError(f"{where} must be [low, high], got {len(pair)} numbers")
    lo, hi = (check_value(x, Num(low, high), where) for x in pair)
    if lo > hi:
        raise PlanInputError(f"{where} must be [low, high] with low <= high, got [{lo}, {hi}]")
    return float(lo), float(hi)


def _band(value, origin: str) -> BandView | None:
    if value is None:
        return None
    where = f"{origin}: 'error_band'"
    band = check_object(value, BAND, where, "error band", tolerant=True)
    mfu = _pair(band["mfu"], f"{where} 'mfu'", 0, 10) if "mfu" in band else None
    return BandView(_pair(band["step_time_s"], f"{where} 'step_time_s'", 0, BIG), mfu,
                     band["basis"], band.get("calibrated"))


def _layout(value, origin: str) -> Layout | None:
    if not isinstance(value, dict):
        return None
    where = f"{origin}: 'layout'"
    ranks = check_list(value.get("ranks"), f"{where} 'ranks'", "rank entries", MAX_RANKS)
    checked = tuple(check_object(r, RANK, f"{where} ranks[{i}]", "rank entry", tolerant=True)
                    for i, r in enumerate(ranks))
    groups = []
    for key in GROUPS:
        if key not in value:
            continue
        at = f"{where} '{key}'"
        found = check_list(value[key], at, "groups", MAX_RANKS, non_empty=False)
        groups.append((key.removesuffix("_groups").replace("_", " "),
                       tuple(tuple(check_value(x, Int(0, MAX_RANKS), at)
                                   for x in check_list(g, at, "ranks", MAX_RANKS))
                             for g in found)))
    order = check_value(value.get("order", ""), Text(), f"{where} 'order'")
    return Layout(order, checked, tuple(groups))


def _memory(value, origin: str, pp: int) -> tuple[RankMemory, ...]:
    if value is None:
        return ()
    where = f"{origin}: 'memory'"
    block = check_object(value, {"ranks": Free(required=True)}, where, "memory block")
    ranks = check_list(block["ranks"], f"{where} 'ranks'", "rank entries", MAX_CHUNKS)
    out = []
    for i, entry in enumerate(ranks):
        at = f"{where} ranks[{i}]"
        r = check_object(entry, {"rank": Int(0, MAX_CHUNKS, required=True),
                                 "total_bytes": Num(0, BIG, required=True),
                                 "parts": Free(required=True)}, at, "rank entry")
        if r["rank"] != i:
            raise PlanInputError(f"{at}: numbered {r['rank']}; the ranks must be 0, 1, ... in "
                                 "order")
        check_object(r["parts"], {}, f"{at} 'parts'", "parts", tolerant=True)  # an object
        parts = tuple((check_value(k, Text(), f"{at} part name"),
                       float(check_value(v, Num(0, BIG), f"{at} 'parts' '{k}'")))
                      for k, v in r["parts"].items())
        out.append(RankMemory(i, float(r["total_bytes"]), parts))
    if len(out) != pp:
        raise PlanInputError(f"{where}: {len(out)} ranks, but the plan has pp = {pp}")
    return tuple(out)


def plan_view(doc, rank: int, origin: str) -> PlanView:
    """One plan document checked into what the report draws."""
    if not isinstance(doc, dict):
        raise PlanInputError(f"{origin}: expected a plan3d plan JSON object; write one with "
                             "plan solve --export json --out DIR")
    band = doc.get("error_band")
    # the error band is checked here (_band), whether or not this plan3d's plan reader knows it
    doc = {k: v for k, v in doc.items() if k != "error_band"}
    check_plan_document(doc, origin)  # schema, parallel, stages (what the Gantt runs)
    model = doc.get("model") if isinstance(doc.get("model"), dict) else {}
    parallel = check_object(doc["parallel"], PARALLEL, f"{origin}: parallel", tolerant=True)
    for key in ("ep", "etp"):
        if key in doc["parallel"]:
            parallel[key] = check_value(doc["parallel"][key], Int(1, 2**20),
                                        f"{origin}: parallel '{key}'")
    for key in ("metrics", "cluster"):
        if not isinstance(doc.get(key), dict):
            raise PlanInputError(f"{origin}: missing '{key}'; export the plan again with "
                                 "plan solve --export json")
    metrics = check_object(doc["metrics"], METRICS, f"{origin}: metrics", tolerant=True)
    cluster = check_object(doc["cluster"], CLUSTER, f"{origin}: cluster", tolerant=True)
    stack = doc.get("stack") if isinstance(doc.get("stack"), dict) else {}
    name = check_value(stack.get("name", ""), Text(), f"{origin}: stack 'name'") or None
    version = check_value(stack.get("version", ""), Text(), f"{origin}: stack 'version'")
    notes = check_list(doc.get("notes", []), f"{origin}: 'notes'", "notes", 1000, non_empty=False)
    layout = doc.get("layout")
    return PlanView(
        rank=rank, doc=doc, model=str(model.get("name", "?")), cluster=cluster,
        parallel=parallel, metrics=metrics,
        memory=_memory(doc.get("memory"), origin, parallel["pp"]),
        error_band=_band(band, origin), stack=name,
        stack_label=f"{name} {version}".strip() if name else None,
        layout=_layout(layout, origin),
        notes=tuple(check_value(n, Text(), f"{origin}: notes[{i}]") for i, n in enumerate(notes)))


def report_input(docs: list, origin: str, candidates: tuple[Candidate, ...] | None = None,
                 feasible: int | None = None, capacity_bytes: float | None = None) -> ReportInput:
    """The plans ``docs`` (best first) checked; ``candidates`` default to the plans themselves."""
    check_list(docs, f"{origin}: 'plans'", "plans", MAX_PLANS)
    views = tuple(plan_view(doc, i + 1, f"{origin}: plans[{i}]" if len(docs) > 1 else origin)
                  for i, doc in enumerate(docs))
    if candidates is None:
        candidates = tuple(Candidate(v.metrics["step_time_s"], v.metrics["peak_memory_bytes"],
                                     configuration_label(v.parallel), v.rank) for v in views)
    return ReportInput(origin, views, candidates, feasible, capacity_bytes)


def read_report_document(doc, origin: str) -> ReportInput:
    """A plan.json (one plan) or `plan solve --json` output (its plans, and the search's feasible
    count) as the report's input."""
    if isinstance(doc, dict) and "plans" in doc:
        search = doc.get("search") if isinstance(doc.get("search"), dict) else {}
        feasible = check_value(search.get("feasible", 0), Int(0, 2**53),
                               f"{origin}: search 'feasible'") or None
        plans = doc["plans"]
        if isinstance(plans, list) and not plans:
            raise PlanInputError(f"{origin}: holds no plans (nothing fitted when it was "
                                 "written); solve again")
        return report_input(plans, origin, feasible=feasible)
    return report_input([doc], origin)
