"""Gradient accumulation over whole pipeline runs (fidelity/moe_cases.py local_batch_passes): NeMo
Automodel runs one pipeline schedule per local batch, GA of them a step, so its DeepSeek-V3 run on
1,024 GPUs (LBS 8, GA 4) fills and drains its pipeline four times a step where one run of 32
microbatches would do it once; the DP sync and the optimizer step still run once."""

from dataclasses import replace

import pytest

from planner.core.errors import PlanInputError
from planner.fidelity.cases import MOE_FILE, case_setup, load_cases
from planner.fidelity.moe_cases import local_batch_passes
from planner.fidelity.published import _predicted
from planner.predict.step import predict_plan

CASES = {c["name"]: c for c in load_cases(MOE_FILE)}
DSV3_1024 = CASES["moe-automodel-deepseek-v3-h100-1024gpu-pp4-ep64"]
DSV3_256 = CASES["moe-automodel-deepseek-v3-h100-256gpu-pp4-ep64"]


def test_the_table_s_local_batch_and_ga():
    """performance-summary.md: 1,024 GPUs, GBS 8192, LBS 8, GA 4, FSDP 256; 256 GPUs, GBS 512,
    LBS 8, GA 1, FSDP 64: samples per DP rank in one run, and runs a step."""
    assert local_batch_passes(DSV3_1024["config"], 8192, 256) == (8, 4)
    assert local_batch_passes(DSV3_256["config"], 512, 64) == (8, 1)
    assert local_batch_passes({}, 512, 64) == (8, 1)  # unstated: one run of the whole share
    for bad in (3, 0, -8):
        with pytest.raises(PlanInputError, match="local_batch"):
            local_batch_passes({"local_batch": bad}, 512, 64)


def _full(setup):
    """The case as validate prices it (its unpublished recompute falls to full: none does not
    fit, tests/test_validate.py)."""
    return replace(setup, parallel=replace(setup.parallel, recompute="full"))


def test_each_run_repeats_the_pipeline_not_the_step():
    setup = _full(case_setup(DSV3_1024))
    assert (setup.parallel.num_microbatches, setup.pipeline_passes) == (8, 4)
    plan, pred = predict_plan(setup.model, setup.cluster, setup.parallel, setup.options,
                              simulated=True)
    step, mfu, _, _, _ = _predicted(setup, True)
    assert 0 < pred.pipeline_s < pred.step_s
    assert step == pytest.approx(pred.step_s + 3 * pred.pipeline_s, rel=1e-12)
    # four runs of 8 do the FLOPs of one run of 32 (the same global batch), in more time
    one_run = replace(setup, pipeline_passes=1,
                      parallel=replace(setup.parallel, num_microbatches=32))
    step32, mfu32, _, _, _ = _predicted(one_run, True)
    assert mfu * step == pytest.approx(mfu32 * step32, rel=1e-9)
    assert step > step32


def test_one_run_a_step_is_the_plain_prediction():
    setup = _full(case_setup(DSV3_256))
    assert setup.pipeline_passes == 1
    plan, _ = predict_plan(setup.model, setup.cluster, setup.parallel, setup.options,
                           simulated=True)
    assert _predicted(setup, True)[0] == pytest.approx(plan.metrics.step_time_s, rel=1e-12)
