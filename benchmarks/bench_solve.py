"""Planning time of `plan solve` on the reference cases (ILP partition and simulation included, the
refinement's branch and bound as shipped): a table of medians, then a check of the long-batch case.

The last case runs 999,983 microbatches (a prime global batch under the cap of 10**6 microbatches
of planner/core/limits.py: dp = 1, micro-batch 1): the simulation times a short run and repeats
its steady period (planner/pipeline/periodic.py).  The check below the table simulates the
winning plan's stages op by op at smaller M and extends the per-microbatch slope of two such runs
to M = 999,983: it must give the same step.

"median s" is wall time, the target's measure; "cpu s" the process's own CPU time (median), which
other load on a shared machine inflates less. Each repeat searches in a fresh process, as each
`plan solve` does: the planner's caches of pure functions start empty every time (imports are not
timed).

Run: python benchmarks/bench_solve.py [--repeats N]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

from planner.hardware.profiles import load_hardware, make_cluster
from planner.model.load import load_model
from planner.pipeline.simulate import simulate
from planner.search.request import Request
from planner.search.solver import search

TARGET_S = 2.0  # median wall time of every case on a 2-core machine (issue #17)

CASES = [  # (model, gpus, nodes, global batch[, seq, gpu])
    ("llama3-8b", 16, 2, 512),
    ("gpt3-175b", 1024, 128, 1536),
    ("llama3-405b", 1024, 128, 2048),
    ("mt-nlg-530b", 5120, 640, 1920),
    ("llama3-405b", 16384, 2048, 2048),
    # context parallelism searched (128K tokens: cp from 1 to 128), the Llama 3 long-context
    # phase's cluster (issue #18's "plan solve --seq-len 131072 --gpus 16384 --gpu h100")
    ("llama3-405b", 16384, 2048, 32, 131072, "h100"),
    ("llama3-8b", 16, 2, 999_983),
    # mixture of experts: ep is searched over the divisors of a stage's ranks (issue #18)
    ("mixtral-8x7b", 64, 8, 512, None, "h100"),
    ("deepseek-v3", 2048, 256, 15360, None, "h800"),
]

# MoE models are HuggingFace configs (tests/hf_configs/moe/), planned at 4,096 tokens. DeepSeek-V3
# is planned as its config gives it, with its one multi-token-prediction module
# (num_nextn_predict_layers = 1, the depth the report trained with): planner/cost/mtp.py prices
# it on the output head's stage, so the case is the model as trained, not a lighter one.
MOE = Path(__file__).resolve().parent.parent / "tests" / "hf_configs" / "moe"
MOE_FILES = {"mixtral-8x7b": "mixtral-8x7b-v0.1.json", "deepseek-v3": "deepseek-v3.json"}


def _model(name: str):
    if name in MOE_FILES:
        return load_model(MOE / MOE_FILES[name]).with_seq_length(4096)
    return load_model(name)


def long_batch_check(plan) -> str:
    """The plan's pipeline step at its M from the steady period, against two op-by-op runs at
    smaller M extended by their per-microbatch slope."""
    par, stages = plan.parallel, plan.stages
    args = dict(fwd_s=[s.fwd_s for s in stages], bwd_s=[s.bwd_s for s in stages],
                wgrad_s=[s.wgrad_s for s in stages], comm_s=[s.send_s for s in stages[:-1]] or 0.0,
                timeline=False)
    m = par.num_microbatches
    a, b = (simulate(par.schedule, par.pp, k, par.virtual_stages, method="full", **args)
            for k in (2048, 4096))
    start = time.perf_counter()
    fast = simulate(par.schedule, par.pp, m, par.virtual_stages, **args)
    fast_s = time.perf_counter() - start
    extended = b.makespan_s + (b.makespan_s - a.makespan_s) / 2048 * (m - 4096)
    return (f"M = {m:,} ({par.schedule}, pp {par.pp}): steady-period step {fast.makespan_s:.6f} s "
            f"in {fast_s:.3f} s; op-by-op at M = 2,048 and 4,096 extended: {extended:.6f} s "
            f"(relative difference {abs(fast.makespan_s - extended) / extended:.1e})")


def timed_search(case: tuple) -> tuple[float, float, object]:
    """(wall s, CPU s, result) of one search of a case, run in a fresh process."""
    name, gpus, nodes, batch, *more = case
    seq, gpu = (more + [None, None])[:2]
    model = _model(name) if seq is None else replace(_model(name), seq_length=seq)
    req = Request(model=model, global_batch=batch,
                  cluster=make_cluster(load_hardware(gpu or "a100-80gb"), gpus, nodes))
    start, start_cpu = time.perf_counter(), time.process_time()
    result = search(req)
    return time.perf_counter() - start, time.process_time() - start_cpu, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")
    print(f"{'case':<42}{'screened':>10}{'refined':>9}{'median s':>10}{'cpu s':>7}{'target s':>10}"
          "  ok")
    long_plan = None
    spawn = multiprocessing.get_context("spawn")
    for case in CASES:
        name, gpus, nodes, batch, *more = case
        seq = (more + [None])[0]
        runs = []
        for _ in range(args.repeats):
            with spawn.Pool(1) as pool:
                runs.append(pool.apply(timed_search, (case,)))
        times, cpu, result = [r[0] for r in runs], [r[1] for r in runs], runs[-1][2]
        median = statistics.median(times)
        label = f"{name} on {gpus} GPUs, batch {batch:,}" + (f", seq {seq // 1024}K" if seq
                                                                 else "")
        print(f"{label:<42}{result.screened:>10}{result.refined:>9}{median:>10.2f}"
              f"{statistics.median(cpu):>7.2f}{TARGET_S:>10.1f}"
              f"  {'yes' if median <= TARGET_S else 'NO'}", flush=True)
        if batch > 10**5:
            long_plan = result.plans[0]
    if long_plan is not None:
        print(long_batch_check(long_plan))


if __name__ == "__main__":
    main()
