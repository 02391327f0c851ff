"""The validation set's record on a stack and GPU: how far the published runs priced on them came
out, by source family, so that a plan can say how much its numbers have been worth.

A prediction is only as good as the runs it has been checked against, and that differs by stack
and GPU: the 2021 Megatron runs on A100 read within 9%, the FSDP runs on H100 up to 27%
optimistic. `plan solve` prints the families whose runs were priced on the plan's stack and GPU
profile, each with its number of runs and the range of their step-time errors (predicted /
measured - 1), and says so plainly where the set has none. The record is stored
(profiles/validation/record.json, written by ``python tools/validation_record.py --write``) so a
solve does not re-run the validation; tests/test_validate.py re-derives it from the current model
and fails when it is stale.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from planner.core.jsonfile import read_json_file
from planner.core.units import VALIDATION_DIR

RECORD_FILE = VALIDATION_DIR / "record.json"


@dataclass(frozen=True)
class Family:
    """One source family's runs (a case's ``group``) priced on one stack and GPU profile: the
    signed step-time errors in-sample and with the family's source held out
    (planner/fidelity/holdout.py), and the memory errors where the runs published memory."""

    group: str
    stack: str  # Stack.name
    hardware: str  # the GPU profile name
    runs: int
    min_error: float  # signed step-time errors, fractions
    max_error: float
    mean_abs_error: float
    kind: str = "dense"  # "moe" where the model routes experts
    min_gpus: int = 0
    max_gpus: int = 0
    held_out_min_error: float = 0.0
    held_out_max_error: float = 0.0
    held_out_mean_abs_error: float = 0.0
    memory_runs: int = 0
    min_memory_error: float | None = None  # the worst under-estimate (most negative)


def families(rows, held_out_rows=None) -> tuple[Family, ...]:
    """The evaluated validation rows grouped by (family, stack, GPU profile), errors rounded to
    0.1% (the precision `plan validate` prints), in first-seen order; ``held_out_rows`` (the
    same rows with each source held out, default ``rows``) give the held-out errors."""
    held = {r.case: r for r in (held_out_rows or rows)}
    found: dict[tuple[str, str, str], list] = {}
    for r in rows:
        if r.supported:
            found.setdefault((r.group, r.stack_name, r.hardware), []).append(r)
    out = []
    for (g, s, h), rs in found.items():
        e = [r.time_error for r in rs]
        he = [held[r.case].time_error for r in rs]
        mem = [r.memory_error for r in rs if r.memory_error is not None]
        out.append(Family(
            group=g, stack=s, hardware=h, runs=len(e), min_error=round(min(e), 3),
            max_error=round(max(e), 3), mean_abs_error=round(_mean_abs(e), 3),
            kind="moe" if any(r.moe for r in rs) else "dense",
            min_gpus=min(r.gpus for r in rs), max_gpus=max(r.gpus for r in rs),
            held_out_min_error=round(min(he), 3), held_out_max_error=round(max(he), 3),
            held_out_mean_abs_error=round(_mean_abs(he), 3), memory_runs=len(mem),
            min_memory_error=round(min(mem), 3) if mem else None))
    return tuple(out)


def _mean_abs(errors) -> float:
    return sum(map(abs, errors)) / len(errors)


def record_text(fams: tuple[Family, ...]) -> str:
    """The stored record's JSON text."""
    return json.dumps({"families": [asdict(f) for f in fams]}, indent=1) + "\n"


def load_record(path: str | Path = RECORD_FILE) -> tuple[Family, ...]:
    """The stored record."""
    doc = read_json_file(path, "validation record")
    return tuple(Family(**f) for f in doc["families"])


def _summary(fams: list[Family]) -> tuple[int, float, float, float]:
    """(runs, lowest error, highest error, mean |error|) of some families together."""
    runs = sum(f.runs for f in fams)
    mean = sum(f.mean_abs_error * f.runs for f in fams) / runs
    return runs, min(f.min_error for f in fams), max(f.max_error for f in fams), mean


def record_line(fams: tuple[Family, ...], stack: str, hardware: str) -> str:
    """One line: how the runs priced on ``stack`` with ``hardware`` came out; where there are
    none, the stack with the most runs on that GPU profile as the nearest evidence."""
    mine = [f for f in fams if f.stack == stack and f.hardware == hardware]
    if mine:
        runs, low, high, mean = _summary(mine)
        sources = f"{len(mine)} sources" if len(mine) > 1 else "1 source"
        return (f"{runs} published run{'s' if runs > 1 else ''} ({sources}) priced on {stack} "
                f"with {hardware} came out {low:+.1%}..{high:+.1%}, mean |error| {mean:.1%} "
                "(`plan validate`)")
    others: dict[str, list[Family]] = {}
    for f in fams:
        if f.hardware == hardware:
            others.setdefault(f.stack, []).append(f)
    nearest = ""
    if others:
        name = max(others, key=lambda k: _summary(others[k])[0])
        runs, low, high, mean = _summary(others[name])
        nearest = f" (nearest: {runs} runs on {name} with {hardware}, {low:+.1%}..{high:+.1%})"
    return (f"no published run in the validation set was priced on {stack} with {hardware}"
            f"{nearest}; `plan validate --runs FILE` checks your own")
