"""FP8 primary weights (the stack's ``fp8_params``; cost/precision.py fp8_primary_weights):
Transformer Engine's fp8_model_init under NeMo (fp8_params: true) or Megatron-LM
(--fp8-param-gather) keeps the blocks' linear weights only as FP8 tensors, so the 16-bit copy
is not held and the distributed optimizer all-gathers them in FP8. Checked against NeMo's
GPT-3 175B recipe, which runs no recompute on 80 GB H100s."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from planner.cost import precision
from planner.cost.memory import ACT_BYTES
from planner.fidelity.cases import MODERN_FILE, case_setup, load_cases
from planner.fidelity.published import validate_case
from planner.stack import load_stack, with_overrides

GPT3 = "nemo2407-gpt3-175b-h100-512gpu-tp4-pp8-cp1-vp6-fp8"


def _fp8(**changes):
    return with_overrides(load_stack("megatron-core"), "t", precision="fp8", **changes)


def _gpt3_case(**overrides):
    case = copy.deepcopy(next(c for c in load_cases(MODERN_FILE) if c["name"] == GPT3))
    case["stack_overrides"] = {**case.get("stack_overrides", {}), **overrides}
    return case


def test_no_bundled_stack_keeps_fp8_primary_weights_by_default():
    # Megatron-LM's --fp8-param-gather and NeMo's fp8_params are opt-in
    for name in ("megatron-core", "torchtitan", "deepspeed", "megatron-2021"):
        assert not load_stack(name).fp8_params
        assert "fp8_params" in dict(load_stack(name).sources)


def test_fp8_primary_weights_replace_the_16bit_copy():
    """Cached FP8 weights add their copy and its transpose (2 bytes a block weight) to the 16-bit
    weight; as primary weights they are the weight: nothing beside them is held."""
    cache = 2.0 * precision.FP8_BYTES * 1e9  # a billion block weights, both layouts
    assert precision.held_fp8_bytes(cache, 1, _fp8()) == cache
    assert precision.held_fp8_bytes(cache, 1, _fp8(fp8_params=True)) == 0.0
    # not read under BF16, nor at ZeRO-3 (whose FP8 gather is fp8_all_gather)
    bf16 = with_overrides(load_stack("megatron-core"), "t", fp8_params=True)
    assert precision.held_fp8_bytes(cache, 1, bf16) == cache
    assert precision.held_fp8_bytes(cache, 3, _fp8(fp8_params=True)) == cache


@settings(max_examples=50, deadline=None)
@given(params=st.floats(1.0, 1e10), share=st.floats(0.0, 1.0))
def test_the_weight_gather_moves_one_byte_for_each_fp8_weight(params, share):
    """Megatron-LM: '--fp8-param-gather' 'Keep the compute param in fp8 (do not use any other
    intermediate dtype) and perform the param all-gather in fp8.' A rank whose ``share`` of
    parameters are block weights gathers 2 - share bytes a parameter, 2 without FP8 weights."""
    cache = 2.0 * precision.FP8_BYTES * share * params
    on = precision.gathered_bytes_per_param(np.array([params]), np.array([cache]), 1,
                                            _fp8(fp8_params=True))
    off = precision.gathered_bytes_per_param(np.array([params]), np.array([cache]), 1, _fp8())
    assert on[0] == pytest.approx(ACT_BYTES - share * (ACT_BYTES - precision.FP8_BYTES))
    assert off[0] == ACT_BYTES
    assert precision.FP8_BYTES <= on[0] <= ACT_BYTES


def test_nemo_gpt3_recipe_fits_without_recompute_only_with_its_memory_knobs():
    """NeMo-Framework-Launcher launcher_scripts/conf/training/gpt3/175b_mlperf.yaml (commit
    0937882d, the 24.07 table's 512-GPU GPT-3 175B row) runs 'activations_checkpoint_granularity:
    null' with 'fp8_params: true' and 'grad_sync_dtype: bf16' on 80 GB H100s. Priced with both
    it fits; with 16-bit weights beside their FP8 copies and fp32 gradients it would not (the
    planner then guessed a block of recompute, +17.7%)."""
    hbm = case_setup(_gpt3_case()).cluster.hardware.memory_bytes
    recipe = validate_case(_gpt3_case())
    assert not recipe.predicted_oom and recipe.configuration.endswith(" none ZeRO-1")
    assert "FP8 primary weights" in recipe.note
    without = case_setup(_gpt3_case(fp8_params=False, grad_dtype="fp32"))
    from planner.fidelity.published import _predicted
    assert _predicted(without, True)[3] > hbm
    assert _predicted(case_setup(_gpt3_case()), True)[3] < 0.8 * hbm
    # the saving is the 16-bit copy of every block weight on the rank: 2 bytes each
    fp8_only = case_setup(_gpt3_case(grad_dtype="fp32"))
    cached = case_setup(_gpt3_case(fp8_params=False, grad_dtype="fp32"))
    model, par = fp8_only.model, fp8_only.parallel
    h, f, layers = model.hidden_size, model.layers[1].ffn_hidden_size, model.num_layers
    block_weights = layers / par.pp * (4 * h * h + 2 * h * f) / par.tp
    saved = _predicted(cached, True)[3] - _predicted(fp8_only, True)[3]
    # the peak rank also holds the embedding or head (16-bit, unchanged); fragmentation scales
    # the held bytes a little (cost/fragmentation.py)
    assert saved == pytest.approx(ACT_BYTES * block_weights, rel=0.1)


def test_megatron_export_passes_fp8_param_gather_with_fp8_primary_weights():
    from dataclasses import replace

    from planner.api import explain
    from planner.launchers import megatron
    plan = explain(8, 1, model="llama3-8b", gpu="h100", global_batch=64, tp=2, pp=2,
                   micro_batch=1, zero=1, recompute="none", stack="megatron-core",
                   schedule="1f1b", precision="fp8").plan
    assert "--fp8-param-gather" not in dict(megatron.args(plan))
    primary = replace(plan, stack=with_overrides(plan.stack, fp8_params=True))
    assert "--fp8-param-gather" in dict(megatron.args(primary))
    parsed = megatron.parse_megatron_args(megatron.render(primary)[megatron.FILENAME])
    assert parsed["fp8_param_gather"]
