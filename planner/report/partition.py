"""`plan partition`: the optimal stage split beside the even and the equal-parameter splits.

Every split is evaluated the same way (predict/step.py with the schedule simulated), so the step
times and the gain compare like with like. The split recommended is the fastest of the three in
that simulation: the ILP minimises the slowest stage, and a baseline with the same bottleneck can
simulate as fast or, by where the slowest stage sits, a little faster, so none printed can beat it
(an equal one is reported as a tie). The output states what it assumed: the parallel degrees, the
microbatches and batch, and how the GPUs sit on nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from planner.core.errors import PlanInputError
from planner.core.limits import MAX_GPUS
from planner.core.units import GIB
from planner.predict.step import evaluate
from planner.hardware.profiles import Cluster
from planner.model.spec import ModelSpec
from planner.core.parallel import Parallel
from planner.predict.plan import Plan
from planner.predict.stages import best_split, cost_tables, megatron_split, param_split
from planner.stack import Stack



# Splits compared, in the order shown: (key in the JSON, label).
SPLITS = (("optimal", "min-bottleneck"), ("even", "even (Megatron default)"),
          ("equal_params", "equal parameters"))
# Step times this close (relative) are the same prediction: float noise of the simulation.
TIE = 1e-9


def place_nodes(gpus: int, tp: int, gpus_per_node: int, nodes: int | None = None
                ) -> tuple[int, str]:
    """(nodes, how they were chosen) for tp x pp x dp GPUs on nodes of the hardware's size.

    --nodes is taken as given. Otherwise whole nodes of ``gpus_per_node`` when the GPUs fill them,
    one node when they fit in one, and else the fewest equal nodes, each no larger than the
    hardware's and holding whole TP groups (12 GPUs at TP 4 on 8-GPU nodes: 3 nodes of 4), said in
    the output since the real machine may hold them differently."""
    if gpus > MAX_GPUS:  # before the search for a node count below, which walks the GPUs
        raise PlanInputError(f"tp x pp x dp = {gpus:,} GPUs; plan3d plans at most {MAX_GPUS:,}")
    if nodes is not None:
        return nodes, "--nodes"
    if gpus <= gpus_per_node:
        return 1, f"one node of {gpus_per_node}" + (f", {gpus} GPUs used" if gpus < gpus_per_node
                                                     else "")
    if gpus % gpus_per_node == 0:
        return gpus // gpus_per_node, f"{gpus_per_node}-GPU nodes"
    for n in range(2, gpus + 1):
        per = gpus // n
        if gpus % n == 0 and per <= gpus_per_node and per % tp == 0:
            return n, (f"{gpus} GPUs do not fill {gpus_per_node}-GPU nodes: planned as {n} nodes "
                       f"of {per}, whole TP groups per node; --nodes to choose")
    return gpus // tp, "one TP group per node"  # unreachable while tp <= gpus_per_node


@dataclass(frozen=True)
class SplitComparison:
    optimal: Plan
    even: Plan
    equal_params: Plan
    method: str  # how the optimum was found, with the solver's note
    capacity_bytes: float
    placement: str = ""  # how the GPUs were put on nodes (place_nodes)

    def plan(self, key: str) -> Plan:
        return getattr(self, key)

    def fits(self, key: str) -> bool:
        return self.plan(key).metrics.peak_memory_bytes <= self.capacity_bytes

    @property
    def best(self) -> str:
        """The fastest split that fits (the min-bottleneck one on a tie, or when none fits)."""
        fitting = [key for key, _ in SPLITS if self.fits(key)] or ["optimal"]
        return min(fitting, key=lambda key: (self._step(key) * (1 + TIE) if key != "optimal"
                                             else self._step(key)))

    def _step(self, key: str) -> float:
        return self.plan(key).metrics.step_time_s

    def verdict(self, key: str) -> str:
        """"best", "ties" (as fast as the best) or how much slower than the best."""
        if key == self.best:
            return "best"
        best = self._step(self.best)
        if abs(self._step(key) - best) <= TIE * best:
            return "ties"
        change = best / self._step(key) - 1
        return f"{change:+.2%}" if abs(change) < 0.001 else f"{change:+.1%}"

    @property
    def gain(self) -> float:
        """Throughput gain of the best split over Megatron's even split (0 when even is best)."""
        return self._step("even") / self._step(self.best) - 1

    @property
    def assumptions(self) -> dict:
        plan = self.optimal
        par, cl = plan.parallel, plan.cluster
        return {"gpus": cl.gpus, "nodes": cl.nodes, "gpus_per_node": cl.gpus_per_node,
                "gpu": cl.hardware.name, "placement": self.placement, "tp": par.tp,
                "pp": par.pp, "dp": par.dp, "micro_batch": par.micro_batch,
                "num_microbatches": par.num_microbatches, "global_batch": par.global_batch,
                "seq_length": plan.model.seq_length, "schedule": par.schedule,
                "virtual_stages": par.virtual_stages, "zero": par.zero,
                "recompute": par.recompute}


def compare_splits(model: ModelSpec, cluster: Cluster, par: Parallel, opts: Stack,
                   method: str = "ilp", profile=None, exact_recompute: bool = False,
                   lp_path=None, placement: str = "") -> SplitComparison:
    tables = cost_tables(model, par, cluster.hardware, opts, profile, exact=exact_recompute)

    def run(split) -> Plan:
        return evaluate(model, cluster, par, opts, bounds=list(split.bounds),
                        recompute_per_chunk=list(split.recompute), tables=tables, profile=profile,
                        simulated=True, recompute_layers=list(split.recompute_layers))

    best = best_split(model, cluster, par, opts, tables, method, lp_path)
    params = param_split(model, cluster, par, opts, tables)
    even = megatron_split(model, cluster, par, opts, tables)
    return SplitComparison(
        optimal=run(best), even=run(even), equal_params=run(params), method=best.how,
        capacity_bytes=cluster.capacity_bytes, placement=placement)


def _split_table(title: str, plan: Plan, capacity: float) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("stage", "rank", "layers", "blocks", "recompute", "time/mb ms",
                "of bottleneck", "memory GiB"):
        table.add_column(col, justify="right")
    bottleneck = max(s.time_s for s in plan.stages)
    pp, mirrored = plan.parallel.pp, plan.parallel.schedule_traits.mirrored
    for s in plan.stages:
        blocks = sum(1 for layer in plan.model.layers[s.first:s.last] if layer.kind == "block")
        # DualPipe holds each stage on two ranks, r and its mirror pp - 1 - r
        ranks = sorted({s.rank, pp - 1 - s.rank}) if mirrored else [s.rank]
        table.add_row(str(s.stage), ", ".join(map(str, ranks)), f"[{s.first},{s.last})", str(blocks),
                      s.recompute_label, f"{s.time_s * 1e3:.2f}", f"{s.time_s / bottleneck:.0%}",
                      f"{plan.rank_memory_bytes[s.rank] / GIB:.1f}")
    return table


def assumptions_line(cmp: SplitComparison) -> str:
    a = cmp.assumptions
    return (f"assumed: tp {a['tp']} x pp {a['pp']} x dp {a['dp']} = {a['gpus']} {a['gpu']} GPUs "
            f"on {a['nodes']} node{'s' if a['nodes'] > 1 else ''} of {a['gpus_per_node']} "
            f"({a['placement']}); M = {a['num_microbatches']} microbatches of {a['micro_batch']} "
            f"(--microbatches, default 4 x pp), global batch {a['global_batch']} x "
            f"{a['seq_length']} tokens; {a['schedule']}"
            + (f" v={a['virtual_stages']}" if a["virtual_stages"] > 1 else "")
            + f", ZeRO-{a['zero']}, recompute up to {a['recompute']}")


def print_comparison(console: Console, cmp: SplitComparison) -> None:
    cap, best = cmp.capacity_bytes, cmp.best
    console.print(assumptions_line(cmp), highlight=False)
    label = dict(SPLITS)
    title = f"min-bottleneck split ({cmp.method})"
    if best != "optimal":
        longer = cmp.plan("optimal").metrics.step_time_s / cmp.plan(best).metrics.step_time_s - 1
        title = (f"best split: {label[best]} (the min-bottleneck split, {cmp.method}, simulates "
                 f"a {longer:.1%} longer step)")
    console.print(_split_table(title, cmp.plan(best), cap))
    summary = Table(title="the same configuration, three splits", title_justify="left")
    for col in ("split", "step s", "tokens/s", "bubble", "peak memory GiB", "fits",
                "tokens/s vs best"):
        summary.add_column(col, justify="right")
    for key, name in SPLITS:
        m = cmp.plan(key).metrics
        summary.add_row(name, f"{m.step_time_s:.3f}", f"{m.tokens_per_s:,.0f}",
                        f"{m.bubble_fraction:.1%}", f"{m.peak_memory_bytes / GIB:.1f}",
                        "yes" if cmp.fits(key) else "no", cmp.verdict(key))
    console.print(summary)
    if best == "even" or cmp.verdict("even") == "ties":
        console.print("the even split (Megatron default) is as fast as any split here: no gain "
                      "(step times simulated op by op)", highlight=False)
        return
    console.print(f"predicted throughput gain of the {label[best]} split over the even split: "
                  f"{cmp.gain:+.1%} (step times simulated op by op; splits with the same "
                  "bottleneck can differ a little by where the slowest stage sits)",
                  highlight=False)


def comparison_dict(cmp: SplitComparison) -> dict:
    def split(key: str) -> dict:
        doc = cmp.plan(key).to_dict(with_layout=False)
        return {"stages": doc["stages"], "metrics": doc["metrics"], "fits": cmp.fits(key),
                "vs_best": cmp.verdict(key)}

    return {"method": cmp.method, "assumptions": cmp.assumptions, "best": cmp.best,
            "gain_over_even": round(cmp.gain, 6), **{key: split(key) for key, _ in SPLITS}}
