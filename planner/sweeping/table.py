"""The table `plan sweep` prints: one line per point, the inputs that vary beside the best plan's
degrees, speed and memory (and time and cost to train where the spec prices them), or why nothing
fits. Rendering only: the numbers are the frame's."""

from __future__ import annotations

from rich import box
from rich.table import Table

from planner.core.text import for_rich
from planner.sweeping.evaluate import INFEASIBLE, OK
from planner.sweeping.points import input_column
from planner.sweeping.spec import AXES, SweepSpec

GIB = 2**30
SECONDS_PER_DAY = 86400.0
# spec keys shown through another input column
SHOWN_AS = {"gpus_per_node": "nodes", "global_batch_tokens": "global_batch"}


def _missing(v) -> bool:
    import pandas as pd

    return v is None or bool(pd.isna(v))


def input_keys(spec: SweepSpec) -> list[str]:
    """The input columns the table shows: gpus, and every input the spec varies (spec order)."""
    keys = []
    for key in AXES:
        column = input_column(SHOWN_AS.get(key, key))
        if (key == "gpus" or key in spec.varied) and column not in keys:
            keys.append(column)
    return keys


def _degrees(r, dims) -> str:
    return "·".join(str(r[k]) for k in dims)


def _schedule(r) -> str:
    return r["schedule"] + (f" v{r['virtual_stages']}" if r["virtual_stages"] > 1 else "")


def _reason(r) -> str:
    reason = str(r["reason"])
    if r["status"] == INFEASIBLE and "rejected: " in reason:
        return "nothing fits: " + reason.split("rejected: ", 1)[1].split(". ", 1)[0]
    return reason


def _money(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"${x / scale:,.1f}{unit}"
    return f"${x:,.0f}"


def _rate(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k"


def _used(frame, name: str) -> bool:
    return bool((frame[name].fillna(1) > 1).any())


def sweep_table(frame, spec: SweepSpec) -> Table:
    """The rows as a table; a point without a plan shows its number under ``why``, and the
    reasons follow the table (``reasons``), once for all the points that share one."""
    keys = input_keys(spec)
    dims = ["tp", *(["cp"] if _used(frame, "cp") else []), "pp", "dp",
            *(["ep"] if _used(frame, "ep") else [])]
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1, 0, 0))
    table.add_column("#", justify="right", no_wrap=True)
    for key in keys:
        numeric = frame[key].dtype.kind in "iuf"
        table.add_column(key, justify="right" if numeric else "left", no_wrap=True)
    plan_columns = ["·".join(dims), "mb×M", "schedule", "step s", "MFU", "GiB", "tok/s"]
    money = (["days"] if "time_to_train_s" in frame else []) + (["cost"] if "cost" in frame
                                                               else [])
    for name in plan_columns + money:
        table.add_column(name, justify="left" if name in ("schedule", "mb×M") else "right",
                         no_wrap=True)
    for r in frame.to_dict("records"):
        cells = [str(r["point"])] + [for_rich("" if _missing(r[k]) else str(r[k]))
                                     for k in keys]
        if r["status"] == OK:
            cells += [_degrees(r, dims), f"{r['micro_batch']}×{r['num_microbatches']}",
                      _schedule(r), f"{r['step_time_s']:.3f}", f"{r['mfu']:.1%}",
                      f"{r['peak_memory_bytes'] / GIB:.1f}", _rate(r["tokens_per_s"])]
            if "days" in money:
                cells.append(f"{r['time_to_train_s'] / SECONDS_PER_DAY:,.1f}")
            if "cost" in money:
                cells.append(_money(r["cost"]))
        else:
            cells += ["no plan"] + [""] * (len(plan_columns) + len(money) - 1)
        table.add_row(*cells)
    return table


def reasons(frame) -> list[str]:
    """One line per distinct reason a point has no plan, naming its points, in point order."""
    by_reason: dict[str, list[int]] = {}
    for r in frame.to_dict("records"):
        if r["status"] != OK:
            by_reason.setdefault(_reason(r), []).append(int(r["point"]))
    lines = []
    for reason, points in by_reason.items():
        label = "point" if len(points) == 1 else "points"
        lines.append(f"{label} {', '.join(map(str, points))}: {reason}")
    return lines
