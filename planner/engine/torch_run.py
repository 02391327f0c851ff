"""Step a plan on ``torch.distributed.pipelining`` with gloo on CPU processes, and the same step in
one process, so the two sets of gradients can be compared.

Everything comes from the plan.json v2 document: the model (``model``), each stage's modules
(``stages[].modules``), which rank holds which stage and the schedule class, microbatch count and
size (``engines.torch_pipelining``). Losses are summed over microbatches (``scale_grads=False``),
so the single-process reference is the sum of the per-microbatch mean cross-entropies. This runner
covers pipeline parallelism only: the world is the pipeline (tp = dp = 1).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules

from planner.engine import sleep_model
from planner.engine.torch_model import build_decoder, loss_fn, stage_module
from planner.core.errors import PlanInputError

ENGINE_KEY = "torch_pipelining"


def engine_entry(doc: dict) -> dict:
    entry = doc.get("engines", {}).get(ENGINE_KEY)
    if not entry or not entry.get("supported", False):
        reason = (entry or {}).get("rule", "the plan has no torch_pipelining entry")
        raise PlanInputError(f"torch.distributed.pipelining cannot run this plan: {reason}")
    return entry


def check_world(doc: dict, world: int) -> None:
    par = doc["parallel"]
    if par["tp"] != 1 or par["dp"] != 1 or par["pp"] != world:
        raise PlanInputError(f"the reference runner runs pipeline parallelism only: it needs "
                             f"tp = dp = 1 and pp = {world} processes, the plan has tp={par['tp']} "
                             f"pp={par['pp']} dp={par['dp']}")


def batch(doc: dict, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token targets for one step: micro_batch * n_microbatches sequences."""
    entry, arch = doc["engines"][ENGINE_KEY], doc["model"]
    gen = torch.Generator().manual_seed(seed)
    rows = entry["microbatch_size"] * entry["n_microbatches"]
    data = torch.randint(arch["vocab_size"], (rows, arch["seq_length"] + 1), generator=gen)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def reference_grads(doc: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Gradients of the whole model in one process: sum over microbatches of their mean loss."""
    entry = doc["engines"][ENGINE_KEY]
    model = build_decoder(doc, seed)
    tokens, targets = batch(doc)
    for x, y in zip(tokens.chunk(entry["n_microbatches"]), targets.chunk(entry["n_microbatches"])):
        loss_fn(model(x), y).backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def pipeline_step(doc: dict, rank: int, seed: int = 0, steps: int = 1,
                  emulate: bool = False) -> tuple[dict, list[float]]:
    """One rank's share of ``steps`` pipeline steps: its stages' gradients after the first step
    (a dict by parameter name) and the wall time of every step in seconds. ``emulate`` runs
    sleep stages with the plan's per-action times instead of the decoder (sleep_model.py)."""
    entry = engine_entry(doc)
    cls = getattr(schedules, entry["schedule_class"])
    mine = entry["stage_ids_per_rank"][rank]
    num_stages = len(doc["stages"])
    if emulate:
        modules = [sleep_model.SleepStage(doc["stages"][s]) for s in mine]
        step_loss = sleep_model.loss_fn
        tokens, targets = sleep_model.batch(entry["microbatch_size"] * entry["n_microbatches"])
    else:
        model = build_decoder(doc, seed)
        modules = [stage_module(model, doc["stages"][s]["modules"]) for s in mine]
        step_loss = loss_fn
        tokens, targets = batch(doc)
    stages = [PipelineStage(m, s, num_stages, torch.device("cpu")) for m, s in zip(modules, mine)]
    single = issubclass(cls, schedules.PipelineScheduleSingle)
    if single and len(stages) != 1:
        raise PlanInputError(f"{entry['schedule_class']} runs one stage per rank; rank {rank} "
                             f"holds stages {mine}")
    schedule = cls(stages[0] if single else stages, n_microbatches=entry["n_microbatches"],
                   loss_fn=step_loss, scale_grads=False)
    args = (tokens,) if 0 in mine else ()
    target = targets if num_stages - 1 in mine else None
    grads, elapsed = {}, []
    for step in range(steps):
        for m in modules:
            m.zero_grad(set_to_none=True)
        dist.barrier()
        start = time.perf_counter()
        schedule.step(*args, target=target)
        dist.barrier()
        elapsed.append(time.perf_counter() - start)
        if step == 0:
            grads = {name: p.grad.detach().clone() for m in modules
                     for name, p in m.named_parameters() if p.grad is not None}
    return grads, elapsed


def _worker(rank: int, docs: list[dict], workdir: str, world: int, steps: int,
            emulate: bool) -> None:
    torch.set_num_threads(1)  # one core per rank: the ranks stand for devices
    dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank,
                            world_size=world)
    try:
        results = [pipeline_step(doc, rank, steps=steps, emulate=emulate) for doc in docs]
        torch.save(results, os.path.join(workdir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_pipeline(docs: list[dict], workdir: str | Path, steps: int = 1,
                 emulate: bool = False) -> list[tuple[dict, list[float]]]:
    """Run every plan in ``docs`` on pp processes (all plans must share pp); per plan, the
    gradients of all stages merged by parameter name and each step's time on the slowest rank
    (the ranks meet at a barrier before and after a step, so they differ by the barrier only)."""
    world = docs[0]["parallel"]["pp"]
    for doc in docs:
        engine_entry(doc)
        check_world(doc, world)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(docs, str(workdir), world, steps, emulate), nprocs=world, join=True)
    per_rank = [torch.load(workdir / f"rank{r}.pt") for r in range(world)]
    merged = []
    for i in range(len(docs)):
        grads: dict = {}
        for rank_results in per_rank:
            grads.update(rank_results[i][0])
        times = [max(step) for step in zip(*(rank_results[i][1] for rank_results in per_rank))]
        merged.append((grads, times))
    return merged
