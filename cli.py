"""plan: the plan3d command line. Each command parses, calls the planner, renders; no logic here."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from planner.cost import RunOptions
from planner.errors import NoFeasiblePlan, PlanInputError
from planner.hardware import bundled_hardware, load_hardware, make_cluster
from planner.model import PRESETS, load_model
from planner.report import hardware_table, models_table, print_search
from planner.search import Pins, Request, search

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Plan tensor x pipeline x data parallel training of large models.\n\n"
                       "Example: plan solve --gpus 16 --nodes 2")


def _console(stderr: bool = False) -> Console:
    """Full width on a terminal; wide (no truncated table cells) when piped or captured."""
    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(stderr=stderr, width=200)


out = _console()
err = _console(stderr=True)


@contextmanager
def user_errors():
    """Bad input: one line and exit 2; nothing feasible: the reasons and exit 1."""
    try:
        yield
    except PlanInputError as e:
        err.print(f"[bold red]error:[/bold red] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    except NoFeasiblePlan as e:
        err.print(f"[bold red]no feasible plan:[/bold red] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


@contextmanager
def progress_bar(label: str):
    """A progress callback; a bar on an interactive terminal only (never in pipes or --json)."""
    if not err.is_terminal:
        yield None
        return
    with Progress(TextColumn(label), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task(label, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


@app.command()
def solve(
    gpus: int = typer.Option(..., "--gpus", help="Total GPUs."),
    nodes: int = typer.Option(..., "--nodes", help="Nodes; GPUs per node = gpus / nodes."),
    model: Optional[str] = typer.Option(None, "--model", "-m",
                                        help="Preset name, model.json or HF config.json "
                                             "(default: llama3-8b)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Bundled GPU (plan hardware)."),
    hardware: Optional[Path] = typer.Option(None, "--hardware", help="Your hardware JSON."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch",
                                               help="Sequences per step (default ~4M tokens)."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Override the sequence length."),
    max_bubble: Optional[float] = typer.Option(None, "--max-bubble",
                                               help="Reject plans idling more than this fraction."),
    top: int = typer.Option(10, "--top", help="How many plans to show."),
    as_json: bool = typer.Option(False, "--json", help="Print the plans as JSON."),
    tp: Optional[int] = typer.Option(None, "--tp", help="Pin tensor-parallel size."),
    pp: Optional[int] = typer.Option(None, "--pp", help="Pin pipeline-parallel size."),
    dp: Optional[int] = typer.Option(None, "--dp", help="Pin data-parallel size."),
    micro_batch: Optional[int] = typer.Option(None, "--micro-batch", help="Pin micro-batch."),
    schedule: Optional[str] = typer.Option(None, "--schedule",
                                           help="Pin gpipe | 1f1b | interleaved | zb-h1."),
    virtual_stages: Optional[int] = typer.Option(None, "--virtual-stages",
                                                 help="Pin chunks per rank (interleaved)."),
    recompute: Optional[str] = typer.Option(None, "--recompute",
                                            help="Pin none | selective | full."),
    zero: Optional[int] = typer.Option(None, "--zero", help="Pin ZeRO stage 0-3 (1 = "
                                                           "distributed optimizer)."),
    sequence_parallel: Optional[bool] = typer.Option(None, "--sequence-parallel/"
                                                     "--no-sequence-parallel",
                                                     help="Pin sequence parallelism."),
    flash: bool = typer.Option(True, "--flash/--no-flash",
                               help="Flash attention (scores not stored) or unfused attention."),
    overlap: bool = typer.Option(True, "--overlap/--no-overlap",
                                 help="Overlap DP gradient sync with the backward pass."),
):
    """Search TP x PP x DP, micro-batch, schedule, recompute and ZeRO; print the best plans.

    Examples:\n
      plan solve --gpus 16 --nodes 2\n
      plan solve --model gpt3-175b --gpus 1024 --nodes 128 --global-batch 1536\n
      plan solve --model llama3-70b --gpus 64 --nodes 8 --gpu h100 --tp 8 --json
    """
    with user_errors():
        spec = load_model(model)
        if seq_len is not None:
            if seq_len < 1:
                raise PlanInputError(f"--seq-len must be positive, got {seq_len}")
            spec = spec.with_seq_length(seq_len)
        cluster = make_cluster(load_hardware(gpu, hardware), gpus, nodes)
        if top < 1:
            raise PlanInputError(f"--top must be at least 1, got {top}")
        pins = Pins(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, schedule=schedule,
                    virtual_stages=virtual_stages, recompute=recompute, zero=zero,
                    sequence_parallel=sequence_parallel)
        req = Request(model=spec, cluster=cluster, global_batch=global_batch,
                      max_bubble=max_bubble, pins=pins, top=top,
                      options=RunOptions(flash_attention=flash, overlap_dp=overlap))
        with progress_bar("searching") as progress:
            result = search(req, progress)
        if as_json:
            doc = {"plans": [p.to_dict() for p in result.plans], "rejected": result.rejected,
                   "search": {"screened": result.screened, "returned": len(result.plans)}}
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        else:
            print_search(out, result, spec, cluster)


@app.command()
def models():
    """List the model presets with their parameter counts."""
    out.print(models_table(PRESETS))


@app.command("hardware")
def hardware_cmd():
    """List the bundled GPU profiles."""
    with user_errors():
        out.print(hardware_table(bundled_hardware()))


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
