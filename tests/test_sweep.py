"""`plan sweep` / planner.sweep: the spec and its one-line refusals, one solve per point, the
economics by hand, identical rows whatever the backend or worker count, outputs that never
overwrite, plots checked by what they contain, and a sweep killed midway that resumes losing and
repeating nothing. Cheap points only (llama3-8b, pp 1, micro-batch 1: ~0.05 s a solve)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from planner import api
from planner.core.errors import PlanInputError
from planner.sweeping.rows import economics
from planner.sweeping.spec import SweepSpec
from conftest import engine_module

ROOT = Path(__file__).resolve().parent.parent
CHEAP = {"model": "llama3-8b", "gpu": ["h100", "a100"], "gpus": [8, 16], "pp": 1,
         "micro_batch": 1}
runner = CliRunner()


def _rows(result):
    return [dict(r) for r in result.rows]


# --- the spec ------------------------------------------------------------------------------------


def test_lists_and_ranges_expand_in_a_fixed_order():
    spec = SweepSpec.from_dict({"tp": [1, 2], "gpus": {"from": 8, "to": 64, "times": 2},
                                "seq_len": {"from": 2048, "to": 8192, "step": 2048},
                                "model": "llama3-8b"})
    assert spec.values("gpus") == (8, 16, 32, 64)
    assert spec.values("seq_len") == (2048, 4096, 6144, 8192)
    assert [k for k, _ in spec.axes] == ["model", "gpus", "seq_len", "tp"]  # AXES order
    assert spec.size == 1 * 4 * 4 * 2 and spec.varied == ("gpus", "seq_len", "tp")


def test_yaml_json_toml_and_inline_give_one_spec(tmp_path):
    from planner.sweeping import load_spec

    (tmp_path / "s.yaml").write_text("model: llama3-8b\ngpus: [8, 16]\ntrain_tokens: 15e12\n")
    (tmp_path / "s.json").write_text('{"model": "llama3-8b", "gpus": [8, 16], '
                                     '"train_tokens": 15e12}')
    (tmp_path / "s.toml").write_text('model = "llama3-8b"\ngpus = [8, 16]\n'
                                     'train_tokens = 15e12\n')
    specs = [load_spec(tmp_path / f"s.{x}") for x in ("yaml", "json", "toml")]
    specs.append(load_spec("{model: llama3-8b, gpus: [8, 16], train_tokens: 15.0e+12}"))
    assert all(s == specs[0] for s in specs) and specs[0].train_tokens == 15e12


@pytest.mark.parametrize("spec, message", [
    ({"modle": "llama3-8b", "gpus": 8}, "unknown key 'modle'; did you mean 'model'?"),
    ({"gpus": 8, "gpus_per_nod": 4}, "did you mean 'gpus_per_node'?"),
    ({"gpus": {"from": 64, "to": 8, "times": 2}}, "gpus: the range from 64 to 8 is empty"),
    ({"gpus": []}, "gpus: the list is empty"),
    ({"gpus": {"from": 8, "to": 64, "time": 2}}, "did you mean 'times'?"),
    ({"gpus": "eight"}, "gpus takes an integer, got 'eight'"),
    ({"gpus": {"from": 1, "to": 200}, "tp": [1, 2, 4, 8]}, "800 points (200 gpus x 4 tp) is over "
                                                          "the limit of 100"),
    ({"model": ["llama3-8b", "llama9"], "gpus": 8},
     "spec: point 1 (model=llama9 gpus=8): unknown model 'llama9'"),
    ({"gpus": 8, "gpu": "b300"}, "spec: point 0 (gpu=b300 gpus=8): unknown GPU 'b300'"),
    ({"gpus": 12, "gpu": "h100"}, "gpus 12 is not a whole number of 8-GPU nodes"),
    ({"gpus": 8, "schedule": "zigzag"}, "--schedule must be one of"),
    ({"gpus": 8, "gpu_hour_price": 2}, "gpu_hour_price needs train_tokens"),
    ({"gpus": 8, "gpu": ["h100", "a100"], "train_tokens": 1e12, "gpu_hour_price": {"h100": 2}},
     "gpu_hour_price has no price for a100-80gb"),
])
def test_a_bad_spec_is_one_line_from_the_api_and_exit_2_from_the_cli(spec, message, tmp_path):
    with pytest.raises(PlanInputError) as e:
        api.sweep(spec, max_points=100, backend="serial")
    assert message in str(e.value) and "\n" not in str(e.value)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    done = runner.invoke(app, ["sweep", str(path), "--max-points", "100", "--no-cache"])
    assert done.exit_code == 2, done.output
    assert message in " ".join(done.output.split()) and "Traceback" not in done.output
    assert len(done.output.strip().splitlines()) == 1


def test_max_points_raises_the_limit():
    spec = {"gpus": {"from": 1, "to": 200}, "tp": [1, 2, 4, 8]}
    assert SweepSpec.from_dict(spec, max_points=800).size == 800


# --- every point one solve -----------------------------------------------------------------------


def test_a_row_is_the_best_plan_of_the_same_solve():
    result = api.sweep({**CHEAP, "gpu": "h100", "gpus": 16, "precision": ["bf16", "fp8"]},
                       backend="serial")
    for row, precision in zip(result.rows, ("bf16", "fp8")):
        best = api.solve(16, 2, "llama3-8b", gpu="h100", pp=1, micro_batch=1,
                         precision=precision).best
        assert (row["tp"], row["pp"], row["dp"], row["micro_batch"], row["num_microbatches"],
                row["schedule"], row["recompute"]) == (
            best.parallel.tp, best.parallel.pp, best.parallel.dp, best.parallel.micro_batch,
            best.parallel.num_microbatches, best.parallel.schedule, best.parallel.recompute)
        assert row["step_time_s"] == pytest.approx(best.metrics.step_time_s, rel=1e-5)
        assert row["precision"] == precision and row["status"] == "ok"


def test_no_plan_and_bad_combinations_are_rows_with_the_solves_reason():
    result = api.sweep({**CHEAP, "gpus": 8, "model": ["llama3-8b", "llama3-70b"],
                        "precision": ["bf16", "fp8"]}, backend="serial")
    by = {(r["gpu"], r["model"], r["precision"]): r for r in result.rows}
    fp8_a100 = by[("a100-80gb", "llama3-8b", "fp8")]
    assert fp8_a100["status"] == "input" and "has no FP8 tensor cores" in fp8_a100["reason"]
    big = by[("h100-sxm-80gb", "llama3-70b", "bf16")]  # 70B on 8 GPUs with pp 1: nothing fits
    assert big["status"] == "infeasible" and "rejected:" in big["reason"]
    assert big["tp"] is None and by[("h100-sxm-80gb", "llama3-8b", "bf16")]["status"] == "ok"


def test_economics_by_hand():
    # 3.6e6 tokens at 1,000 tokens/s = 3,600 s = 1 h; on 8 GPUs 8 GPU-hours; at $2.5: $20
    assert economics(1000.0, 8, 3.6e6, 2.5) == {"time_to_train_s": 3600.0, "gpu_hours": 8.0,
                                                "cost": 20.0}
    assert economics(1000.0, 8, 3.6e6, None) == {"time_to_train_s": 3600.0, "gpu_hours": 8.0}
    result = api.sweep({**CHEAP, "gpus": 16, "train_tokens": 15e12,
                        "gpu_hour_price": {"h100": 2.5, "a100-80gb": 1.25}}, backend="serial")
    for r, price in zip(result.rows, (2.5, 1.25)):
        assert r["time_to_train_s"] == 15e12 / r["tokens_per_s"]
        assert r["gpu_hours"] == pytest.approx(15e12 / r["tokens_per_s"] / 3600 * 16)
        assert r["cost"] == pytest.approx(r["gpu_hours"] * price)


def test_gpus_per_node_and_a_batch_in_tokens():
    result = api.sweep({"model": "llama3-8b", "gpus": 16, "gpus_per_node": [4, 8], "pp": 1,
                        "micro_batch": 1, "global_batch_tokens": 2**21}, backend="serial")
    assert [(r["nodes"], r["global_batch"], r["batch_tokens"]) for r in result.rows] == [
        (4, 256, 2**21), (2, 256, 2**21)]
    with pytest.raises(PlanInputError, match="not a positive multiple of the sequence length"):
        api.sweep({"gpus": 8, "global_batch_tokens": 1000}, backend="serial")


# --- backends, determinism, the frame ------------------------------------------------------------


def test_pool_rows_equal_the_serial_loop_whatever_the_workers():
    spec = {**CHEAP, "tp": [1, 2]}
    serial = api.sweep(spec, backend="serial")
    pooled = api.sweep(spec, backend="local", workers=2)
    assert _rows(pooled) == _rows(serial) and len(serial.rows) == 8
    assert [r["point"] for r in serial.rows] == list(range(8))
    frame = pooled.to_frame()
    assert str(frame["tp"].dtype) == "Int64" and frame["mfu"].dtype.kind == "f"


def test_outputs_are_written_once_and_refused_after(tmp_path):
    out = tmp_path / "rows.csv"
    result = api.sweep({**CHEAP, "gpus": 8}, backend="serial", out=out)
    import pandas as pd

    back = pd.read_csv(out)
    assert list(back["gpu"]) == ["h100-sxm-80gb", "a100-80gb"]
    assert list(back.columns) == list(result.columns)
    with pytest.raises(PlanInputError, match="exists; pass --force to overwrite"):
        api.sweep({**CHEAP, "gpus": 8}, backend="serial", out=out)
    api.sweep({**CHEAP, "gpus": 8}, backend="serial", out=out, force=True)
    with pytest.raises(PlanInputError, match="give a .csv or .parquet file"):
        api.sweep({**CHEAP, "gpus": 8}, out=tmp_path / "rows.xlsx")
    done = runner.invoke(app, ["sweep", "{gpus: 8, pp: 1}", "--out", str(out), "--no-cache"])
    assert done.exit_code == 2 and "exists; pass --force" in done.output


def test_the_command_prints_a_table_and_a_summary(tmp_path):
    done = runner.invoke(app, ["sweep", "{model: llama3-8b, gpus: [8, 16], pp: 1, micro_batch: 1, "
                                        "tp: 1, gpu: h100, precision: [bf16, fp8]}",
                               "--cache", str(tmp_path / "c"), "--backend", "serial"],
                         env={"COLUMNS": "120"})
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert "tp·pp·dp" in lines[0] and "precision" in lines[0]
    # 8 GPUs in bf16 fit the H100's 79.65 GiB, not with the default 2.9% headroom kept free
    assert "4 points: 1 with a plan, 3 without; 4 solved, 0 from the cache" in done.output
    assert any(line.startswith("points 0, 1, 3: nothing fits:") for line in lines)


# --- plots ---------------------------------------------------------------------------------------


def test_rows_carry_each_plan_s_step_time_band():
    rows = api.sweep({**CHEAP, "gpus": [8]}, backend="serial").rows
    assert any(r["status"] == "ok" for r in rows)
    for r in (r for r in rows if r["status"] == "ok"):
        assert r["step_time_low_s"] <= r["step_time_high_s"]
        assert isinstance(r["band_calibrated"], bool)


def test_plots_hold_the_expected_series(tmp_path):
    engine_module("matplotlib", "the plot extra (plan3d[plot])")
    spec = {**CHEAP, "gpus": [8, 16, 32], "train_tokens": 1e12, "gpu_hour_price": 2}
    api.sweep(spec, backend="serial", plot=tmp_path / "p.svg")
    ids = {e.get("id") for e in ET.parse(tmp_path / "p.svg").iter() if e.get("id")}
    for gpu in ("h100-sxm-80gb", "a100-80gb"):
        assert {f"tokens_per_s:{gpu}", f"mfu:{gpu}", f"cost:{gpu}"} <= ids
        # each curve shaded by its plans' error bands (planner/fidelity/band.py)
        assert {f"band:tokens_per_s:{gpu}", f"band:mfu:{gpu}", f"band:cost:{gpu}"} <= ids
    assert {"pareto:front", "pareto:points"} <= ids
    api.sweep({**CHEAP, "gpus": [8, 16]}, backend="serial", plot=tmp_path / "p.html")
    page = (tmp_path / "p.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 1
    assert "<script" not in page and 'src="' not in page and 'href="http' not in page
    assert 'id="step_time_s:a100-80gb"' in page and "pareto:front" in page  # no price: step time
    assert 'class="dataframe rows"' in page and "<td>None</td>" not in page


# --- resume --------------------------------------------------------------------------------------

KILLED = textwrap.dedent("""
    import sys, time
    from planner.api import solve
    from planner.sweeping import run_sweep

    def slow_solve(*args, **kwargs):
        time.sleep(0.3)
        return solve(*args, **kwargs)

    run_sweep({spec!r}, slow_solve, backend="serial", cache=sys.argv[1])
""")


def test_a_killed_sweep_resumes_losing_and_repeating_nothing(tmp_path):
    spec = {**CHEAP, "gpus": [8, 16, 32], "tp": [1, 2]}  # 12 points
    cache = tmp_path / "cache"
    child = subprocess.Popen([sys.executable, "-c", KILLED.format(spec=spec), str(cache)],
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while len(list(cache.glob("*.json"))) < 3 and time.monotonic() < deadline:
        assert child.poll() is None, "the sweep ended before it was killed"
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    finished = sorted(cache.glob("*.json"))
    assert 3 <= len(finished) < 12
    for path in finished:  # whole files only: each written beside and renamed into place
        assert json.loads(path.read_text())["outcome"]["status"] in ("ok", "infeasible", "input")

    calls = []

    def counting_solve(*args, **kwargs):
        calls.append(kwargs)
        return api.solve(*args, **kwargs)

    from planner.sweeping import run_sweep

    resumed = run_sweep(spec, counting_solve, backend="serial", cache=cache)
    assert (resumed.cached, resumed.computed) == (len(finished), 12 - len(finished))
    assert len(calls) == 12 - len(finished)  # no finished point solved again
    assert len(list(cache.glob("*.json"))) == 12
    assert _rows(resumed) == _rows(api.sweep(spec, backend="serial"))  # nothing lost
    again = run_sweep(spec, counting_solve, backend="serial", cache=cache)
    assert (again.cached, again.computed, len(calls)) == (12, 0, 12 - len(finished))


def test_a_changed_model_file_is_a_new_point(tmp_path):
    from planner.sweeping.digest import point_digest

    model = tmp_path / "m.json"
    model.write_text('{"name": "a"}')
    first = point_digest({"model": str(model), "gpus": 8})
    model.write_text('{"name": "bb"}')
    assert point_digest({"model": str(model), "gpus": 8}) != first


def test_the_ray_backend_without_ray_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(PlanInputError, match=r"--backend ray needs Ray: pip install 'plan3d\[sweep\]'"):
        api.sweep({**CHEAP, "gpus": 8}, backend="ray")
    with pytest.raises(PlanInputError, match="--backend must be one of local, ray, serial"):
        api.sweep({**CHEAP, "gpus": 8}, backend="dask")
