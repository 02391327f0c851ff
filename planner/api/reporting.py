"""`plan report` and `plan solve --report`: the plans as one self-contained HTML page
(planner/report/html_report.py)."""

from __future__ import annotations

from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.files import read_json, write_text
from planner.fidelity.record import load_record
from planner.launchers import plan_document
from planner.report.html_report import render_report
from planner.report.report_input import (Candidate, ReportInput, configuration_label,
                                         read_report_document, report_input)


def report(source, out: str | Path | None = None, force: bool = False) -> str:
    """The HTML report of ``source``: a plan.json or `plan solve --json` output (a path), or a
    search's result (a Solution from :func:`solve`, or the search's own result), whose every
    feasible candidate it plots. Written atomically to ``out`` when given (refused if it exists,
    unless ``force``); the page is returned either way. PlanInputError on a file that is not a
    plan, or a field of it out of type or range."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        doc = read_json(path, "plan file", "write one with plan solve --export json --out DIR "
                                           "or plan solve --json > FILE")
        data = read_report_document(doc, str(path))
    elif hasattr(source, "plans") and hasattr(source, "candidates"):
        data = solution_input(source)
    else:
        raise PlanInputError(f"source must be a plan file path or a solve result, got "
                             f"{type(source).__name__}")
    html = render_report(data, load_record())
    if out is not None:
        write_text(out, html, force=force)
    return html


def solution_input(result) -> ReportInput:
    """A search's plans (plan.json documents, as `plan solve --json` lists them) and every
    feasible candidate it refined, the shown ones numbered by their row."""
    plans = tuple(result.plans)
    shown = {id(p): i + 1 for i, p in enumerate(plans)}
    candidates = tuple(
        Candidate(c.metrics.step_time_s, c.metrics.peak_memory_bytes, _label(c),
                  shown.get(id(c)))
        for c in (result.candidates or plans))
    return report_input([plan_document(p) for p in plans], "plan solve",
                        candidates=candidates, feasible=len(result.candidates) or None,
                        capacity_bytes=plans[0].cluster.capacity_bytes)


def _label(plan) -> str:
    par = plan.parallel
    return configuration_label({"tp": par.tp, "cp": par.cp, "pp": par.pp, "dp": par.dp,
                                "micro_batch": par.micro_batch,
                                "num_microbatches": par.num_microbatches,
                                "schedule": par.schedule, "virtual_stages": par.virtual_stages})
