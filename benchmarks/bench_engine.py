"""Predicted vs measured step time on a real engine, per schedule; print tables.

Each schedule's plan.json gives every stage the same forward, input-backward and weight-backward
times (F = B = W, as in the zero-bubble paper's analysis). torch.distributed.pipelining runs the
plan with stages that sleep those times (planner/engine/sleep_model.py; gloo, one process per
pipeline rank), and `plan simulate --plan plan.json --stack torchtitan` predicts the step from the
same per-action times plus the stack's per-action overhead, charged on every action.

1. Measurement (the source of the torchtitan stack's pipeline_action_overhead_s): 1F1B at
   --measure-microbatches, the per-action cost that makes the simulated step equal the measured
   one (planner/engine/costs.py). It is printed beside the stack's value, so a reader sees
   whether the stack's number holds on this machine.
2. Check: every schedule at --microbatches, predicted with the stack's value, measured/predicted
   (target: within 5% each), and the per-action cost each schedule alone would imply.
   Sleep stages split their backward for free (B and W sleep exactly their share), so the
   check charges no split-backward cost; that cost is a compute effect, measured in 3.
3. --split: torch's fused backward vs its input- plus weight-gradient passes on real decoder
   blocks, one process, one thread (the source of the stack's split_backward_overhead).

Every step time is the median over the --steps steps after the first (a warm-up).
Run: PYTHONPATH=. python benchmarks/bench_engine.py [--pp 2] [--microbatches 8] [--ms 20] [--split]
Needs torch (pip install -e '.[engine]'). Target (the engine issue): every ratio within 5%.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from planner.core.parallel import Parallel
from planner.hardware.profiles import Cluster, Hardware
from planner.launchers import export_plan
from planner.model.spec import ModelSpec
from planner.engine.exported import plan_document
from planner.pipeline.job import on_stack, run_simulation, simulation_job
from planner.predict.plan import Metrics, Plan, Stage
from planner.stack import load_stack, with_overrides

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)]
STACK = "torchtitan"  # the stack that runs torch.distributed.pipelining
SPLIT_SHAPES = [(512, 2, 2, 128), (768, 2, 2, 128), (128, 2, 2, 32)]  # hidden, layers, batch, seq
HW = Hardware(name="sleep", peak_tflops=1, memory_gib=1, memory_bandwidth_gbps=1,
              intra_node_gbps=1, inter_node_gbps=1)


def plan_for(schedule: str, v: int, pp: int, m: int, seconds: float) -> Plan:
    """A plan whose every chunk takes ``seconds / v`` per action (same work per microbatch)."""
    chunks = pp * v
    blocks = 2 * chunks
    model = ModelSpec(name="sleep", num_layers=blocks, hidden_size=32, num_attention_heads=4,
                      num_kv_heads=4, ffn_hidden_size=64, vocab_size=64, seq_length=8,
                      mlp="swiglu", norm="rmsnorm", bias=False, dropout=False)
    bounds = [0] + [1 + 2 * (i + 1) for i in range(chunks - 1)] + [blocks + 2]
    t = seconds / v
    par = Parallel(tp=1, pp=pp, dp=1, micro_batch=1, num_microbatches=m, schedule=schedule,
                   virtual_stages=v, recompute="none", zero=0)
    stages = tuple(Stage(stage=i, rank=i % pp, first=bounds[i], last=bounds[i + 1],
                         recompute="none", time_s=3 * t, memory_bytes=0, fwd_s=t, bwd_s=2 * t,
                         wgrad_s=t) for i in range(chunks))
    return Plan(model=model, cluster=Cluster(hardware=HW, nodes=1, gpus_per_node=pp),
                parallel=par, stages=stages,
                metrics=Metrics(step_time_s=0, tokens_per_s=0, tflops_per_gpu=0, mfu=0, hfu=0,
                                bubble_fraction=0, peak_memory_bytes=0))


def _job(plan: Plan, out: Path):
    """The simulation of the exported plan.json, as `plan simulate --plan` reads it."""
    export_plan(plan, ["json"], out)
    job = simulation_job(None, None, plan.parallel.schedule, plan.parallel.virtual_stages, None,
                         0.0, out / "plan.json")
    return plan_document(out), job


def measure(args) -> dict:
    """Run every schedule and the 1F1B measurement in one gloo world; median step times, the
    per-action cost each run implies, and the predictions on the stack."""
    from planner.engine.costs import implied_action_overhead
    from planner.engine.torch_run import run_pipeline

    stack = with_overrides(load_stack(STACK), split_backward_overhead=0.0)  # sleep: see 2.
    seconds = args.ms / 1e3
    with tempfile.TemporaryDirectory() as tmp:
        runs = [plan_for(s, v, args.pp, args.microbatches, seconds) for s, v in SCHEDULES]
        runs.append(plan_for("1f1b", 1, args.pp, args.measure_microbatches, seconds))
        docs, jobs = zip(*(_job(plan, Path(tmp) / str(i)) for i, plan in enumerate(runs)))
        results = run_pipeline(list(docs), Path(tmp) / "run", steps=args.steps + 1, emulate=True)
    measured = [statistics.median(times[1:]) for _, times in results]
    return {"stack_action_s": stack.pipeline_action_overhead_s,
            "classes": [d["engines"]["torch_pipelining"]["schedule_class"] for d in docs],
            "compute_s": [run_simulation(job).makespan_s for job in jobs],
            "predicted_s": [run_simulation(on_stack(job, stack)).makespan_s for job in jobs],
            "measured_s": measured,
            "implied_s": [implied_action_overhead(job, m) for job, m in zip(jobs, measured)]}


def engine_tables(args) -> None:
    r = measure(args)
    table = Table(title=f"1. per-action overhead, measured: 1F1B, pp={args.pp}, "
                        f"M={args.measure_microbatches}, F = B = W = {args.ms:g} ms")
    for col in ("measured s", "compute only s", "implied ms per action", f"{STACK} stack ms"):
        table.add_column(col, justify="right")
    table.add_row(f"{r['measured_s'][-1]:.3f}", f"{r['compute_s'][-1]:.3f}",
                  f"{r['implied_s'][-1] * 1e3:.2f}", f"{r['stack_action_s'] * 1e3:.2f}")
    Console(width=120).print(table)

    table = Table(title=f"2. engine vs simulator: pp={args.pp} M={args.microbatches}, F = B = W "
                        f"= {args.ms:g} ms, {STACK} stack's per-action overhead")
    for col in ("schedule", "torch class", "compute only s", "predicted s", "measured s",
                "measured/predicted", "implied ms per action"):
        table.add_column(col, justify="right")
    worst = 0.0
    for i, (schedule, _) in enumerate(SCHEDULES):
        p, m = r["predicted_s"][i], r["measured_s"][i]
        worst = max(worst, abs(m / p - 1))
        table.add_row(schedule, r["classes"][i], f"{r['compute_s'][i]:.3f}", f"{p:.3f}",
                      f"{m:.3f}", f"{m / p:.3f}", f"{r['implied_s'][i] * 1e3:.2f}")
    Console(width=120).print(table)
    print(f"worst |measured/predicted - 1| = {worst:.1%} (target: within 5%)")


def split_table(args) -> None:
    from planner.engine.costs import split_backward_times

    table = Table(title="3. split backward on real blocks (torch, CPU, 1 thread): "
                        "stage_backward vs stage_backward_input + stage_backward_weight")
    for col in ("hidden", "layers", "batch x seq", "fused ms", "B ms", "W ms", "B+W / fused"):
        table.add_column(col, justify="right")
    for hidden, layers, batch, seq in SPLIT_SHAPES:
        fused, inp, weight = split_backward_times(hidden, layers, batch, seq)
        table.add_row(str(hidden), str(layers), f"{batch} x {seq}", f"{fused * 1e3:.2f}",
                      f"{inp * 1e3:.2f}", f"{weight * 1e3:.2f}", f"{(inp + weight) / fused:.3f}")
    Console(width=120).print(table)
    print(f"{STACK} stack split_backward_overhead: {load_stack(STACK).split_backward_overhead:g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--measure-microbatches", type=int, default=4,
                        help="microbatches of the 1F1B run that measures the per-action cost")
    parser.add_argument("--ms", type=float, default=20.0, help="per-action time of a stage")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per schedule")
    parser.add_argument("--split", action="store_true", help="also measure the split backward")
    args = parser.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("bench_engine needs torch: pip install -e '.[engine]'")
    engine_tables(args)
    if args.split:
        split_table(args)


if __name__ == "__main__":
    main()
