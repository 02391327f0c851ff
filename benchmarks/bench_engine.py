"""Predicted vs measured step time on a real engine, per schedule; print a table.

Each schedule's plan.json gives every stage the same forward, input-backward and weight-backward
times (F = B = W, as in the zero-bubble paper's analysis). torch.distributed.pipelining runs the
plan with stages that sleep those times (planner/engine/sleep_model.py; gloo, one process per
pipeline rank), and `plan simulate --plan plan.json` predicts the step from the same per-action
times. measured / predicted shows the engine's per-action cost the simulator does not count.

Run: PYTHONPATH=. python benchmarks/bench_engine.py [--pp 2] [--microbatches 8] [--ms 20]
Needs torch (pip install -e '.[engine]'). Target (the engine issue): every ratio within 5%.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from planner.core.parallel import Parallel
from planner.hardware.profiles import Cluster, Hardware
from planner.launchers import export_plan
from planner.model.spec import ModelSpec
from planner.pipeline.job import run_simulation, simulation_job
from planner.predict.plan import Metrics, Plan, Stage

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--ms", type=float, default=20.0, help="per-action time of a stage")
    parser.add_argument("--steps", type=int, default=3, help="steps per schedule (last timed)")
    args = parser.parse_args()
    try:
        from planner.engine.torch_run import run_pipeline
    except ImportError:
        sys.exit("bench_engine needs torch: pip install -e '.[engine]'")
    with tempfile.TemporaryDirectory() as tmp:
        docs, predicted = [], []
        for schedule, v in SCHEDULES:
            out = Path(tmp) / schedule
            export_plan(plan_for(schedule, v, args.pp, args.microbatches, args.ms / 1e3),
                        ["json"], out)
            docs.append(json.loads((out / "plan.json").read_text()))
            job = simulation_job(None, None, schedule, v, None, 0.0, out / "plan.json")
            predicted.append(run_simulation(job).makespan_s)
        measured = [t for _, t in run_pipeline(docs, Path(tmp) / "run", steps=args.steps,
                                               emulate=True)]
    table = Table(title=f"engine vs simulator: pp={args.pp} M={args.microbatches}, "
                        f"F = B = W = {args.ms:g} ms per stage")
    for col in ("schedule", "torch class", "predicted s", "measured s", "measured/predicted",
                "extra ms per action"):
        table.add_column(col, justify="right")
    for (schedule, v), doc, p, m in zip(SCHEDULES, docs, predicted, measured):
        # compute actions on one rank: F and B (and W for zero bubble) per microbatch and chunk
        actions = (3 if schedule == "zb-h1" else 2) * args.microbatches * v
        table.add_row(schedule, doc["engines"]["torch_pipelining"]["schedule_class"],
                      f"{p:.3f}", f"{m:.3f}", f"{m / p:.3f}", f"{(m - p) / actions * 1e3:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
