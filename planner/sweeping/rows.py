"""A point's row: its inputs, its best plan (or the reason there is none) and, where the spec gives
``train_tokens`` and ``gpu_hour_price``, what training would take and cost."""

from __future__ import annotations

from planner.predict.economics import training_cost
from planner.sweeping.evaluate import OK, OUTCOME_COLUMNS
from planner.sweeping.points import INPUT_COLUMNS, Point, extra_columns
from planner.sweeping.spec import SweepSpec


def economics(tokens_per_s: float, gpus: int, train_tokens: float | None,
              price: float | None) -> dict:
    """Time, GPU-hours and cost of training ``train_tokens`` tokens at the plan's throughput
    (planner/predict/economics.py: steady throughput, a lower bound)."""
    if train_tokens is None or not tokens_per_s:
        return {}
    cost = training_cost(tokens_per_s, gpus, train_tokens, price=price)
    out = {"time_to_train_s": cost.time_to_train_s, "gpu_hours": cost.gpu_hours}
    if price is not None:
        out["cost"] = cost.cost
    return out


def columns(spec: SweepSpec) -> list[str]:
    """The frame's columns, in order: inputs, the spec's own inputs, the plan, economics, reason,
    digest."""
    econ = []
    if spec.train_tokens is not None:
        econ = ["time_to_train_s", "gpu_hours"] + (["cost"] if spec.gpu_hour_price is not None
                                                   else [])
    outcome = [c for c in OUTCOME_COLUMNS if c != "reason"]
    return [*INPUT_COLUMNS, *extra_columns(spec), *outcome, *econ, "reason", "digest"]


def row(spec: SweepSpec, point: Point, outcome: dict, price: float | None = None) -> dict:
    """One row of the frame; ``price`` is the point's GPU-hour price (None: no cost)."""
    inputs = dict(point.inputs)
    r = {**inputs, **outcome, "digest": point.digest}
    if outcome.get("status") == OK:
        r.update(economics(outcome["tokens_per_s"], inputs["gpus"], spec.train_tokens, price))
    return {c: r.get(c) for c in columns(spec)}
