"""`plan solve` in steps, for the CLI and for callers that want more than :func:`solve`'s
Solution: the request (every input checked, every refusal raised before the search), the search
(plans with their error bands), the batch hint, one pinned configuration explained, the
training budget, and the exports."""

from __future__ import annotations

from dataclasses import replace

from planner.api.inputs import model_spec, request_of, stack_of, with_expert_load
from planner.core import arguments as arg
from planner.core.errors import PlanInputError
from planner.fidelity.band import default_headroom, with_band
from planner.hardware.profiles import MAX_MEMORY_HEADROOM
from planner.launchers import (explain_refusal, export_plan, implied_launcher, output_refusal,
                               parse_targets, plan_document)
from planner.predict.economics import TrainingCost, batch_of_tokens, cost_of, training_budget
from planner.search.advice import batch_hint as _batch_hint
from planner.search.explain import explain as _explain
from planner.search.profiled import analytical_comparison
from planner.search.request import Request
from planner.search.solver import SearchResult, search

__all__ = ["solve_request", "search_plans", "batch_hint", "explain_request", "with_headroom",
           "with_bands", "training_budget", "training_cost", "analytical_comparison",
           "parse_targets", "implied_launcher", "output_refusal", "explain_refusal",
           "export_plan", "plan_document"]


def solve_request(gpus: int, nodes: int, model=None, *, gpu=None, hardware=None,
                  global_batch=None, global_batch_range=None, seq_len=None, max_bubble=None,
                  top: int = 10, refine="auto", launcher=None, partition: str = "auto",
                  profile=None, stack=None, flash=None, overlap=None, tp_overlap=None,
                  grad_dtype=None, precision=None, pins: dict | None = None, power_limit=None,
                  expert_load=None, memory_headroom=None, global_batch_tokens=None,
                  asked: str | None = None, cli: bool = False) -> Request:
    """The search request :func:`planner.api.solve` runs, its arguments checked, with the
    memory headroom it keeps (:func:`with_headroom`); ``global_batch_tokens`` (``16Mi``)
    gives the batch in tokens instead, as the nearest whole number of sequences. ``asked``
    names the flag that chose the launcher in a refusal (``--export megatron``); ``cli`` names
    the arguments as the CLI's flags in messages."""
    def named(arg_name: str) -> str:
        return "--" + arg_name.replace("_", "-") if cli else arg_name

    run_stack = with_expert_load(
        stack_of(stack, launcher, flash, overlap, tp_overlap, grad_dtype, precision), expert_load)
    if global_batch_tokens is not None:
        if global_batch is not None or global_batch_range is not None:
            raise PlanInputError(f"give the batch once: {named('global_batch_tokens')} or "
                                 f"{named('global_batch')} ({named('global_batch_range')}), "
                                 "not both")
        model, seq_len = model_spec(model, seq_len), None
        global_batch = batch_of_tokens(global_batch_tokens, model.seq_length,
                                       named("global_batch_tokens"))
    req = request_of(gpus, nodes, model, gpu, hardware, global_batch, global_batch_range, seq_len,
                     max_bubble, top, refine, launcher, partition, profile, run_stack,
                     dict(pins or {}), power_limit, asked)
    return with_headroom(req, memory_headroom, named("memory_headroom"))


def with_headroom(req: Request, asked: float | None, name: str = "memory_headroom") -> Request:
    """``req`` whose cluster keeps ``asked`` (a share of each GPU's memory) free, or by default
    the worst memory under-estimate of comparable published runs (fidelity/band.py)."""
    if asked is None:
        asked = default_headroom(req.options.name, req.cluster, req.model.is_moe)
    else:
        arg.number(name, asked, low=0, high=MAX_MEMORY_HEADROOM)
    return replace(req, cluster=replace(req.cluster, memory_headroom=float(asked)))


def with_bands(result: SearchResult) -> SearchResult:
    """A search result whose plans carry their error band (planner/fidelity/band.py); the
    candidates that are shown plans are those same banded plans."""
    banded = {id(p): with_band(p) for p in result.plans}
    return replace(result, plans=tuple(banded[id(p)] for p in result.plans),
                   candidates=tuple(banded.get(id(c), c) for c in result.candidates))


def search_plans(req: Request, progress=None) -> SearchResult:
    """The search of ``req``: the ranked plans with their bands, and where every configuration
    went (NoFeasiblePlan when none fits)."""
    return with_bands(search(req, progress))


def batch_hint(req: Request, plan) -> str | None:
    """A larger global batch and the plan found there, when ``plan``'s pipeline idles more than
    a quarter of the step."""
    return _batch_hint(req, plan, search)


def explain_request(req: Request):
    """One pinned configuration of ``req`` priced: fits or not, and by how much."""
    return _explain(req)


def training_cost(plan, budget: tuple[float, float | None]) -> TrainingCost:
    """What training ``budget`` (:func:`training_budget`'s tokens and price) takes on ``plan``."""
    return cost_of(plan, plan.cluster, budget)
