"""The expert load of dropless routing (Stack.moe_expert_load, cost/moe.py): what it slows and
what it does not hold, and the load the Megatron Qwen3-235B validation rows state, derived from
the same source's forced-balance against dropless measurements (not from the rows themselves)."""

import pytest

from planner.core.parallel import Parallel
from planner.cost import moe
from planner.cost.memory import Shape, activation_bytes
from planner.fidelity.cases import MOE_FILE, case_setup, load_cases
from planner.predict.step import evaluate
from planner.stack import with_overrides

CASES = {c["name"]: c for c in load_cases(MOE_FILE)}
MEGATRON = [c for c in CASES.values() if c["group"] == "moe_megatron_qwen3_h100"]

# Megatron MoE Model Zoo, best_practice/Qwen3/readme.md (commit c1ad0b5c), 'Long Context':
# Qwen3-235B-A22B on 32 nodes of H100, TP 4, EP 8, PP 8, VPP 4, GBS 256, DeepEP, TFLOPS
# "forced balance" / "dropless": (sequence, CP, forced, dropless).
LONG_CONTEXT = ((16384, 1, 295, 237), (32768, 2, 335, 277), (65536, 4, 368, 320),
                (131072, 8, 389, 357))


def _solve_load(setup, seq, cp, ratio, recompute, modules) -> float:
    """The expert load at which plan3d's step grows by ``ratio`` over balanced routing."""
    model = setup.model.with_seq_length(seq)
    dp = 256 // (4 * 8 * cp)
    par = Parallel(tp=4, pp=8, dp=dp, cp=cp, micro_batch=1, num_microbatches=256 // dp,
                   schedule="interleaved", virtual_stages=4, recompute=recompute, zero=1,
                   sequence_parallel=True, ep=8)

    def step(load):
        opts = with_overrides(setup.options, "test", moe_expert_load=load,
                              recompute_modules=list(modules))
        return evaluate(model, setup.cluster, par, opts, simulated=True).metrics.step_time_s

    balanced, low, high = step(1.0), 1.0, 3.0
    for _ in range(25):
        mid = (low + high) / 2
        low, high = (mid, high) if step(mid) / balanced < ratio else (low, mid)
    return low


def test_the_megatron_rows_load_is_the_long_context_tables():
    """Each forced/dropless pair gives the load at which the model's step grows by the measured
    ratio; the Megatron rows (same model, routing and cluster) state their mean. The runs'
    '--recompute-modules layernorm moe' recomputes the whole MoE layer, which plan3d prices as
    neither: solved with the selective modules it has and with full recompute, which bracket
    it. The eight solutions agree within a few hundredths: one load explains all four pairs."""
    setup = case_setup(next(c for c in MEGATRON if "tp4-ep8" in c["name"]))
    loads = [_solve_load(setup, seq, cp, forced / dropless, mode, modules)
             for seq, cp, forced, dropless in LONG_CONTEXT
             for mode, modules in (("selective", ("layernorm", "moe_act")),
                                   ("full", ("core_attn",)))]
    assert max(loads) - min(loads) < 0.08
    mean = sum(loads) / len(loads)
    for case in MEGATRON:
        assert case["config"]["expert_load"] == pytest.approx(mean, abs=0.01)


def test_the_automodel_rows_route_balanced():
    """NeMo Automodel's benchmark configs set fake_balanced_gate: their load is the mean."""
    for case in CASES.values():
        if case["group"] == "moe_automodel_h100":
            assert case_setup(case).options.moe_expert_load == 1.0


def test_the_load_slows_each_layer_but_not_what_a_stage_keeps():
    """A layer waits for its busiest GPU, so the load scales its expert GEMMs and all-to-all;
    what a GPU keeps over many layers is the mean (each layer's busiest GPU is another)."""
    setup = case_setup(next(c for c in MEGATRON if "tp4-ep8" in c["name"]))
    block = setup.model.layers[1]
    even = Shape(tp=4, sp=True, micro_batch=1, seq_len=4096, ep=8, etp=1, ep_in_domain=8)
    skew = Shape(tp=4, sp=True, micro_batch=1, seq_len=4096, ep=8, etp=1, ep_in_domain=8,
                 expert_load=1.5)
    assert moe.routed_copies(block, skew) == 1.5 * moe.routed_copies(block, even)
    assert moe.mean_routed_copies(block, skew) == moe.mean_routed_copies(block, even)
    assert moe.dispatch_s(block, skew, setup.cluster.hardware) > moe.dispatch_s(
        block, even, setup.cluster.hardware)
    for mode in ("none", "selective", "full"):
        assert activation_bytes(block, skew, mode, True) == activation_bytes(block, even, mode,
                                                                             True)
