"""Regret of the search: how far its best plan is from the true best, and at what screen rank the
true winner sat.

For every case (dense models of 1.7B to 405B parameters, 8 to 16,384 GPUs, any schedule and each
schedule family pinned, tight memory on A100-40GB and loose on A100-80GB):
- search: `plan solve`'s search as shipped (top 10, --refine auto: until plan 1 is proven);
- true best: the branch and bound with no cap on refinement, which is exact: every configuration
  it skips has a lower bound above the best step (the bound's property is tested in
  tests/test_bound.py), so refining every screened configuration gives the same best;
- checked by brute force: a random sample of screened configurations (all of them when there are
  at most --sample) is refined; "beats" counts those faster than the true best (must be 0).
"uneven": whether the true best is interleaving whose blocks do not divide into its pp·v chunks
(searched by default since issue #30: planner/search/space.py bounded_first).
regret % = (search's best - true best) / true best.  "rank" is the true winner's position among the
screened configurations (up to ZeRO stage) in the screen's order: a fixed top-K refinement
(--refine K) misses it whenever the rank exceeds K; --refine auto goes on past it in bound order.

Run: python benchmarks/bench_regret.py [--quick] [--sample N] [--seed S]
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from dataclasses import replace

from planner.core.errors import NoFeasiblePlan
from planner.core.parallel import SCHEDULES
from planner.hardware.profiles import load_hardware, make_cluster
from planner.model.load import load_model
from planner.search.costs import SearchCosts
from planner.search.request import Pins, Request
from planner.search.solver import capacity_bytes, screen, search
from planner.search.space import bounded_first, enumerate_configs

CASES = [  # (model, gpus, nodes, global batch)
    ("megatron-1.7b", 8, 1, 64),
    ("llama3-8b", 64, 8, 512),
    ("llama2-13b", 128, 16, 512),
    ("llama3-70b", 512, 64, 1024),
    ("gpt3-175b", 1024, 128, 1536),
    ("llama3-405b", 16384, 2048, 2048),
]
QUICK = CASES[:3]
MEMORY = {"tight": "a100-40gb", "loose": "a100-80gb"}


def screen_order(req: Request) -> tuple[list, SearchCosts]:
    """The screened configurations grouped up to ZeRO, in the search's screen order."""
    costs = SearchCosts(req)
    groups: dict = {}
    for par in screen(req, costs, list(enumerate_configs(req, Counter())), Counter()):
        groups.setdefault(replace(par, zero=0), []).append(par)
    return list(groups.values()), costs


def run_case(model: str, gpus: int, nodes: int, batch: int, memory: str, schedule: str | None,
             sample: int, rng: random.Random) -> list[str] | None:
    hw = load_hardware(MEMORY[memory])
    req = Request(model=load_model(model), cluster=make_cluster(hw, gpus, nodes),
                  global_batch=batch, pins=Pins(schedule=schedule))
    try:
        start = time.perf_counter()
        shipped = search(req)
        search_s = time.perf_counter() - start
        truth = search(replace(req, top=1, refine=10**9))
    except NoFeasiblePlan:
        return [f"{model} on {gpus}", memory, schedule or "any", "-", "-", "-", "nothing fits",
                "-", "-", "-", "-", "-"]
    best = truth.plans[0]
    groups, costs = screen_order(req)
    winner = replace(best.parallel, zero=0)
    rank = next(i for i, g in enumerate(groups, 1) if replace(g[0], zero=0) == winner)
    configs = [par for g in groups for par in g]
    picked = configs if len(configs) <= sample else rng.sample(configs, sample)
    cap = capacity_bytes(req.cluster)
    beats = 0
    for par in picked:
        plan = costs.refined(par)
        if (not isinstance(plan, str) and plan.metrics.peak_memory_bytes <= cap
                and plan.metrics.step_time_s < best.metrics.step_time_s * (1 - 1e-9)):
            beats += 1
    regret = (shipped.plans[0].metrics.step_time_s / best.metrics.step_time_s - 1) * 100
    uneven = "yes" if bounded_first(req, best.parallel) else "no"
    return [f"{model} on {gpus}", memory, schedule or "any", str(truth.screened),
            str(shipped.refined), str(truth.refined), f"{best.metrics.step_time_s:.3f}", uneven,
            f"{regret:.1f}", str(rank), f"{len(picked)}{' (all)' if picked is configs else ''}",
            str(beats), f"{search_s:.1f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the three smallest cases only")
    parser.add_argument("--sample", type=int, default=40,
                        help="screened configurations refined by brute force per case")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    head = ["case", "memory", "schedule", "screened", "refined", "to prove", "best s", "uneven",
            "regret %", "rank", "sampled", "beats", "search s"]
    widths = [24, 7, 12, 9, 8, 9, 10, 7, 9, 6, 11, 6, 9]
    print("".join(h.ljust(w) for h, w in zip(head, widths)))
    for case in (QUICK if args.quick else CASES):
        for memory in MEMORY:
            for schedule in (None,) + SCHEDULES:
                row = run_case(*case, memory, schedule, args.sample, rng)
                print("".join(c.ljust(w) for c, w in zip(row, widths)), flush=True)


if __name__ == "__main__":
    main()
