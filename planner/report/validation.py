"""`plan validate`'s output: the published runs against the predictions, as a rich table or as
markdown (docs/validation.md's table), both rendered from the validation DataFrame
(planner/report/frames.py), so the table, the markdown and the Python API show the same values."""

from __future__ import annotations

from rich.table import Table

from planner.core.text import for_rich

from planner.fidelity.published import ValidationSummary
from planner.report.frames import validation_frame
from planner.report.listing import Listing, fitted


def _missing(x) -> bool:
    return x is None or x != x  # None in a row, NaN in the frame


def _pct(x: float | None) -> str:
    return "-" if _missing(x) else f"{x:+.1%}"


def _num(x: float | None, fmt: str) -> str:
    return "-" if _missing(x) else format(x, fmt)


def _cells(r) -> list[str]:
    """One row of the frame (``itertuples``), formatted: what the table and the markdown show."""
    return [r.case, r.configuration, r.stack, _num(r.measured_step_s, ".2f"),
            _num(r.predicted_step_s, ".2f"), _pct(r.time_error),
            f"{_num(r.measured_tflops, '.0f')} / {_num(r.predicted_tflops, '.0f')}"
            + (" (HFU)" if r.tflops_definition == "hardware" else " (MFU)"),
            f"{_num(r.measured_memory_gib, '.0f')} / {_num(r.predicted_memory_gib, '.1f')}",
            _pct(r.memory_error), r.note]


_HEADERS = ["case", "configuration", "stack", "measured s", "predicted s", "time err",
            "TFLOP/s meas / pred", "mem GiB meas / pred", "mem err", "note"]


def summary_lines(s: ValidationSummary) -> list[str]:
    """The summary as text lines: overall, then each dataset's (indented) when there are several."""
    lines = _summary_lines(s, "all cases: " if s.groups else "")
    for label, g in s.groups:
        lines += ["  " + line for line in _summary_lines(g, f"{label}: ")]
    return lines


def _skip_text(s: ValidationSummary) -> str:
    if not s.skipped:
        return ""
    counts: dict[str, int] = {}
    for reason in s.skip_reasons or ("no equivalent schedule",) * len(s.skipped):
        key = reason.split(":")[0] if ":" in reason else reason
        counts[key] = counts.get(key, 0) + 1
    return f" ({len(s.skipped)} skipped: " + ", ".join(f"{n} {k}" for k, n in counts.items()) + ")"


def _summary_lines(s: ValidationSummary, prefix: str) -> list[str]:
    lines = [f"{prefix}{s.evaluated} of {s.cases} cases evaluated" + _skip_text(s),
             f"step time: mean |error| {s.mean_abs_time_error:.1%}, max {s.max_abs_time_error:.1%}"
             f" ({s.worst_case})"]
    if s.memory_cases:
        lines.append(f"memory ({s.memory_cases} cases): error {s.min_memory_error:+.1%} .. "
                     f"{s.max_memory_error:+.1%}")
    for sweep, rho in s.spearman:
        lines.append(f"Spearman speed ranking, {sweep}: {rho:.2f}")
    lines.append("predicted OOM on runs that ran: "
                 + (", ".join(s.oom_mismatches) if s.oom_mismatches else "none"))
    return lines


def _frame_rows(rows):
    """The rows as the frame's records (``case`` back as a field), in order."""
    return validation_frame(rows).reset_index().itertuples(index=False)


def cases_table(rows, width: int | None = None) -> Table:
    """Every case, one row each (``plan validate --cases``): the case name whole, the columns
    after it dropped at a narrow width, the step-time error last of all."""
    cells = tuple(tuple(for_rich(c) for c in _cells(r)) for r in _frame_rows(rows))
    return fitted(Listing(
        "Predictions against published runs", tuple(_HEADERS), cells,
        right=("measured s", "predicted s", "time err", "TFLOP/s meas / pred",
               "mem GiB meas / pred", "mem err"),
        drop_order=("note", "stack", "TFLOP/s meas / pred", "configuration", "mem GiB meas / pred",
                    "measured s", "predicted s", "mem err"),
        caption="--markdown: every column; planner.validate().to_frame(): the numbers"), width)


def groups_table(rows, width: int | None = None) -> Table:
    """One row per group of runs (one source's table or sweep): how many, the mean and signed
    step-time error, and the worst case; what ``plan validate`` prints before its summary."""
    by_group: dict[str, list] = {}
    for r in rows:
        if r.time_error is not None:
            by_group.setdefault(r.group, []).append(r)
    cells = []
    for group, found in by_group.items():
        errors = [r.time_error for r in found]
        worst = max(found, key=lambda r: abs(r.time_error))
        cells.append((for_rich(group), str(len(found)),
                      f"{sum(abs(e) for e in errors) / len(errors):.1%}",
                      f"{sum(errors) / len(errors):+.1%}", f"{worst.time_error:+.1%}",
                      for_rich(worst.case)))
    return fitted(Listing(
        "Predictions against published runs, by group",
        ("group", "cases", "mean |err|", "signed", "worst", "worst case"), tuple(cells),
        right=("cases", "mean |err|", "signed", "worst"), wrap=("worst case",),
        drop_order=("worst case",),
        caption="err: predicted / measured step time - 1 (below 0: the model is optimistic); "
                "--cases: every case"),
        width)


def validation_markdown(rows, summary: ValidationSummary) -> str:
    """The same table as GitHub markdown, summary first, for docs/validation.md."""
    out = [("  - " + line.strip()) if line.startswith("  ") else ("- " + line)
           for line in summary_lines(summary)] + [""]
    out.append("| " + " | ".join(_HEADERS) + " |")
    out.append("|" + "|".join("---" for _ in _HEADERS) + "|")
    for r in _frame_rows(rows):
        out.append("| " + " | ".join(c.replace("|", "/") for c in _cells(r)) + " |")
    return "\n".join(out) + "\n"
