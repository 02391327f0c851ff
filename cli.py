"""plan: the plan3d command line. Each command parses, calls the planner, renders; no logic here."""

from __future__ import annotations

import json
import math
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer

try:  # typer up to 0.1x raises click's errors; later typer vendors click under its own base class
    from click import ClickException as _UsageProblem
except ImportError:
    from typer.exceptions import TyperException as _UsageProblem
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from planner.launchers import export_plan, implied_launcher, parse_targets
from planner.report.gantt import render_gantt, to_svg
from planner.layout.ranks import LayoutError, build_layout, require_node_local_tp
from planner.report.layout import render_layout
from planner.pipeline.job import (check_sizes, on_stack, run_simulation, simulation_job,
                                  simulation_summary)
from planner.core.errors import NoFeasiblePlan, PlanInputError
from planner.hardware.profiles import bundled_hardware, load_hardware, make_cluster
from planner.model.spec import PRESETS, load_model, sequence_note
from planner.model.template import model_template
from planner.report.plans import (explanation_dict, hardware_table, models_table, plans_csv,
                                  print_explanation, print_search, stacks_dict, stacks_table)
from planner.partition.problem import PartitionError
from planner.report.models import template_table
from planner.report.partition import (comparison_dict, compare_splits, place_nodes,
                                      print_comparison)
from planner.core.parallel import Parallel
from planner.pipeline.schedule import ScheduleError
from planner.profile.machine import calibrate
from planner.core.files import refuse_overwrite, write_text
from planner.core.text import for_rich
from planner.profile.profiler import load_profile, profile_model, save_profile
from planner.report.output import (INPUT_ERROR, NOTHING_FITS, error_document, error_markup,
                                   json_text)
from planner.report.profile import profile_table
from planner.search.advice import batch_hint
from planner.search.engine import analytical_comparison, check_profile_matches, explain, search
from planner.search.space import Pins, Request, tp_rule, validate_pins
from planner.predict.stages import METHODS
from planner.stack import bundled_stacks, resolve_stack
from planner.fidelity.calibrate import calibrate as calibrate_runs, calibrated_profile, parse_factors
from planner.fidelity.published import DEFAULT_FILES, load_cases, validate_file
from planner.report.calibration import calibration_table
from planner.report.validation import validation_markdown, validation_table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Plan tensor x pipeline x data parallel training of large models.\n\n"
                       "Example: plan solve --gpus 16 --nodes 2")


def _console(stderr: bool = False) -> Console:
    """Full width on a terminal; wide (no truncated table cells) when piped or captured."""
    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, width=int(os.environ.get("COLUMNS", "200")))


out = _console()
err = _console(stderr=True)


def print_json(doc) -> None:
    """Plain JSON on stdout (no colour, stable bytes, never NaN) for pipes and scripts."""
    sys.stdout.write(json_text(doc))


def _follow_columns() -> None:
    """Piped or captured, the width is $COLUMNS as it is now (tests and scripts set it per call),
    200 without it; a terminal's own width is left alone."""
    for console in (out, err):
        if not console.is_terminal:
            console.width = int(os.environ.get("COLUMNS", "200"))


@contextmanager
def user_errors(as_json: bool = False):
    """Bad input (a file, a flag, an output that cannot be written): one line and exit 2;
    nothing feasible: the reasons and exit 1. With --json the same as a JSON document on stdout."""
    _follow_columns()
    try:
        yield
    except PlanInputError as e:
        _fail("error", "input", str(e), INPUT_ERROR, as_json)
    except NoFeasiblePlan as e:
        _fail("no feasible plan", "infeasible", str(e), NOTHING_FITS, as_json, e.rejected)
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        _fail("error", "output", f"{where}{e.strerror or e}", INPUT_ERROR, as_json)


def _fail(label: str, kind: str, message: str, code: int, as_json: bool, rejected=None):
    err.print(error_markup(label, message), highlight=False, soft_wrap=True)
    if as_json:
        print_json(error_document(kind, message, code, rejected))
    raise typer.Exit(code)


def planned_model(model: Optional[str], seq_len: Optional[int]):
    """The model as planned at --seq-len; a note on stderr when that is not the context it
    declares (an imported config's capped default, or an override)."""
    spec = load_model(model).with_seq_length(seq_len)
    note = sequence_note(spec, seq_len)
    if note:
        err.print(f"note: {for_rich(note)}", highlight=False, soft_wrap=True)
    return spec


@contextmanager
def progress_bar(label: str):
    """A progress callback; a bar on an interactive terminal only (never in pipes or --json)."""
    if not err.is_terminal:
        yield None
        return
    with Progress(TextColumn(label), BarColumn(), _Count(), TimeElapsedColumn(), console=err,
                  transient=True) as bar:
        task = bar.add_task(label, total=None)  # a pulsing bar until the first (done, total)
        yield lambda done, total: bar.update(task, completed=done, total=total)


class _Count(ProgressColumn):
    """done/total once the total is known; nothing before (never "0/None")."""

    def render(self, task) -> Text:
        return Text("" if task.total is None else f"{task.completed:.0f}/{task.total:.0f}")


# Help panels of `plan solve --help`, so 30 options read as four groups. Other commands use the
# same names for the same things, and the short options mean one thing everywhere: -m --model,
# -M --microbatches, -o --out.
PLAN = "What to plan"
PINS = "Pins (fix a dimension; the search covers the rest)"
LIMITS = "Constraints"
OUTPUT = "Output"


def _flag(default: bool, decls: str, help: str, panel: str | None = None):
    """A boolean flag: no value placeholder in --help, its default named."""
    return typer.Option(default, decls, help=help, metavar="", rich_help_panel=panel)


def stack_flags(panel: str | None = None) -> dict:
    """The direct flags that override one field of the stack (None: keep the stack's value)."""
    return {
        "flash": typer.Option(None, "--flash/--no-flash", metavar="", show_default="the stack's",
                              help="Flash attention (scores not stored) or unfused attention.",
                              rich_help_panel=panel),
        "overlap": typer.Option(None, "--overlap/--no-overlap", metavar="",
                                show_default="the stack's",
                                help="Overlap DP grad reduce and param gather with compute.",
                                rich_help_panel=panel),
        "tp_overlap": typer.Option(None, "--tp-overlap/--no-tp-overlap", metavar="",
                                   show_default="the stack's",
                                   help="Hide TP communication in the GEMMs.",
                                   rich_help_panel=panel),
        "grad_dtype": typer.Option(None, "--grad-dtype", show_default="the stack's",
                                   help="Gradient dtype: fp32, bf16 or fp16.",
                                   rich_help_panel=panel),
    }


STACK_FLAGS = stack_flags()


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
    global_batch: Optional[int] = typer.Option(None, "--global-batch",
                                               show_default="~4M tokens",
                                               help="Sequences per step.", rich_help_panel=PLAN),
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
    flash: Optional[bool] = stack_flags(PLAN)["flash"],
    overlap: Optional[bool] = stack_flags(PLAN)["overlap"],
    tp_overlap: Optional[bool] = stack_flags(PLAN)["tp_overlap"],
    grad_dtype: Optional[str] = stack_flags(PLAN)["grad_dtype"],
    tp: Optional[int] = typer.Option(None, "--tp", help="Tensor-parallel size.",
                                     rich_help_panel=PINS),
    pp: Optional[int] = typer.Option(None, "--pp", help="Pipeline-parallel size.",
                                     rich_help_panel=PINS),
    dp: Optional[int] = typer.Option(None, "--dp", help="Data-parallel size.",
                                     rich_help_panel=PINS),
    micro_batch: Optional[int] = typer.Option(None, "--micro-batch", help="Micro-batch size.",
                                              rich_help_panel=PINS),
    schedule: Optional[str] = typer.Option(None, "--schedule",
                                           help="gpipe | 1f1b | interleaved | zb-h1.",
                                           rich_help_panel=PINS),
    virtual_stages: Optional[int] = typer.Option(None, "--virtual-stages",
                                                 help="Chunks per rank (interleaved).",
                                                 rich_help_panel=PINS),
    recompute: Optional[str] = typer.Option(None, "--recompute",
                                            help="none | selective | full.",
                                            rich_help_panel=PINS),
    zero: Optional[int] = typer.Option(None, "--zero",
                                       help="ZeRO stage 0-3 (1 = distributed optimizer).",
                                       rich_help_panel=PINS),
    sequence_parallel: Optional[bool] = typer.Option(None, "--sequence-parallel/"
                                                     "--no-sequence-parallel", metavar="",
                                                     show_default="searched",
                                                     help="Sequence parallelism on or off.",
                                                     rich_help_panel=PINS),
    max_bubble: Optional[float] = typer.Option(None, "--max-bubble",
                                               help="Reject plans idling more than this "
                                                    "fraction of the step.",
                                               rich_help_panel=LIMITS),
    launcher: Optional[str] = typer.Option(None, "--launcher",
                                           help="Only plans this launcher runs: megatron | "
                                                "deepspeed | torchtitan.",
                                           rich_help_panel=LIMITS),
    refine: int = typer.Option(20, "--refine", help="Partition and simulate at most K "
                                                    "screened configurations; fewer when a "
                                                    "lower bound proves plan 1 the fastest.",
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
    explain_it: bool = _flag(False, "--explain", "Explain the pinned configuration: fits or "
                                                 "not, by how much.", OUTPUT),
    export: Optional[str] = typer.Option(None, "--export",
                                         help="Write the best plan for: json, megatron, "
                                              "deepspeed, torchtitan, torchrun (comma list).",
                                         rich_help_panel=OUTPUT),
    out_dir: Optional[Path] = typer.Option(None, "--out", "-o", help="Directory for --export.",
                                           rich_help_panel=OUTPUT),
    force: bool = _flag(False, "--force", "Overwrite exported files.", OUTPUT),
    torchtitan_version: str = typer.Option("0.3.0", "--torchtitan-version",
                                           help="torchtitan release for --export torchtitan: "
                                                "0.3.0 (arguments) or 0.2 (TOML).",
                                           rich_help_panel=OUTPUT),
):
    """Search TP x PP x DP, micro-batch, schedule, recompute and ZeRO; print the best plans.

    Examples:\n
      plan solve --gpus 16 --nodes 2\n
      plan solve --model gpt3-175b --gpus 1024 --nodes 128 --global-batch 1536\n
      plan solve --model llama3-70b --gpus 64 --nodes 8 --gpu h100 --tp 8 --json\n
      plan solve --gpus 16 --nodes 2 --launcher megatron --export megatron,torchrun --out run/\n
      plan solve --gpus 16 --nodes 2 --tp 2 --pp 2 --micro-batch 4 --explain
    """
    with user_errors(as_json):
        if gpu is not None and hardware is not None:
            raise PlanInputError("give --gpu NAME or --hardware FILE, not both")
        targets = parse_targets(export)
        spec = planned_model(model, seq_len)
        cluster = make_cluster(load_hardware(gpu, hardware), gpus, nodes)
        pins = Pins(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, schedule=schedule,
                    virtual_stages=virtual_stages, recompute=recompute, zero=zero,
                    sequence_parallel=sequence_parallel)
        launcher = implied_launcher(launcher, targets)  # --export X runs X's rules and stack
        if targets and out_dir is None:
            raise PlanInputError("--export needs --out DIR for the files")
        measured = load_profile(profile_file) if profile_file is not None else None
        if measured is not None:
            check_profile_matches(measured, spec)
        req = Request(model=spec, cluster=cluster, global_batch=global_batch,
                      batch_range=parse_range(batch_range), max_bubble=max_bubble,
                      profile=measured, pins=pins, top=top, refine=refine,
                      launcher=launcher, partition_method=partition_solver,
                      options=resolve_stack(stack, launcher, flash, overlap, tp_overlap,
                                            grad_dtype))
        if explain_it:
            explanation = explain(req)
            if as_json:
                print_json(explanation_dict(explanation))
            else:
                print_explanation(out, explanation, wide=wide)
            return
        with progress_bar("searching") as progress:
            result = search(req, progress)
        hint = None
        if not as_json:
            with progress_bar("checking a larger batch") as progress:
                hint = batch_hint(req, result.plans[0], search)
        if csv_file is not None:
            write_text(csv_file, plans_csv(result.plans), force=force)
        if targets:
            written = export_plan(result.plans[0], targets, out_dir, force=force,
                                  torchtitan_version=torchtitan_version)
            err.print("wrote " + for_rich(", ".join(str(p) for p in written)), highlight=False)
        if as_json:
            doc = {"plans": [p.to_dict() for p in result.plans], "rejected": result.rejected,
                   "search": {"considered": result.considered, "screened": result.screened,
                              "not_refined": result.not_refined, "feasible": result.feasible,
                              "folded": result.folded, "returned": len(result.plans)}}
            print_json(doc)
        else:
            print_search(out, result, spec, cluster, wide=wide, hint=hint)
            if measured is not None:
                out.print(for_rich(analytical_comparison(req, result.plans[0])), highlight=False)


def parse_range(text: Optional[str]) -> Optional[tuple[int, int]]:
    if text is None:
        return None
    try:
        low, high = (int(x) for x in text.split(","))
    except ValueError:
        raise PlanInputError(f"--global-batch-range takes MIN,MAX (two integers), got {text!r}")
    return low, high


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

    Examples:\n
      plan profile llama3-8b --out llama3-8b.cpu.json\n
      plan solve --gpus 16 --nodes 2 --profile llama3-8b.cpu.json\n
      plan profile --calibrate --out cpu.json
    """
    with user_errors():
        if device not in ("cpu", "gpu"):
            raise PlanInputError(f"--device must be cpu or gpu, got {device!r}")
        if not (math.isfinite(budget_s) and budget_s > 0):
            raise PlanInputError(f"--budget-s must be a positive number of seconds, got {budget_s}")
        if calibrate_it:
            with progress_bar("calibrating") as progress:
                hw = calibrate(device, progress=_three(progress))
            text = json.dumps(hw, indent=2) + "\n"
            if out_file is not None:
                write_text(out_file, text, force=force)
                err.print(f"wrote {for_rich(str(out_file))}", highlight=False)
            else:
                sys.stdout.write(text)
            return
        spec = load_model(model)
        for name, value in (("--tp", tp), ("--micro-batch", micro_batch), ("--seq-len", seq_len)):
            if value is not None and value < 1:
                raise PlanInputError(f"{name} must be positive, got {value}")
        if out_file is not None:
            refuse_overwrite([out_file], force)
        with progress_bar("profiling") as progress:
            measured = profile_model(spec, device=device, tp=tp, micro_batch=micro_batch,
                                     seq_len=seq_len, budget_s=budget_s, repeats=repeats,
                                     progress=_three(progress))
        out.print(profile_table(measured))
        if device == "gpu":
            err.print("[dim]note: the GPU path is tested with a stand-in CuPy module but has not "
                      "yet been checked on real hardware; sanity-check the TFLOP/s column[/dim]")
        if out_file is not None:
            save_profile(measured, out_file, force=force)
            err.print(f"wrote {for_rich(str(out_file))}", highlight=False)


def _three(progress):
    """Adapt the CLI's (done, total) progress callback to the profiler's (done, total, label)."""
    return None if progress is None else (lambda done, total, label: progress(done, total))


@app.command()
def simulate(
    pp: Optional[int] = typer.Option(None, "--pp", help="Pipeline ranks."),
    microbatches: Optional[int] = typer.Option(None, "--microbatches", "-M",
                                               help="Microbatches per step (M)."),
    schedule: str = typer.Option("1f1b", "--schedule", help="gpipe | 1f1b | interleaved | zb-h1."),
    virtual_stages: int = typer.Option(1, "--virtual-stages", help="Chunks per rank."),
    stage_times: Optional[str] = typer.Option(None, "--stage-times",
                                              help="Forward time per chunk, comma list "
                                                   "(backward = 2x); default all 1."),
    comm_time: float = typer.Option(0.0, "--comm-time", help="Transfer time per boundary."),
    plan_file: Optional[Path] = typer.Option(None, "--plan", help="Draw a saved plan.json."),
    as_json: bool = _flag(False, "--json", "Print the summary as JSON."),
    svg: Optional[Path] = typer.Option(None, "--svg", help="Also write the chart as SVG."),
    force: bool = _flag(False, "--force", "Overwrite the SVG file."),
    stack: Optional[str] = typer.Option(None, "--stack",
                                        help="Check the schedule runs on this stack NAME or FILE "
                                             "and add its per-action overhead."),
):
    """Run a pipeline schedule op by op and draw it.

    Examples:\n
      plan simulate --pp 4 --microbatches 8 --schedule 1f1b\n
      plan simulate --pp 4 --microbatches 8 --schedule interleaved --virtual-stages 2\n
      plan simulate --plan out/plan.json --svg schedule.svg
    """
    with user_errors(as_json):
        job = simulation_job(pp, microbatches, schedule, virtual_stages, stage_times, comm_time,
                             plan_file)
        if stack is not None:
            job = on_stack(job, resolve_stack(stack), from_plan=plan_file is not None)
        result = run_simulation(job)
        if svg is not None:
            write_text(svg, to_svg(result), force=force)
        if as_json:
            print_json(simulation_summary(result))
        else:
            render_gantt(result, out)


@app.command()
def layout(
    tp: int = typer.Option(..., "--tp", help="Tensor-parallel size."),
    pp: int = typer.Option(..., "--pp", help="Pipeline-parallel size."),
    dp: int = typer.Option(..., "--dp", help="Data-parallel size."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="GPUs per node."),
    order: str = typer.Option("tp-dp-pp", "--order", help="tp-dp-pp (Megatron) or tp-pp-dp."),
):
    """Show which rank runs which (tp, pp, dp) slice, node by node, and the process groups.

    Example: plan layout --tp 2 --pp 4 --dp 2 --gpus-per-node 8
    """
    with user_errors():
        try:
            rank_layout = build_layout(tp, pp, dp, gpus_per_node, order)
            require_node_local_tp(rank_layout)
        except LayoutError as e:
            raise PlanInputError(str(e)) from None
        render_layout(rank_layout, out)


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
    schedule: str = typer.Option("1f1b", "--schedule", help="gpipe | 1f1b | interleaved | zb-h1."),
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
):
    """Split the layers into pipeline stages balanced by compute under memory.

    The optimum (ILP, checked against an exact DP) is shown beside Megatron's even split and the
    equal-parameter split, with the predicted throughput gain.

    Examples:\n
      plan partition --model llama3-8b --pp 4\n
      plan partition --model llama3-70b --pp 8 --tp 8 --dp 4 --gpu h100 --recompute selective
    """
    with user_errors(as_json):
        for name, value in (("--pp", pp), ("--tp", tp), ("--dp", dp),
                            ("--microbatches", microbatches)):
            if value is not None and value < 1:
                raise PlanInputError(f"{name} must be positive, got {value}")
        m = microbatches or 4 * pp
        check_sizes(pp, m, virtual_stages)
        if lp is not None:
            refuse_overwrite([lp], force)
        spec = planned_model(model, seq_len)
        run_stack = resolve_stack(stack, None, flash, overlap, tp_overlap, grad_dtype)
        if solver not in METHODS:
            raise PlanInputError(f"--solver must be one of {', '.join(METHODS)}, got {solver!r}")
        gpus = tp * pp * dp
        hw = load_hardware(gpu, hardware)
        node_count, placement = place_nodes(gpus, tp, hw.gpus_per_node, nodes)
        cluster = make_cluster(hw, gpus, node_count)
        pins = Pins(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, schedule=schedule,
                    virtual_stages=virtual_stages, recompute=recompute, zero=zero)
        req = Request(model=spec, cluster=cluster, global_batch=micro_batch * m * dp, pins=pins)
        validate_pins(req)
        rule = tp_rule(spec, cluster, tp)
        if rule is not None:
            raise PlanInputError(f"--tp {tp}: {rule}")
        par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, num_microbatches=m,
                       schedule=schedule, virtual_stages=virtual_stages, recompute=recompute,
                       zero=zero, sequence_parallel=tp > 1)
        try:
            cmp = compare_splits(spec, cluster, par, run_stack, solver, lp_path=lp,
                                 placement=placement)
        except (PartitionError, ScheduleError) as e:
            raise PlanInputError(str(e)) from None
        if as_json:
            print_json(comparison_dict(cmp))
        else:
            print_comparison(out, cmp)


@app.command()
def validate(
    file: Optional[Path] = typer.Argument(None, help="Published runs JSON.",
                                          show_default="the bundled runs"),
    runs: Optional[Path] = typer.Option(None, "--runs",
                                        help="Your own runs file (same format as the bundled "
                                             "profiles/validation/*.json)."),
    hardware: Optional[Path] = typer.Option(None, "--hardware",
                                            help="A GPU profile (e.g. from plan calibrate) used "
                                                 "for every run instead of the bundled one."),
    markdown: bool = typer.Option(False, "--markdown", metavar="",
                                  help="Print a markdown table (the README's)."),
    stack: Optional[str] = typer.Option(None, "--stack",
                                        help="Price every case on this stack NAME or FILE "
                                             "instead of the stack each case names."),
):
    """Predict published training runs and compare: step time, TFLOP/s, memory, ranking.

    Examples: plan validate · plan validate --runs my_runs.json --hardware h100-mine.json
    """
    with user_errors():
        if file is not None and runs is not None:
            raise PlanInputError("give the runs file once: as the argument or as --runs")
        hw = load_hardware(file=hardware) if hardware else None
        with progress_bar("validating") as progress:
            rows, summary = validate_file(file or runs or DEFAULT_FILES, hardware=hw,
                                          stack=resolve_stack(stack) if stack else None,
                                          progress=progress)
        if markdown:
            sys.stdout.write(validation_markdown(rows, summary))
        else:
            out.print(validation_table(rows, summary))


@app.command("calibrate")
def calibrate_cmd(
    runs: Path = typer.Option(..., "--runs", help="Your measured runs (the format of "
                                                  "profiles/validation/*.json), one GPU kind."),
    factors: str = typer.Option("matmul,attention,network", "--factors",
                                help="Efficiency factors to fit (comma list, at most these three)."),
    out_file: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the calibrated GPU "
                                                                      "profile here (for "
                                                                      "--hardware)."),
    force: bool = _flag(False, "--force", "Overwrite --out."),
):
    """Fit the GPU profile's efficiency factors to your own measured runs.

    Least squares on log step-time error; prints the leave-one-out error before and after, so
    you see what the calibration buys on a run it has not seen.

    Example: plan calibrate --runs my_runs.json --factors matmul --out h100-mine.json
    """
    with user_errors():
        names = parse_factors(factors)
        if out_file is not None:
            refuse_overwrite([out_file], force)
        with progress_bar("calibrating") as progress:
            cal = calibrate_runs(load_cases(runs), names, progress)
        out.print(calibration_table(cal))
        if out_file is not None:
            doc = calibrated_profile(cal, runs.name)
            write_text(out_file, json.dumps(doc, indent=2) + "\n", force=force)
            out.print(f"wrote {escape(str(out_file))}; use it with --hardware")


models_app = typer.Typer(help="List the model presets, or show one as a model.json template.")
app.add_typer(models_app, name="models")


@models_app.callback(invoke_without_command=True)
def models(ctx: typer.Context):
    """List the model presets with their parameter counts.

    Example: plan models show llama3-8b --json > model.json
    """
    if ctx.invoked_subcommand is None:
        out.print(models_table(PRESETS))


@models_app.command("show")
def models_show(
    name: str = typer.Argument(..., help="A preset (plan models), model.json or HF config.json."),
    as_json: bool = _flag(False, "--json", "Print the model.json itself."),
):
    """Show a model as a model.json template: every field, its value and meaning.

    Examples:\n
      plan models show llama3-8b\n
      plan models show llama3-8b --json > my-model.json\n
      plan models show path/to/config.json --json   (a HuggingFace config as a model.json)
    """
    with user_errors(as_json):
        spec = load_model(name)
        if as_json:
            print_json(model_template(spec))
        else:
            out.print(template_table(spec))


@app.command("stacks")
def stacks_cmd(as_json: bool = _flag(False, "--json", "Every field and its source, as JSON.")):
    """List the bundled software stacks (plan solve --stack NAME, or --stack FILE)."""
    with user_errors():
        stacks = bundled_stacks()
        if as_json:
            print_json(stacks_dict(stacks))
        else:
            out.print(stacks_table(stacks))


@app.command("hardware")
def hardware_cmd():
    """List the bundled GPU profiles."""
    with user_errors():
        out.print(hardware_table(bundled_hardware()))


def main(argv: Optional[list[str]] = None) -> int:
    """The `plan` command. A flag click cannot parse (``--gpus abc``, an unknown option) is bad
    input like any other: one line, exit 2, and with --json an error document on stdout."""
    args = sys.argv[1:] if argv is None else argv
    try:
        code = app(args=args, prog_name="plan", standalone_mode=False)
    except typer.Abort:  # Ctrl-C
        err.print("aborted", highlight=False)
        return 130
    except _UsageProblem as e:
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        if not message.strip():  # no arguments at all: the help was printed, nothing went wrong
            return getattr(e, "exit_code", INPUT_ERROR)
        try:
            _fail("error", "usage", f"{message} (plan COMMAND --help lists its options)",
                  getattr(e, "exit_code", INPUT_ERROR), "--json" in args)
        except typer.Exit as done:
            return done.exit_code
    return code if isinstance(code, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
