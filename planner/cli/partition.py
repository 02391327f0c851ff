"""`plan partition`: the optimal stage split beside the even and equal-parameter splits."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from planner import api
from planner.core.errors import PlanInputError
from planner.core.files import refuse_overwrite
from planner.core.schedules import DEFAULT_SCHEDULE
from planner.cli.common import STACK_FLAGS, _flag, app, out, planned_model, print_json, user_errors


@app.command()
def partition(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Preset, model.json or HF "
                                                                    "config.json.",
                                        show_default="llama3-8b"),
    pp: int = typer.Option(..., "--pp", help="Pipeline stages."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel size."),
    dp: int = typer.Option(1, "--dp", help="Data-parallel size (shards ZeRO states)."),
    micro_batch: int = typer.Option(1, "--micro-batch", help="Micro-batch size."),
    microbatches: Optional[int] = typer.Option(None, "--microbatches", "-M",
                                               help="Microbatches per step.",
                                               show_default="4 x pp"),
    schedule: str = typer.Option(DEFAULT_SCHEDULE, "--schedule",
                                 help="gpipe | 1f1b | interleaved | zb-h1 | zb-2p."),
    virtual_stages: int = typer.Option(1, "--virtual-stages", help="Chunks per rank."),
    recompute: str = typer.Option("full", "--recompute",
                                  help="The most recompute a stage may use."),
    zero: int = typer.Option(1, "--zero", help="ZeRO stage."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Bundled GPU.",
                                      show_default="a100-80gb"),
    hardware: Optional[Path] = typer.Option(None, "--hardware", help="Your hardware JSON."),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="Nodes holding the tp x pp x dp "
                                        "GPUs (default: the hardware's GPUs per node)."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Override the sequence length."),
    solver: str = typer.Option("auto", "--solver", help="auto (the exact DP for one chunk per "
                                                          "rank, the MILP for interleaved chunks), "
                                                          "ilp (PuLP: HiGHS or CBC) or dp."),
    lp: Optional[Path] = typer.Option(None, "--lp", help="Write the ILP model to this file."),
    as_json: bool = _flag(False, "--json", "Print the splits as JSON."),
    force: bool = _flag(False, "--force", "Overwrite the --lp file."),
    stack: Optional[str] = typer.Option(None, "--stack", help="Software stack NAME or FILE."),
    flash: Optional[bool] = STACK_FLAGS["flash"],
    overlap: Optional[bool] = STACK_FLAGS["overlap"],
    tp_overlap: Optional[bool] = STACK_FLAGS["tp_overlap"],
    grad_dtype: Optional[str] = STACK_FLAGS["grad_dtype"],
    precision: Optional[str] = STACK_FLAGS["precision"],
):
    """Split the layers into pipeline stages balanced by compute under memory.

    The optimum (ILP, checked against an exact DP) is shown beside Megatron's even
    split and the equal-parameter split, with the predicted throughput gain.

    Examples:\n
      plan partition --model llama3-8b --pp 4\n
      plan partition --model llama3-70b --pp 8 --tp 8 --dp 4 --gpu h100 \\
          --recompute selective
    """
    # lazy on purpose (here, not at the top): `plan --help` loads no prediction
    from planner.report.partition import comparison_dict, print_comparison

    with user_errors(as_json):
        for name, value in (("--pp", pp), ("--tp", tp), ("--dp", dp),
                            ("--microbatches", microbatches)):
            if value is not None and value < 1:
                raise PlanInputError(f"{name} must be positive, got {value}")
        m = microbatches or 4 * pp
        api.check_pipeline(pp, m, virtual_stages)
        if lp is not None:
            refuse_overwrite([lp], force)
        spec = planned_model(model, seq_len)
        run_stack = api.stack(stack, None, flash, overlap, tp_overlap, grad_dtype, precision)
        if solver not in api.PARTITION_SOLVERS:
            raise PlanInputError(f"--solver must be one of {', '.join(api.PARTITION_SOLVERS)}, "
                                 f"got {solver!r}")
        cmp, _ = api.compare_partitions(
            spec, api.hardware(gpu, hardware), run_stack, tp=tp, pp=pp, dp=dp,
            micro_batch=micro_batch, microbatches=m, schedule=schedule,
            virtual_stages=virtual_stages, recompute=recompute, zero=zero, nodes=nodes,
            solver=solver, lp_path=lp)
        if as_json:
            print_json(comparison_dict(cmp))
        else:
            print_comparison(out, cmp)
