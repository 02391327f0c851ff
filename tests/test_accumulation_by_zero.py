"""Each microbatch's weight gradients are accumulated in the dtype the engine runs at the plan's
ZeRO stage: DeepSpeed 0.19.8 keeps an fp32 buffer only at ZeRO-1 (BF16_Optimizer) and accumulates
in bf16 at ZeRO 0, 2 and 3 (engine.py get_data_types: "if self._config.grad_accum_dtype is
None: grad_accum_dtype = model_dtype"), so the weight-gradient pass reads and writes 4 bytes a
parameter there and 2 elsewhere; the search shares layer tables across ZeRO stages only where
those bytes agree."""

from dataclasses import replace

import pytest

from planner.core.parallel import Parallel
from planner.cost import constants
from planner.cost.memory import sharded_params
from planner.hardware.profiles import load_hardware, make_cluster
from planner.model.presets import PRESETS
from planner.predict.layer_costs import model_layer_costs
from planner.search.costs import SearchCosts
from planner.search.request import Request
from planner.stack import load_stack

MODEL = PRESETS["llama3-8b"]
HW = load_hardware("a100-80gb")
PAR = Parallel(tp=1, pp=1, dp=8, micro_batch=1, num_microbatches=8, zero=1)


def _wgrad(stack, zero):
    block = model_layer_costs(MODEL, replace(PAR, zero=zero), HW, stack, "none")[1]
    return block.bwd_weight_s


def test_deepspeed_accumulates_in_fp32_at_zero1_only():
    stack = load_stack("deepspeed")
    assert [stack.accumulation_bytes(z) for z in range(4)] == [2, 4, 2, 2]
    # read and write 2 more bytes a parameter, at the rate cost/layer.py streams memory
    rate = HW.memory_bandwidth_gbps * 1e9 * (HW.memory_efficiency or constants.MEMORY_EFFICIENCY)
    extra = 2 * (4 - 2) * sharded_params(MODEL.layers[1], 1) / rate
    assert _wgrad(stack, 1) - _wgrad(stack, 0) == pytest.approx(extra, rel=1e-9)
    assert _wgrad(stack, 2) == _wgrad(stack, 0) == _wgrad(stack, 3)


def test_fp32_gradients_accumulate_in_fp32_at_every_stage():
    stack = load_stack("megatron-core")
    assert {stack.accumulation_bytes(z) for z in range(4)} == {4}
    assert _wgrad(stack, 0) == _wgrad(stack, 1)


def test_the_search_keeps_one_table_per_accumulation_dtype():
    req = Request(model=MODEL, cluster=make_cluster(HW, 8, 1), options=load_stack("deepspeed"))
    costs = SearchCosts(req)
    z0, z1, z2 = (costs.table(replace(PAR, zero=z), "none") for z in (0, 1, 2))
    assert z0 is z2 and z0 is not z1
