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
    lines = [f"{prefix}{s.evaluated} of {s.cases} cases evaluated" + _skip_text(s)]
    if s.held_out_mean_abs_time_error is not None:
        lines.append(f"step time, each source held out: mean |error| "
                     f"{s.held_out_mean_abs_time_error:.1%}, max {s.held_out_max_abs_time_error:.1%}")
    lines.append(f"step time{', in-sample' if s.held_out_mean_abs_time_error is not None else ''}"
                 f": mean |error| {s.mean_abs_time_error:.1%}, max {s.max_abs_time_error:.1%}"
                 f" ({s.worst_case})")
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


def groups_table(rows, width: int | None = None, held_out=None) -> Table:
    """One row per group of runs (one source's table or sweep): how many, the mean |error| with
    the group's source held out (``held_out``: those rows, planner/fidelity/holdout.py) and
    in-sample, the signed mean and the worst case; what ``plan validate`` prints before its
    summary."""
    held = {r.case: r for r in held_out or rows}
    by_group: dict[str, list] = {}
    for r in rows:
        if r.time_error is not None:
            by_group.setdefault(r.group, []).append(r)
    cells = []
    for group, found in by_group.items():
        errors = [r.time_error for r in found]
        out = [held[r.case].time_error for r in found]
        worst = max(found, key=lambda r: abs(r.time_error))
        cells.append((for_rich(group), str(len(found)),
                      f"{sum(abs(e) for e in out) / len(out):.1%}",
                      f"{sum(abs(e) for e in errors) / len(errors):.1%}",
                      f"{sum(errors) / len(errors):+.1%}", f"{worst.time_error:+.1%}",
                      for_rich(worst.case)))
    return fitted(Listing(
        "Predictions against published runs, by group",
        ("group", "cases", "held out", "in-sample", "signed", "worst", "worst case"),
        tuple(cells), right=("cases", "held out", "in-sample", "signed", "worst"),
        wrap=("worst case",), drop_order=("worst case",),
        caption="mean |err|, err: predicted / measured step time - 1 (below 0: the model is "
                "optimistic); held out: each source's runs priced without what was chosen from "
                "them (docs/validation.md); --cases: every case"),
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


def _mean_abs(errors) -> str:
    known = [abs(e) for e in errors if e is not None]
    return f"{sum(known) / len(known):.1%}" if known else "-"


_SETTING_HEADERS = ("source", "set by", "field", "value", "runs", "with", "without")


def _setting_cells(effects) -> list[tuple[str, ...]]:
    cells = []
    for e in effects:
        refused = sum(1 for x in e.without_errors if x is None)
        cells.append((e.setting.source, e.setting.set_by, e.setting.field,
                      _short(e.setting.value), str(len(e.cases)), _mean_abs(e.with_errors),
                      _mean_abs(e.without_errors) + (f" ({refused} refused)" if refused else "")))
    return cells


def settings_markdown(effects) -> str:
    """The settings table as GitHub markdown, for docs/validation.md."""
    lines = ["| " + " | ".join(_SETTING_HEADERS) + " |", "|" + "---|" * len(_SETTING_HEADERS)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |"
              for row in _setting_cells(effects)]
    return "\n".join(lines) + "\n"


def settings_table(effects, width: int | None = None) -> Table:
    """``plan validate --settings``: each stack setting only one source's runs set, and the mean
    |step-time error| of those runs with it and without it (the field at its stack's value)."""
    cells = [tuple(for_rich(c) for c in row) for row in _setting_cells(effects)]
    return fitted(Listing(
        "Settings only one source turns on: its runs' mean |err| with and without",
        _SETTING_HEADERS, tuple(cells),
        right=("runs", "with", "without"), wrap=("value",), drop_order=("value", "set by"),
        caption="without: the field at its bundled stack's value; docs/validation.md says what "
                "each is and where it comes from"), width)


def _short(value) -> str:
    text = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return text if len(text) <= 40 else text[:39] + "…"
