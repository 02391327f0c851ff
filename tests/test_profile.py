"""profile_model on tiny models: fast, shared measurements, JSON round trip, safe saving, scaling."""

import json
import sys

import pytest

from planner.core.errors import PlanInputError
from planner.model.spec import ModelSpec
from planner.profiling.profiler import CUPY_MISSING, profile_model
from planner.profiling.record import SCHEMA, load_profile, save_profile

TINY = ModelSpec(name="tiny", num_layers=3, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                 ffn_hidden_size=128, vocab_size=256, seq_length=32, mlp="swiglu", norm="rmsnorm",
                 bias=False)
FAST = dict(repeats=2, warmup=1, budget_s=2.0)


@pytest.fixture(scope="module")
def tiny_profile():
    calls = []
    prof = profile_model(TINY, progress=lambda d, t, label: calls.append((d, t, label)), **FAST)
    return prof, calls


def test_tiny_profile_runs_with_progress(tiny_profile):
    prof, calls = tiny_profile
    assert len(prof.layers) == len(TINY.layers)
    assert [layer.kind for layer in prof.layers] == [layer.kind for layer in TINY.layers]
    assert calls[0][0] == 0 and calls[-1][0] == calls[-1][1]
    assert prof.dtype == "float32" and prof.device == "cpu" and prof.seq_len == 32
    for t in prof.layers:
        assert t.fwd_s > 0 and t.scaled == 1.0
        assert t.fwd_min_s <= t.fwd_s <= t.fwd_max_s
    block = prof.layers[1]
    assert block.bwd_weight_s > 0 and 0 < block.attention_fwd_s < block.fwd_s
    assert "blas" in prof.environment and "numpy" in prof.environment


def test_identical_blocks_share_one_measurement(tiny_profile):
    prof, calls = tiny_profile
    blocks = prof.layers[1:-1]
    assert all(b is blocks[0] for b in blocks)
    assert sum(1 for c in calls if c[2].startswith("block")) == 1


def test_json_round_trip(tiny_profile, tmp_path):
    prof, _ = tiny_profile
    path = save_profile(prof, tmp_path / "p.json")
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA and len(data["timings"]) == 3
    back = load_profile(path)
    assert back == prof
    assert back.layers[1] is back.layers[2]


def test_save_refuses_overwrite_without_force(tiny_profile, tmp_path):
    prof, _ = tiny_profile
    path = tmp_path / "p.json"
    save_profile(prof, path)
    with pytest.raises(PlanInputError, match="exists; pass --force to overwrite"):
        save_profile(prof, path)
    save_profile(prof, path, force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]  # no temporary file left behind


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(schema="other"), "schema"),
    (lambda d: d.pop("tp"), "missing 'tp'"),
    (lambda d: d["timings"][0].update(fwd_s=-1), "non-negative"),
    (lambda d: d.update(layer_timing=[0, 7]), "not an index"),
])
def test_bad_files_raise_one_line(tiny_profile, tmp_path, mutate, message):
    data = tiny_profile[0].to_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanInputError, match=message) as e:
        load_profile(path)
    assert "\n" not in str(e.value)
    path.write_text("{not json")
    with pytest.raises(PlanInputError, match="not valid JSON"):
        load_profile(path)


def test_gpu_without_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    with pytest.raises(PlanInputError) as e:
        profile_model(TINY, device="gpu")
    assert str(e.value) == CUPY_MISSING


def test_bad_device_and_tp():
    with pytest.raises(PlanInputError, match="--device"):
        profile_model(TINY, device="tpu")
    with pytest.raises(PlanInputError, match="--tp 3"):
        profile_model(TINY, tp=3)


def test_attention_share_grows_with_seq_len():
    spec = ModelSpec(name="w", num_layers=1, hidden_size=64, num_attention_heads=2,
                     num_kv_heads=2, ffn_hidden_size=128, vocab_size=128, seq_length=32)
    share = []
    for s in (32, 2048):  # a wide contrast: timings of tiny kernels are noisy under load
        block = profile_model(spec, seq_len=s, **FAST).layers[1]
        share.append(block.attention_fwd_flops / block.fwd_flops)
        share[-1] = (share[-1], block.attention_fwd_s / block.fwd_s)
    assert share[1][0] > share[0][0]  # FLOPs
    assert share[1][1] > share[0][1]  # measured time


def test_tiny_budget_scales_and_marks_entries():
    spec = ModelSpec(name="m", num_layers=2, hidden_size=256, num_attention_heads=4,
                     num_kv_heads=2, ffn_hidden_size=512, vocab_size=32768, seq_length=1024)
    prof = profile_model(spec, repeats=2, warmup=0, budget_s=1e-4)
    block, head = prof.layers[1], prof.layers[-1]
    assert block.scaled > 1 and "attention" in block.measured_at and "s256" in block.measured_at
    assert "s1024 heads 1/1" in block.measured_at  # attention keeps the full sequence
    assert head.scaled > 1 and "vocab" in head.measured_at
    full = profile_model(spec, seq_len=256, repeats=1, warmup=0, budget_s=1e-4).layers[1]
    assert block.fwd_flops > full.fwd_flops  # FLOPs are those of the full shape
    assert block.fwd_s > 0 and block.attention_fwd_s > 0


def test_report_groups_repeated_blocks(tiny_profile):
    from rich.console import Console

    from planner.report.profile import profile_table

    console = Console(width=200, record=True)
    console.print(profile_table(tiny_profile[0]))
    text = console.export_text()
    assert "block ×3" in text and "embedding" in text and "head" in text


def test_flops_match_the_design_formula():
    """Block matmul FLOPs of DESIGN.md §3 (full-matrix attention), backward = 2x forward."""
    from planner.profiling.executors import layer_costs

    spec = ModelSpec(name="f", num_layers=1, hidden_size=512, num_attention_heads=8,
                     num_kv_heads=2, ffn_hidden_size=1408, vocab_size=1000, seq_length=256,
                     mlp="swiglu", norm="rmsnorm", bias=False)
    block = spec.layers[1]
    b, s, h, f, g, d = 2, 256, 512, 1408, 2, 64
    tokens = b * s
    design = (2 * tokens * h * (h + 2 * g * d) + 2 * tokens * h * h + 6 * tokens * h * f
              + 4 * tokens * s * h)
    costs = layer_costs(block, b, s)
    fwd = costs["dense"].fwd.flops + costs["attention"].fwd.flops
    assert fwd == pytest.approx(design, rel=0.03)  # elementwise ops add a little
    bwd = sum(costs[p].bwd_input.flops + costs[p].bwd_weight.flops for p in costs)
    assert bwd == pytest.approx(2 * fwd, rel=0.05)


def test_explicit_layers_with_a_linear_layer():
    from planner.model.spec import Layer

    layers = (Layer(kind="embedding", hidden_size=32, vocab_size=64),
              Layer(kind="block", hidden_size=32, num_attention_heads=2, num_kv_heads=2,
                    ffn_hidden_size=64),
              Layer(kind="linear", hidden_size=32, out_features=48, bias=True),
              Layer(kind="head", hidden_size=32, vocab_size=64))
    spec = ModelSpec(name="x", num_layers=1, hidden_size=32, num_attention_heads=2,
                     num_kv_heads=2, ffn_hidden_size=64, vocab_size=64, seq_length=16,
                     layers=layers)
    prof = profile_model(spec, tp=2, **FAST)
    linear = prof.layers[2]
    assert linear.kind == "linear" and linear.fwd_flops == 2 * 16 * 32 * 24 + 16 * 24
    assert linear.bwd_weight_s > 0


def test_rates_for_the_cost_model(tiny_profile):
    block = tiny_profile[0].layers[1]
    assert block.flops_per_s("fwd") == pytest.approx(block.fwd_flops / block.fwd_s)
    assert tiny_profile[0].layers[0].flops_per_s("bwd_input") == 0.0  # embedding: no input grad


def test_repeats_give_a_median_and_a_spread(tiny_profile):
    """Issue #19: `plan profile` showed no spread. Each pass is the median of its repeats, and
    the spread is (slowest - fastest) / median of the passes' total."""
    prof, _ = tiny_profile
    assert prof.environment["statistic"] == "median"
    for t in prof.layers:
        low = t.fwd_min_s + t.bwd_input_min_s + t.bwd_weight_min_s
        high = t.fwd_max_s + t.bwd_input_max_s + t.bwd_weight_max_s
        assert t.spread == pytest.approx((high - low) / t.total_s)
        assert t.spread >= 0
    assert prof.spread == max(t.spread for t in prof.layers)


def test_noise_is_flagged_from_the_spread_or_the_drift(tiny_profile):
    from dataclasses import replace

    from planner.profiling.record import NOISY_SPREAD

    prof, _ = tiny_profile
    quiet_timing = replace(prof.layers[0], fwd_min_s=prof.layers[0].fwd_s,
                           fwd_max_s=prof.layers[0].fwd_s, bwd_input_min_s=0.0,
                           bwd_input_max_s=0.0, bwd_weight_min_s=0.0, bwd_weight_max_s=0.0,
                           bwd_input_s=0.0, bwd_weight_s=0.0)
    env = dict(prof.environment, peak={"matmul_tflops": 1.0, "drift": 0.0})
    quiet = replace(prof, layers=(quiet_timing,), environment=env)
    assert quiet.spread == 0 and not quiet.noisy
    noisy = replace(quiet_timing, fwd_max_s=quiet_timing.fwd_s * (1 + 2 * NOISY_SPREAD))
    assert replace(quiet, layers=(noisy,)).noisy
    drifting = replace(quiet, environment=dict(env, peak={"matmul_tflops": 1.0, "drift": -0.5}))
    assert drifting.noisy
    from planner.report.profile import profile_notes
    assert any("noisy" in line for line in profile_notes(drifting))
    assert not any("noisy" in line for line in profile_notes(quiet))


def test_cpu_profile_mfu_is_against_the_measured_peak(tiny_profile):
    """Issue #19: a plan from a CPU profile reported MFU 0.0% (CPU times against an A100 peak).
    MFU now uses the profiled device's measured peak: model FLOPs / (step x GPUs x that peak)."""
    from planner.hardware.profiles import load_hardware, make_cluster
    from planner.search.request import Request
    from planner.search.solver import search

    prof, _ = tiny_profile
    assert prof.peak_flops and prof.peak_flops > 1e9  # any CPU does a GFLOP/s
    cluster = make_cluster(load_hardware("a100-80gb"), 1, 1)
    plan = search(Request(model=TINY, cluster=cluster, global_batch=4, profile=prof,
                          top=1)).plans[0]
    m = plan.metrics
    model_flops = m.tflops_per_gpu * 1e12 * m.step_time_s * cluster.gpus
    assert m.mfu == pytest.approx(model_flops / (m.step_time_s * cluster.gpus * prof.peak_flops))
    assert prof.peak_flops < cluster.hardware.peak_flops  # so against the A100 it read lower
