"""Every parallel degree reaches every table a plan is written to: `.to_frame()`, `--csv` and
plan.json (issue #33: the 128K plan 8·128·16·1 was written to CSV as 8,16,1, which describes 128
GPUs instead of 16,384, and Mixtral's ep 8 was missing from both)."""

import csv
import io
from dataclasses import fields, replace

from planner.core.parallel import Parallel
from planner.report.frames import plans_csv, plans_frame
from test_export import make_plan


def _plans():
    plan = make_plan()
    return [plan, replace(plan, parallel=replace(plan.parallel, cp=4, dp=plan.parallel.dp))]


def test_every_parallel_field_is_a_frame_and_csv_column():
    names = {f.name for f in fields(Parallel)}
    frame = plans_frame(_plans())
    assert names <= set(frame.columns), names - set(frame.columns)
    header = next(csv.reader(io.StringIO(plans_csv(_plans()))))
    assert names <= set(header), names - set(header)


def test_the_degrees_multiply_to_the_gpus_in_every_row():
    plans = _plans()
    frame = plans_frame(plans)
    assert list(frame.cp) == [1, 4]
    assert list(frame.tp * frame.cp * frame.pp * frame.dp) == [p.parallel.gpus for p in plans]
    assert list(frame.etp) == [p.parallel.expert_tp for p in plans]
    assert plans[1].to_dict()["parallel"]["cp"] == 4
