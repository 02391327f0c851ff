"""`plan profile`, `plan simulate`, `plan layout`: measure this machine, draw a schedule, place
ranks on nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Optional
import json
import sys

import typer

from planner import api
from planner.core.arguments import number
from planner.core.errors import PlanInputError
from planner.core.files import refuse_overwrite, write_text
from planner.core.limits import MAX_BUDGET_S
from planner.core.schedules import DEFAULT_SCHEDULE
from planner.core.text import for_rich
from planner.cli.common import _flag, _three, app, err, out, print_json, progress_bar, user_errors


@app.command()
def profile(
    model: Optional[str] = typer.Argument(None, help="Preset, model.json or HF config.json.",
                                          show_default="llama3-8b"),
    device: str = typer.Option("cpu", "--device", help="cpu (numpy) or gpu (CuPy)."),
    tp: int = typer.Option(1, "--tp", help="Time the TP-sharded shapes of this degree."),
    micro_batch: int = typer.Option(1, "--micro-batch", help="Micro-batch size."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Sequence length.",
                                          show_default="the model's"),
    repeats: int = typer.Option(5, "--repeats", help="Timed runs of each pass; the median is "
                                                     "kept, the spread reported."),
    budget_s: float = typer.Option(10.0, "--budget-s",
                                   help="Per-layer time budget; bigger layers are measured "
                                        "smaller and scaled by FLOPs."),
    out_file: Optional[Path] = typer.Option(None, "--out", "-o", help="Profile JSON to write."),
    force: bool = _flag(False, "--force", "Overwrite --out."),
    calibrate_it: bool = _flag(False, "--calibrate", "Measure matmul and memory speed instead, "
                                                     "and write a hardware profile for "
                                                     "--hardware."),
):
    """Measure per-layer forward/backward time with torch-free kernels on this machine.

    At most 1,048,576 tokens (--micro-batch x --seq-len). On the CPU one
    measurement holds at most 1.5 GiB: a layer whose weights do not fit is
    timed with them held as column tiles, tile by tile, at its full work
    (measured_at in the JSON says so).

    Examples:\n
      plan profile llama3-8b --out llama3-8b.cpu.json\n
      plan solve --gpus 16 --nodes 2 --profile llama3-8b.cpu.json\n
      plan profile --calibrate --out cpu.json
    """
    from planner.report.profile import profile_table  # lazy on purpose: not for `plan --help`

    with user_errors():
        if device not in ("cpu", "gpu"):
            raise PlanInputError(f"--device must be cpu or gpu, got {device!r}")
        number("--budget-s", budget_s, low=0, low_open=True, high=MAX_BUDGET_S)
        if calibrate_it:
            with progress_bar("calibrating") as progress:
                hw = api.measure_machine(device, progress=_three(progress))
            text = json.dumps(hw, indent=2) + "\n"
            if out_file is not None:
                write_text(out_file, text, force=force)
                err.print(f"wrote {for_rich(str(out_file))}", highlight=False)
            else:
                sys.stdout.write(text)
            return
        spec = api.model(model)
        for name, value in (("--tp", tp), ("--micro-batch", micro_batch), ("--seq-len", seq_len)):
            if value is not None and value < 1:
                raise PlanInputError(f"{name} must be positive, got {value}")
        if out_file is not None:
            refuse_overwrite([out_file], force)
        with progress_bar("profiling") as progress:
            measured = api.measure_layers(spec, device=device, tp=tp, micro_batch=micro_batch,
                                          seq_len=seq_len, budget_s=budget_s, repeats=repeats,
                                          progress=_three(progress))
        out.print(profile_table(measured.profile))
        if device == "gpu":
            err.print("[dim]note: the GPU path is tested with a stand-in CuPy module but has not "
                      "yet been checked on real hardware; sanity-check the TFLOP/s column[/dim]")
        if out_file is not None:
            measured.save(out_file, force=force)
            err.print(f"wrote {for_rich(str(out_file))}", highlight=False)


@app.command()
def simulate(
    pp: Optional[int] = typer.Option(None, "--pp", help="Pipeline ranks."),
    microbatches: Optional[int] = typer.Option(None, "--microbatches", "-M",
                                               help="Microbatches per step (M)."),
    # None where a flag has a default: given beside --plan it is refused, not silently ignored
    schedule: Optional[str] = typer.Option(None, "--schedule", show_default=DEFAULT_SCHEDULE,
                                           help="gpipe | 1f1b | interleaved | zb-h1 | zb-2p | "
                                                "dualpipe."),
    virtual_stages: Optional[int] = typer.Option(None, "--virtual-stages", show_default="1",
                                                 help="Chunks per rank."),
    stage_times: Optional[str] = typer.Option(None, "--stage-times",
                                              help="Forward time per chunk, comma list "
                                                   "(backward = 2x); default all 1."),
    comm_time: Optional[float] = typer.Option(None, "--comm-time", show_default="0",
                                              help="Transfer time per boundary (seconds)."),
    plan_file: Optional[Path] = typer.Option(None, "--plan",
                                             help="Draw a saved plan.json (it fixes the "
                                                  "schedule, sizes and times)."),
    as_json: bool = _flag(False, "--json", "Print the summary as JSON."),
    svg: Optional[Path] = typer.Option(None, "--svg", help="Also write the chart as SVG."),
    force: bool = _flag(False, "--force", "Overwrite the SVG file."),
    stack: Optional[str] = typer.Option(None, "--stack",
                                        help="Check the schedule runs on this stack NAME or FILE "
                                             "and charge its per-action costs."),
):
    """Run a pipeline schedule op by op and draw it.

    Examples:\n
      plan simulate --pp 4 --microbatches 8 --schedule 1f1b\n
      plan simulate --pp 4 --microbatches 8 --schedule interleaved \\
          --virtual-stages 2\n
      plan simulate --plan out/plan.json --svg schedule.svg
    """
    # lazy on purpose (here, not at the top): `plan --help` loads no simulator (numpy)
    from planner.report.gantt import priced_line, render_gantt, to_svg

    with user_errors(as_json):
        job, note = api.simulation(pp, microbatches, schedule, virtual_stages, stage_times,
                                   comm_time, plan_file, stack)
        if note:
            err.print(f"note: {for_rich(note)}", highlight=False, soft_wrap=True)
        result = api.simulate(job)
        if svg is not None:
            write_text(svg, to_svg(result), force=force)
        if as_json:
            print_json(api.simulation_summary(result))
        else:
            render_gantt(result, out)
            if job.priced_step_s is not None:
                out.print(for_rich(priced_line(job.priced_step_s, result)), highlight=False)


@app.command()
def layout(
    tp: int = typer.Option(..., "--tp", help="Tensor-parallel size."),
    pp: int = typer.Option(..., "--pp", help="Pipeline-parallel size."),
    dp: int = typer.Option(..., "--dp", help="Data-parallel size."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="GPUs per node."),
    nvlink_domain: int = typer.Option(None, "--nvlink-domain",
                                      help="GPUs per NVLink domain, a multiple of the node "
                                           "(72 on GB200 NVL72) [default: one node]."),
    cp: int = typer.Option(1, "--cp", help="Context-parallel size."),
    ep: int = typer.Option(1, "--ep", help="Expert-parallel size (re-divides tp x cp x dp)."),
    etp: int = typer.Option(None, "--etp", help="Expert tensor-parallel size [default: tp]."),
    order: str = typer.Option("tp-cp-ep-dp-pp", "--order",
                              help="tp-cp-ep-dp-pp (Megatron's default) or tp-cp-ep-pp-dp "
                                   "(--use-tp-pp-dp-mapping); tp-dp-pp / tp-pp-dp also accepted."),
):
    """Show which rank runs which (tp, cp, pp, dp) slice, node by node, and the process groups.

    Examples:\n
      plan layout --tp 2 --pp 4 --dp 2 --gpus-per-node 8\n
      plan layout --tp 2 --cp 2 --pp 2 --dp 2 --ep 4 --etp 1\n
      plan layout --tp 8 --cp 9 --pp 1 --dp 2 --gpus-per-node 4 --nvlink-domain 72
    """
    from planner.report.layout import render_layout  # lazy on purpose: not for `plan --help`

    with user_errors():
        rank_layout = api.layout(tp, pp, dp, gpus_per_node, order, cp=cp, ep=ep, etp=etp,
                                 nvlink_domain=nvlink_domain)
        render_layout(rank_layout, out)
