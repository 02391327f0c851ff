"""`plan partition`: the optimal stage split beside the even and the equal-parameter splits.

Every split is evaluated the same way (planner/evaluate.py with the schedule simulated), so the
step times and the gain compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from planner.core.units import GIB
from planner.cost.layer import RunOptions
from planner.predict.step import evaluate
from planner.hardware.profiles import Cluster
from planner.model.spec import ModelSpec
from planner.core.parallel import Parallel
from planner.predict.plan import Plan
from planner.predict.stages import best_split, cost_tables, megatron_split, param_split



@dataclass(frozen=True)
class SplitComparison:
    optimal: Plan
    even: Plan
    equal_params: Plan
    method: str  # how the optimum was found, with the solver's note
    capacity_bytes: float

    @property
    def gain(self) -> float:
        """Throughput gain of the optimal split over Megatron's even split."""
        return self.even.metrics.step_time_s / self.optimal.metrics.step_time_s - 1


def compare_splits(model: ModelSpec, cluster: Cluster, par: Parallel, opts: RunOptions,
                   method: str = "ilp", profile=None, exact_recompute: bool = False,
                   lp_path=None) -> SplitComparison:
    tables = cost_tables(model, par, cluster.hardware, opts, profile, exact=exact_recompute)

    def run(bounds, modes) -> Plan:
        return evaluate(model, cluster, par, opts, bounds=list(bounds),
                        recompute_per_chunk=list(modes), tables=tables, profile=profile,
                        simulated=True)

    best = best_split(model, cluster, par, opts, tables, method, lp_path)
    params = param_split(model, cluster, par, opts, tables)
    even = megatron_split(model, cluster, par, opts, tables)
    how = "even (interleaved)" if best.partition is None else best.partition.method
    if best.partition is not None:
        if not best.partition.optimal:
            how += f", not proven optimal: gap {best.partition.gap:.1%}"
        if best.partition.note:
            how += f" ({best.partition.note})"
    return SplitComparison(
        optimal=run(best.bounds, best.recompute), even=run(even.bounds, even.recompute),
        equal_params=run(params.bounds, params.recompute), method=how,
        capacity_bytes=cluster.hardware.memory_bytes)


def _split_table(title: str, plan: Plan, capacity: float) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("stage", "rank", "layers", "blocks", "recompute", "time/mb ms",
                "of bottleneck", "memory GiB"):
        table.add_column(col, justify="right")
    bottleneck = max(s.time_s for s in plan.stages)
    for s in plan.stages:
        blocks = sum(1 for layer in plan.model.layers[s.first:s.last] if layer.kind == "block")
        table.add_row(str(s.stage), str(s.rank), f"[{s.first},{s.last})", str(blocks),
                      s.recompute, f"{s.time_s * 1e3:.2f}", f"{s.time_s / bottleneck:.0%}",
                      f"{plan.rank_memory_bytes[s.rank] / GIB:.1f}")
    return table


def print_comparison(console: Console, cmp: SplitComparison) -> None:
    cap = cmp.capacity_bytes
    console.print(_split_table(f"min-bottleneck split ({cmp.method})", cmp.optimal, cap))
    summary = Table(title="the same configuration, three splits", title_justify="left")
    for col in ("split", "step s", "tokens/s", "bubble", "peak memory GiB", "fits"):
        summary.add_column(col, justify="right")
    for name, plan in (("min-bottleneck", cmp.optimal), ("even (Megatron default)", cmp.even),
                       ("equal parameters", cmp.equal_params)):
        m = plan.metrics
        summary.add_row(name, f"{m.step_time_s:.3f}", f"{m.tokens_per_s:,.0f}",
                        f"{m.bubble_fraction:.1%}", f"{m.peak_memory_bytes / GIB:.1f}",
                        "yes" if m.peak_memory_bytes <= cap else "no")
    console.print(summary)
    console.print(f"predicted throughput gain of the min-bottleneck split over the even split: "
                  f"{cmp.gain:+.1%} (step times simulated op by op; splits with the same "
                  "bottleneck can differ a little by where the slowest stage sits)")


def comparison_dict(cmp: SplitComparison) -> dict:
    def stages(plan: Plan) -> list[dict]:
        return plan.to_dict(with_layout=False)["stages"]

    return {"method": cmp.method, "gain_over_even": round(cmp.gain, 6),
            "optimal": {"stages": stages(cmp.optimal),
                        "metrics": cmp.optimal.to_dict(with_layout=False)["metrics"]},
            "even": {"stages": stages(cmp.even),
                     "metrics": cmp.even.to_dict(with_layout=False)["metrics"]},
            "equal_params": {"stages": stages(cmp.equal_params),
                             "metrics": cmp.equal_params.to_dict(with_layout=False)["metrics"]}}
