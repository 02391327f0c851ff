"""`plan solve`: search (or explain one pinned configuration), print the ranked plans, export the
best."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from planner import api
from planner.core.errors import PlanInputError
from planner.core.files import refuse_overwrite, write_text
from planner.core.text import for_rich
from planner.cli.common import (LIMITS, OUTPUT, PINS, PLAN, _flag, app, err, out, parse_range,
                                planned_model, print_json, progress_bar, stack_options, user_errors)


@app.command()
def solve(
    gpus: int = typer.Option(..., "--gpus", help="Total GPUs.", rich_help_panel=PLAN),
    nodes: int = typer.Option(..., "--nodes", help="Nodes; GPUs per node = gpus / nodes.",
                              rich_help_panel=PLAN),
    model: Optional[str] = typer.Option(None, "--model", "-m", show_default="llama3-8b",
                                        help="Preset name, model.json or HF config.json.",
                                        rich_help_panel=PLAN),
    gpu: Optional[str] = typer.Option(None, "--gpu", show_default="a100-80gb",
                                      help="Bundled GPU (plan hardware).", rich_help_panel=PLAN),
    hardware: Optional[Path] = typer.Option(None, "--hardware", help="Your hardware JSON.",
                                            rich_help_panel=PLAN),
    power_limit: Optional[float] = typer.Option(None, "--power-limit", metavar="WATTS",
                                                show_default="the GPU's rated power",
                                                help="Board power cap (nvidia-smi -pl): lowers "
                                                     "the tensor peak, and MFU is of the lowered "
                                                     "peak.", rich_help_panel=PLAN),
    global_batch: Optional[int] = typer.Option(None, "--global-batch",
                                               show_default="~4M tokens",
                                               help="Sequences per step.", rich_help_panel=PLAN),
    global_batch_tokens: Optional[str] = typer.Option(
        None, "--global-batch-tokens", metavar="TOKENS",
        help="The batch in tokens (16Mi, 4M): the nearest whole number of sequences.",
        rich_help_panel=PLAN),
    batch_range: Optional[str] = typer.Option(None, "--global-batch-range", metavar="MIN,MAX",
                                              help="Let the search choose the batch.",
                                              rich_help_panel=PLAN),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", show_default="the model's",
                                          help="Override the sequence length.",
                                          rich_help_panel=PLAN),
    profile_file: Optional[Path] = typer.Option(None, "--profile",
                                                help="Plan from measured layer times "
                                                     "(plan profile --out FILE).",
                                                rich_help_panel=PLAN),
    stack: Optional[str] = typer.Option(None, "--stack", show_default="the launcher's, else "
                                                                      "megatron-core",
                                        help="Software stack NAME (plan stacks) or FILE.",
                                        rich_help_panel=PLAN),
    flash: Optional[bool] = stack_options(PLAN)["flash"],
    overlap: Optional[bool] = stack_options(PLAN)["overlap"],
    tp_overlap: Optional[bool] = stack_options(PLAN)["tp_overlap"],
    grad_dtype: Optional[str] = stack_options(PLAN)["grad_dtype"],
    precision: Optional[str] = stack_options(PLAN)["precision"],
    tp: Optional[int] = typer.Option(None, "--tp", help="Tensor-parallel size.",
                                     rich_help_panel=PINS),
    cp: Optional[int] = typer.Option(None, "--cp", help="Context-parallel size (sequence split "
                                     "over cp GPUs; searched from 16K tokens).",
                                     rich_help_panel=PINS),
    pp: Optional[int] = typer.Option(None, "--pp", help="Pipeline-parallel size.",
                                     rich_help_panel=PINS),
    dp: Optional[int] = typer.Option(None, "--dp", help="Data-parallel size.",
                                     rich_help_panel=PINS),
    micro_batch: Optional[int] = typer.Option(None, "--micro-batch", help="Micro-batch size.",
                                              rich_help_panel=PINS),
    schedule: Optional[str] = typer.Option(None, "--schedule",
                                           help="gpipe | 1f1b | interleaved | zb-h1 | zb-2p | dualpipe.",
                                           rich_help_panel=PINS),
    virtual_stages: Optional[int] = typer.Option(None, "--virtual-stages",
                                                 help="Chunks per rank (interleaved).",
                                                 rich_help_panel=PINS),
    recompute: Optional[str] = typer.Option(None, "--recompute",
                                            help="none | selective | full | block (each "
                                                 "stage recomputes its first N blocks, N "
                                                 "chosen per stage: Megatron's "
                                                 "--recompute-method block).",
                                            rich_help_panel=PINS),
    zero: Optional[int] = typer.Option(None, "--zero",
                                       help="ZeRO stage 0-3 (1 = distributed optimizer).",
                                       rich_help_panel=PINS),
    sequence_parallel: Optional[bool] = typer.Option(None, "--sequence-parallel/"
                                                     "--no-sequence-parallel", metavar="",
                                                     show_default="searched",
                                                     help="Sequence parallelism on or off.",
                                                     rich_help_panel=PINS),
    ep: Optional[int] = typer.Option(None, "--ep", help="Expert-parallel size (MoE models).",
                                     rich_help_panel=PINS),
    etp: Optional[int] = typer.Option(None, "--etp", show_default="tp",
                                      help="Expert tensor-parallel size (MoE models).",
                                      rich_help_panel=PINS),
    memory_headroom: Optional[float] = typer.Option(
        None, "--memory-headroom", metavar="SHARE",
        show_default="the worst under-estimate of comparable published runs",
        help="Share of each GPU's memory a plan keeps free (0.05: 5%).", rich_help_panel=PLAN),
    expert_load: Optional[float] = typer.Option(None, "--expert-load",
                                                show_default="the stack's (1.0)",
                                                help="MoE: busiest GPU's routed tokens over "
                                                     "the mean (a capacity factor caps it).",
                                                rich_help_panel=PLAN),
    max_bubble: Optional[float] = typer.Option(None, "--max-bubble",
                                               help="Reject plans idling more than this "
                                                    "fraction of the step.",
                                               rich_help_panel=LIMITS),
    launcher: Optional[str] = typer.Option(None, "--launcher",
                                           help="Only plans this launcher runs: megatron | "
                                                "deepspeed | torchtitan.",
                                           rich_help_panel=LIMITS),
    refine: str = typer.Option("auto", "--refine", metavar="auto|K",
                               help="auto: partition and simulate screened configurations "
                                    "until a lower bound proves plan 1 the fastest (within "
                                    "a work budget, else a note says how close); K: at most "
                                    "K.",
                               rich_help_panel=LIMITS),
    partition_solver: str = typer.Option("auto", "--partition",
                                         help="Stage split solver: auto (the exact DP for one "
                                              "chunk per rank, the MILP for interleaved chunks), "
                                              "ilp (PuLP: HiGHS, else CBC) or dp.",
                                         rich_help_panel=LIMITS),
    top: int = typer.Option(10, "--top", help="How many plans to show.", rich_help_panel=OUTPUT),
    wide: bool = _flag(False, "--wide", "Every column, however wide the terminal.", OUTPUT),
    as_json: bool = _flag(False, "--json", "Print the plans as JSON.", OUTPUT),
    csv_file: Optional[Path] = typer.Option(None, "--csv", help="Also write the plans as CSV.",
                                            rich_help_panel=OUTPUT),
    report_file: Optional[Path] = typer.Option(None, "--report", metavar="FILE",
                                               help="Also write an HTML report of the plans "
                                                    "and every feasible candidate.",
                                               rich_help_panel=OUTPUT),
    explain_it: bool = _flag(False, "--explain", "Explain the pinned configuration: fits or "
                                                 "not, by how much.", OUTPUT),
    export: Optional[str] = typer.Option(None, "--export",
                                         help="Write the best plan for: json, megatron, "
                                              "deepspeed, torchtitan, torchrun (comma list).",
                                         rich_help_panel=OUTPUT),
    train_tokens: Optional[str] = typer.Option(None, "--train-tokens", metavar="TOKENS",
                                               help="Print plan 1's days, GPU-hours and energy "
                                                    "to train this many tokens (15T, 300B).",
                                               rich_help_panel=OUTPUT),
    gpu_hour_price: Optional[float] = typer.Option(None, "--gpu-hour-price", metavar="DOLLARS",
                                                   help="With --train-tokens: the cost at this "
                                                        "price per GPU-hour.",
                                                   rich_help_panel=OUTPUT),
    out_dir: Optional[Path] = typer.Option(None, "--out", "-o", help="Directory for --export.",
                                           rich_help_panel=OUTPUT),
    force: bool = _flag(False, "--force", "Overwrite exported files.", OUTPUT),
):
    """Search TP x PP x DP, micro-batch, schedule, recompute and ZeRO; print the best plans.

    Examples:\n
      plan solve --gpus 16 --nodes 2\n
      plan solve --model gpt3-175b --gpus 1024 --nodes 128 --global-batch 1536\n
      plan solve --model llama3-405b --gpus 16384 --nodes 2048 --gpu h100 \\
          --global-batch-tokens 16Mi\n
      plan solve --model llama3-70b --gpus 64 --nodes 8 --gpu h100 --tp 8 --json\n
      plan solve --model llama3-8b --gpus 8 --nodes 1 --gpu h100 --power-limit 500\n
      plan solve --model llama3-70b --gpus 512 --nodes 64 \\
          --train-tokens 15T --gpu-hour-price 2.5\n
      plan solve --gpus 16 --nodes 2 --launcher megatron \\
          --export megatron,torchrun --out run/\n
      plan solve --gpus 16 --nodes 2 --tp 2 --pp 2 --micro-batch 4 --explain
    """
    # imported here, not at the top: `plan --help` and `plan solve --help` load no search (lazy on
    # purpose; benchmarks/bench_startup.py)
    from planner.api import solving as steps
    from planner.report.frames import plans_csv
    from planner.report.plans import explanation_dict, print_explanation, print_search

    with user_errors(as_json):
        if gpu is not None and hardware is not None:
            raise PlanInputError("give --gpu NAME or --hardware FILE, not both")
        targets = steps.parse_targets(export)
        # flags that would be ignored: refused before anything is loaded or searched
        problem = steps.output_refusal(explain=explain_it, targets=targets, out_dir=out_dir,
                                       csv_file=csv_file, force=force, as_json=as_json,
                                       wide=wide, report_file=report_file) or \
            steps.explain_refusal(explain_it, max_bubble=max_bubble)
        if problem:
            raise PlanInputError(problem)
        if report_file is not None:  # before the search, not after it
            refuse_overwrite([report_file], force)
        budget = steps.training_budget(train_tokens, gpu_hour_price)
        spec = planned_model(model, seq_len)
        asked = f"--launcher {launcher}" if launcher else None  # else, if any, --export's
        launcher = steps.implied_launcher(launcher, targets)  # --export X: X's rules and stack
        pins = dict(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, schedule=schedule,
                    virtual_stages=virtual_stages, recompute=recompute, zero=zero,
                    sequence_parallel=sequence_parallel, cp=cp, ep=ep, etp=etp)
        req = steps.solve_request(
            gpus, nodes, spec, gpu=gpu, hardware=hardware, global_batch=global_batch,
            global_batch_range=parse_range(batch_range), max_bubble=max_bubble, top=top,
            refine=refine, launcher=launcher, partition=partition_solver, profile=profile_file,
            stack=stack, flash=flash, overlap=overlap, tp_overlap=tp_overlap,
            grad_dtype=grad_dtype, precision=precision, pins=pins, power_limit=power_limit,
            expert_load=expert_load, memory_headroom=memory_headroom,
            global_batch_tokens=global_batch_tokens, asked=asked or f"--export {launcher}",
            cli=True)
        if global_batch_tokens is not None:
            err.print(f"note: --global-batch-tokens {for_rich(global_batch_tokens)}: "
                      f"{req.global_batch} sequences of {req.model.seq_length} tokens "
                      f"({req.global_batch * req.model.seq_length:,} tokens)", highlight=False)
        cluster = req.cluster
        if explain_it:
            explanation = steps.explain_request(req)
            if as_json:
                print_json(explanation_dict(explanation))
            else:
                print_explanation(out, explanation, wide=wide)
            return
        with progress_bar("searching") as progress:
            result = steps.search_plans(req, progress)
        hint = None
        if not as_json:
            with progress_bar("checking a larger batch") as progress:
                hint = steps.batch_hint(req, result.plans[0])
        if csv_file is not None:
            write_text(csv_file, plans_csv(result.plans), force=force)
        if report_file is not None:
            api.report(result, out=report_file, force=force)
            err.print(f"wrote {for_rich(str(report_file))}", highlight=False)
        if targets:
            written = steps.export_plan(result.plans[0], targets, out_dir, force=force)
            err.print("wrote " + for_rich(", ".join(str(p) for p in written)), highlight=False)
        if as_json:
            doc = {"plans": [steps.plan_document(p) for p in result.plans],  # plan.json v2
                   **({"training": steps.training_cost(result.plans[0], budget).to_dict()}
                      if budget else {}),
                   "rejected": result.rejected,
                   "search": {"considered": result.considered, "screened": result.screened,
                              "not_refined": result.not_refined, "feasible": result.feasible,
                              "folded": result.folded, "returned": len(result.plans),
                              "notes": list(result.notes)}}
            print_json(doc)
        else:
            print_search(out, result, spec, cluster, wide=wide, hint=hint)
            if budget:
                training = steps.training_cost(result.plans[0], budget)
                out.print(training.line(budget[1]), highlight=False)
                out.print(training.failures_line(), highlight=False)
            if req.profile is not None:
                out.print(for_rich(steps.analytical_comparison(req, result.plans[0])),
                          highlight=False)
