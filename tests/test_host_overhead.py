"""Synchronous kernel launches (planner/cost/host.py, Stack.host_s_per_block), and BLOOM's value
of it checked against the published step times of its own topology sweep.

BLOOM's script sets CUDA_LAUNCH_BLOCKING=1 (bigscience train/tr11-176B-ml/tr11-176B-ml.slurm),
so the host's time for every kernel adds to the GPU's. The BLOOM cases carry that host time per
block and pass (host_s_per_block, from their bigscience-tr11 component). It was chosen after
looking at the validation results, by least squares over the twelve rows of the same 2022-02-28 sweep that are NOT in the
validation set (ROWS below); the five sweep rows in profiles/validation/published_runs.json and
the production run are held out. This file recomputes that fit, so the value cannot drift from
its measurements.
"""

from __future__ import annotations

import copy

import pytest

from planner.core.errors import PlanInputError
from planner.cost import host
from planner.cost.layer import layer_cost
from planner.cost.memory import Shape
from planner.fidelity.cases import case_setup, load_cases
from planner.fidelity.published import validate_case
from planner.hardware.profiles import load_hardware
from planner.stack import load_stack, with_overrides

# bigscience-workshop/bigscience train/tr11-176B-ml/chronicles-prequel.md (commit 053adafe),
# "Rebalancing layers" (BF16 optimizer, --pp-partition-method 'type:transformer|embedding',
# 48 nodes, GBS 2048, seq 2048, all dated 02-28): (NHIDDEN, NLAYERS, DP, TP, PP, MBS, NHEADS,
# Sec/it). The NHIDDEN=14336 NLAYERS=70 rows of the same section are the validation cases.
ROWS = (
    (12288, 106, 8, 4, 12, 2, 64, 116.54), (12288, 106, 8, 4, 12, 2, 96, 118.79),
    (12288, 106, 8, 4, 12, 2, 128, 121.42), (12288, 106, 8, 4, 12, 4, 96, 120.34),
    (12288, 100, 8, 8, 6, 2, 64, 139.72), (12288, 100, 8, 8, 6, 4, 64, 120.96),
    (13312, 82, 4, 8, 12, 4, 64, 111.79), (13312, 82, 8, 4, 12, 2, 64, 104.45),
    (13312, 82, 8, 4, 12, 2, 104, 123.71), (13312, 82, 8, 4, 12, 2, 128, 108.78),
    (13312, 82, 8, 4, 12, 4, 64, 104.82), (13312, 94, 8, 4, 12, 2, 128, 124.10),
)
TEMPLATE = "bloom-sweep-2022-02-28-176B-dp4-tp8-pp12-mbs2-heads64"


@pytest.fixture(scope="module")
def cases():
    return {c["name"]: c for c in load_cases()}


def _case(template: dict, row, host_s: float) -> dict:
    hidden, layers, dp, tp, pp, mb, heads, seconds = row
    case = copy.deepcopy(template)
    case["name"] = f"chronicles-{hidden}-{layers}-dp{dp}-tp{tp}-pp{pp}-mbs{mb}-heads{heads}"
    case["model"].update(layers=layers, heads=heads, hidden=hidden, ffn_hidden=4 * hidden)
    case["config"].update(tp=tp, pp=pp, dp=dp, micro_batch=mb)
    case["measured"] = {"step_time_s": seconds}
    case["stack_overrides"] = dict(case.get("stack_overrides", {}), host_s_per_block=host_s)
    return case


def _predicted(template, row, host_s) -> float:
    return validate_case(_case(template, row, host_s)).predicted_step_s


def test_block_host_time_by_pass():
    assert host.block_host_s(0.004, True) == (0.004, 0.008, 0.004)
    assert host.block_host_s(0.004, False) == (0.004, 0.008, 0.0)
    assert host.block_host_s(0.0, True) == (0.0, 0.0, 0.0)


def test_layer_cost_adds_host_time_to_blocks_only(cases):
    setup = case_setup(cases[TEMPLATE])
    hw, model = setup.cluster.hardware, setup.model
    shape = Shape(tp=8, sp=False, micro_batch=2, seq_len=2048)
    plain = with_overrides(setup.options, "test", host_s_per_block=0.0)
    blocking = with_overrides(setup.options, "test", host_s_per_block=0.005)
    for layer in (model.layers[0], model.layers[1], model.layers[-1]):  # embedding, block, head
        a = layer_cost(layer, shape, "full", hw, plain)
        b = layer_cost(layer, shape, "full", hw, blocking)
        extra = (0.005, 0.010, 0.005) if layer.kind == "block" else (0.0, 0.0, 0.0)
        assert b.fwd_s - a.fwd_s == pytest.approx(extra[0])
        assert b.bwd_input_s - a.bwd_input_s == pytest.approx(extra[1])
        assert b.recompute_s - a.recompute_s == pytest.approx(extra[2])
        assert b.bwd_weight_s == a.bwd_weight_s and b.hardware_flops == a.hardware_flops


def test_bundled_stacks_launch_asynchronously():
    for name in ("deepspeed", "megatron-2021", "megatron-core", "torchtitan"):
        assert load_stack(name).host_s_per_block == 0.0


@pytest.mark.parametrize("bad", [-0.001, 0.5, float("nan")])
def test_host_time_out_of_range_is_refused(bad):
    with pytest.raises(PlanInputError, match="host_s_per_block"):
        with_overrides(load_stack("deepspeed"), "test", host_s_per_block=bad)


def test_host_time_grows_with_microbatches_times_blocks(cases):
    """The mechanism: the host time a step adds is microbatches x blocks per stage x passes, not
    FLOPs. The TP8/DP4 run has twice the TP4/DP8 run's microbatches (256 vs 128) on the same
    six-slot stages, so the same host time per block adds about twice the seconds."""
    tp8, tp4 = cases[TEMPLATE], cases["bloom-sweep-2022-02-28-176B-dp8-tp4-pp12-mbs2-heads64"]
    row8, row4 = (14336, 70, 4, 8, 12, 2, 64, 121.63), (14336, 70, 8, 4, 12, 2, 64, 102.03)
    add8 = _predicted(tp8, row8, 0.004) - _predicted(tp8, row8, 0.0)
    add4 = _predicted(tp4, row4, 0.004) - _predicted(tp4, row4, 0.0)
    assert add8 / add4 == pytest.approx((256 + 11) / (128 + 11), rel=0.05)
    # (256 + 11) x 6 blocks-or-slots x 4 passes x 4 ms: about 26 s on the slowest stage
    assert add8 == pytest.approx(267 * 6 * 4 * 0.004, rel=0.1)


def test_bloom_host_time_is_the_fit_of_the_other_sweep_rows(cases):
    """The BLOOM cases' host_s_per_block (their bigscience-tr11 component's) is the least-squares
    fit (on relative error) of the twelve out-of-set rows; every row but one is then predicted within 4% of its measurement,
    across TP 4 and 8, PP 6 and 12, micro-batch 2 and 4, hidden 12288 and 13312. The exception,
    13312 hidden with 104 heads (head dimension 128; 123.71 s where the 64- and 128-head runs
    read 104.45 and 108.78), stays about 13% under: the chronicles do not say why."""
    template = cases[TEMPLATE]
    used = {case_setup(c).options.host_s_per_block for c in cases.values()
            if c["group"].startswith("bloom")}
    assert len(used) == 1
    value = used.pop()
    probe = 0.004
    num = den = 0.0
    for row in ROWS:
        measured = row[-1]
        base = _predicted(template, row, 0.0)
        slope = (_predicted(template, row, probe) - base) / probe  # predictions are affine in it
        num += slope / measured * (1 - base / measured)
        den += (slope / measured) ** 2
    fitted = num / den
    assert value == pytest.approx(fitted, rel=0.02), fitted
    for row in ROWS:
        error = _predicted(template, row, value) / row[-1] - 1
        limit = 0.14 if row[6] == 104 else 0.04
        assert abs(error) <= limit, (row, error)


def test_bloom_without_host_time_reads_the_old_errors(cases):
    """Without the host time the model reads the sweep 15-16% fast for TP4 and TP8 at
    micro-batch 4 alike, and 25-28% fast for TP8 at micro-batch 2: slowing the TP8 all-reduce
    instead would move TP8's micro-batch-4 run as much as its micro-batch-2 run, which the
    measurements rule out (the all-reduce's bytes per token do not depend on the micro-batch)."""
    template = cases[TEMPLATE]
    err = {row: _predicted(template, row, 0.0) / row[-1] - 1 for row in ROWS
           if row[3] == 8 or row[:2] == (13312, 82)}
    tp8_mb4 = err[(13312, 82, 4, 8, 12, 4, 64, 111.79)]
    tp4_mb2 = err[(13312, 82, 8, 4, 12, 2, 64, 104.45)]
    tp8_mb2 = err[(12288, 100, 8, 8, 6, 2, 64, 139.72)]
    assert abs(tp8_mb4 - tp4_mb2) < 0.01
    assert tp8_mb2 < tp4_mb2 - 0.10
    assert load_hardware("a100-80gb").nvlink_domain == 8
