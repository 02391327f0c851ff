"""The software stack: bundled profiles, strict loading, overrides, and the gradient bytes each
stack keeps (DeepSpeed's optimizer choice by ZeRO stage, engine.py _do_optimizer_sanity_check)."""

import json
import math

import pytest

from planner.core.errors import PlanInputError
from planner.stack import (DEFAULT_STACK, LAUNCHER_STACKS, OPTION_FIELDS, bundled_stacks,
                           default_stack, load_stack, with_overrides)
from planner.stack.profiles import STACKS_DIR

REQUIRED = {"megatron-core", "megatron-2021", "deepspeed", "torchtitan"}


def _bundled_json(name: str) -> dict:
    return json.loads((STACKS_DIR / f"{name}.json").read_text())


def _write(tmp_path, data) -> str:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_bundled_stacks_have_a_source_for_every_option():
    stacks = bundled_stacks()
    assert REQUIRED <= set(stacks)
    assert next(iter(stacks)) == DEFAULT_STACK == default_stack().name
    for name, stack in stacks.items():
        assert stack.name == name
        assert {k for k, _ in stack.sources} == set(OPTION_FIELDS), name


def test_each_launcher_has_its_own_bundled_stack():
    for launcher, name in LAUNCHER_STACKS.items():
        stack = load_stack(None, launcher)
        assert stack.name == name and stack.launcher == launcher
    assert load_stack(None, None).name == DEFAULT_STACK


def test_the_stacks_differ_where_their_frameworks_do():
    s = bundled_stacks()
    assert s["megatron-core"].flash_attention and not s["megatron-2021"].flash_attention
    assert s["megatron-core"].overlap_grad_reduce and not s["megatron-2021"].overlap_grad_reduce
    assert s["deepspeed"].schedules == ("1f1b",) and s["deepspeed"].p2p_blocking
    # DeepSpeed partitions a stage output over the TP ranks too (PipelineEngine is_pipe_partitioned)
    assert s["deepspeed"].p2p_scatter_gather and not s["torchtitan"].p2p_scatter_gather
    assert s["torchtitan"].fp32_shards and not s["torchtitan"].fused_cross_entropy
    assert "zb-h1" not in s["megatron-core"].schedules


def test_deepspeed_keeps_16_bit_gradients_except_under_bf16_optimizer():
    """DeepSpeed 0.19.8, bf16: ZeRO-1 with fp32 accumulation runs BF16_Optimizer (fp32 buffer
    beside the bf16 grads: 6 B); ZeRO-0 (FP16_Optimizer in bf16; an fp32 accumulation dtype
    raises there) and ZeRO-2/3 keep 16-bit gradients (2 B); fp16 is 16-bit always."""
    ds = bundled_stacks()["deepspeed"]
    assert ds.version == "0.19.8"
    assert [ds.held_grad_bytes(z) for z in range(4)] == [2, 6, 2, 2]
    assert ds.reduced_grad_bytes(1) == 4 and ds.reduced_grad_bytes(2) == 2
    fp16 = with_overrides(ds, param_dtype="fp16")
    assert [fp16.held_grad_bytes(z) for z in range(4)] == [2, 2, 2, 2]
    assert default_stack().held_grad_bytes(1) == 4


def test_unknown_stack_name_lists_the_bundled_ones():
    with pytest.raises(PlanInputError) as e:
        load_stack("megatron")
    assert "unknown stack 'megatron'" in str(e.value)
    for name in REQUIRED:
        assert name in str(e.value)


def test_a_user_file_loads_like_a_bundled_one(tmp_path):
    data = _bundled_json("deepspeed")
    data["name"] = "my-deepspeed"
    del data["sources"]  # user files need no sources
    stack = load_stack(_write(tmp_path, data))
    assert stack.name == "my-deepspeed" and stack.schedules == ("1f1b",)


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.update(overlap_grad_reduc=True), ["unknown key 'overlap_grad_reduc'",
                                                   "did you mean 'overlap_grad_reduce'"]),
    (lambda d: d.pop("grad_dtype"), ["missing 'grad_dtype'"]),
    (lambda d: d.update(pipeline_action_overhead_s=math.inf), ["'pipeline_action_overhead_s'"]),
    (lambda d: d.update(pipeline_action_overhead_s=-1), ["'pipeline_action_overhead_s'",
                                                         "[0.0, 0.1]"]),
    (lambda d: d.update(optimizer_state_bytes=float("nan")), ["'optimizer_state_bytes'"]),
    (lambda d: d.update(zero3_prefetch=1.5), ["'zero3_prefetch'", "whole number"]),
    (lambda d: d.update(overlap_param_gather="yes"), ["'overlap_param_gather'", "true or false"]),
    (lambda d: d.update(attention="fast"), ["'attention'", "flash, unfused"]),
    (lambda d: d.update(schedules=["1f1b", "pipedream"]), ["'schedules'"]),
    (lambda d: d.update(schedules=[]), ["'schedules'"]),
    (lambda d: d.update(fp32_grad_accumulation_zero=[4]), ["'fp32_grad_accumulation_zero'"]),
    (lambda d: d["sources"].update(atention="x"), ["unknown key 'atention'",
                                                   "did you mean 'attention'"]),
])
def test_a_bad_stack_file_is_one_line_naming_the_field(tmp_path, edit, words):
    data = _bundled_json("megatron-core")
    edit(data)
    with pytest.raises(PlanInputError) as e:
        load_stack(_write(tmp_path, data))
    text = str(e.value)
    assert "\n" not in text
    for word in words:
        assert word in text, text


def test_non_finite_json_numbers_are_refused(tmp_path):
    path = tmp_path / "s.json"
    text = json.dumps(_bundled_json("megatron-core")).replace(
        '"optimizer_state_bytes": 12', '"optimizer_state_bytes": Infinity')
    path.write_text(text)
    with pytest.raises(PlanInputError, match="optimizer_state_bytes"):
        load_stack(str(path))


def test_overrides_are_checked_and_recorded():
    base = default_stack()
    same = with_overrides(base, attention="flash")
    assert same == base and same.overrides == ()
    off = with_overrides(base, attention="unfused", overlap_grad_reduce=False)
    assert not off.flash_attention and not off.overlap_grad_reduce
    assert dict(off.overrides) == {"attention": "unfused", "overlap_grad_reduce": "off"}
    assert "attention=unfused" in off.label()
    assert off.to_dict()["values"]["attention"] == "unfused"
    with pytest.raises(PlanInputError, match="did you mean 'grad_dtype'"):
        with_overrides(base, grad_dtyp="bf16")
    with pytest.raises(PlanInputError, match="'grad_dtype'"):
        with_overrides(base, grad_dtype="fp8")


# --- what each option does to the prediction -----------------------------------------------------

def _predict(stack, zero=1, pp=2, **par):
    from planner.core.parallel import Parallel
    from planner.hardware.profiles import load_hardware, make_cluster
    from planner.model.presets import PRESETS
    from planner.predict.step import predict_plan
    model = PRESETS["llama3-8b"]
    cluster = make_cluster(load_hardware("a100-80gb"), 16, 2)
    p = Parallel(tp=1, pp=pp, dp=16 // pp, micro_batch=1, num_microbatches=8, zero=zero, **par)
    return predict_plan(model, cluster, p, stack)


def test_deepspeed_zero2_prices_16_bit_gradients_and_zero1_its_fp32_buffer():
    ds = load_stack("deepspeed")
    _, z1 = _predict(ds, zero=1)
    _, z2 = _predict(ds, zero=2)
    _, mc = _predict(default_stack(), zero=1)
    # ZeRO-1: bf16 grads (2) + fp32 accumulation (4) per parameter, unsharded: 1.5x Megatron's 4
    assert z1.memory_parts["gradients"] == pytest.approx(1.5 * mc.memory_parts["gradients"])
    # ZeRO-2: 2 bytes per parameter, sharded over dp = 8
    assert z2.memory_parts["gradients"] == pytest.approx(mc.memory_parts["gradients"] / 2 / 8)


def test_zero2_reducing_once_per_step_keeps_whole_gradients():
    ds = load_stack("deepspeed")
    once = with_overrides(ds, zero2_reduce_scatter="step")
    _, shard = _predict(ds, zero=2)
    _, whole = _predict(once, zero=2)
    assert whole.memory_parts["gradients"] == pytest.approx(8 * shard.memory_parts["gradients"])
    assert whole.step_s < shard.step_s  # one reduce-scatter per step instead of one per microbatch


def test_zero3_gathering_a_stage_holds_more_than_a_layer_at_a_time():
    titan = load_stack("torchtitan")
    _, layer = _predict(titan, zero=3, pp=1)
    _, more = _predict(with_overrides(titan, zero3_prefetch=3), zero=3, pp=1)
    _, stage = _predict(with_overrides(titan, zero3_gather="stage"), zero=3, pp=1)
    assert layer.memory_parts["transient"][0] < more.memory_parts["transient"][0] \
        < stage.memory_parts["transient"][0]


def test_per_action_overhead_is_charged_per_action_not_baked_into_stage_times():
    slow = with_overrides(default_stack(), pipeline_action_overhead_s=0.01)
    fast_plan, fast = _predict(default_stack())
    slow_plan, slow_pred = _predict(slow)
    for a, b in zip(fast_plan.stages, slow_plan.stages):  # plan.json keeps compute times
        assert b.fwd_s == pytest.approx(a.fwd_s) and b.bwd_s == pytest.approx(a.bwd_s)
    # 8 microbatches on 2 ranks in 1F1B: 2 x (8 + 2 - 1) = 18 actions on the critical path
    assert slow_pred.step_s - fast.step_s == pytest.approx(18 * 0.01, rel=1e-6)
    from planner.predict.step import predict_plan
    sim_fast = predict_plan(*_args(), default_stack(), simulated=True)[1]
    sim_slow = predict_plan(*_args(), slow, simulated=True)[1]
    assert sim_slow.step_s - sim_fast.step_s == pytest.approx(18 * 0.01, rel=1e-6)


def test_split_backward_overhead_slows_zero_bubble_only():
    split = with_overrides(load_stack("torchtitan"), pipeline_action_overhead_s=0.0,
                           split_backward_overhead=0.5)
    free = with_overrides(split, split_backward_overhead=0.0)
    for schedule, slower in (("1f1b", False), ("zb-h1", True)):
        _, a = _predict(free, schedule=schedule)
        _, b = _predict(split, schedule=schedule)
        assert (b.step_s > a.step_s * 1.1) if slower else b.step_s == pytest.approx(a.step_s)


def _args():
    from planner.core.parallel import Parallel
    from planner.hardware.profiles import load_hardware, make_cluster
    from planner.model.presets import PRESETS
    return (PRESETS["llama3-8b"], make_cluster(load_hardware("a100-80gb"), 16, 2),
            Parallel(tp=1, pp=2, dp=8, micro_batch=1, num_microbatches=8, zero=1))


def test_eager_elementwise_kernels_cost_time_only_where_megatron_fuses():
    from planner.cost.layer import layer_cost
    from planner.cost.memory import Shape
    from planner.hardware.profiles import load_hardware
    from planner.model.presets import PRESETS
    hw = load_hardware("a100-80gb")
    T = 2048
    shape = Shape(tp=1, sp=False, micro_batch=1, seq_len=T)
    fused, eager = default_stack(), with_overrides(default_stack(), fused_elementwise=False)
    llama = PRESETS["llama3-8b"].layers[1]  # RMSNorm, RoPE, SwiGLU, GQA; no bias, no dropout
    assert llama.rope and llama.norm == "rmsnorm"
    gap = layer_cost(llama, shape, "none", hw, eager).fwd_s - \
        layer_cost(llama, shape, "none", hw, fused).fwd_s
    from planner.cost import constants
    h, q, kv, f = 4096, 4096, 1024, 14336
    rate = hw.memory_bandwidth_gbps * 1e9 * (hw.memory_efficiency or constants.MEMORY_EFFICIENCY)
    floor = constants.EAGER_KERNEL_MIN_S * rate  # a kernel costs at least its launch

    def kernels(*nbytes):
        return sum(max(b, floor) for b in nbytes)
    extra = (2 * (kernels(*(b * T * h for b in (6, 8, 4, 8, 6, 4))) - 4 * T * h)  # fp32 RMSNorm
             + sum(kernels(*(b * T * w for b in (6, 8, 6))) - 4 * T * w for w in (q, kv))  # RoPE
             + kernels(4 * T * f, 6 * T * f) - 6 * T * f  # SwiGLU in two kernels
             + 2 * kernels(2 * T * (kv + q)))  # repeat_kv copies K and V to every query head
    assert 6 * T * kv < floor  # the RoPE cast of K at 2,048 tokens is shorter than a launch
    assert gap == pytest.approx(extra / rate, rel=1e-6)
    # GPT-3 (learned positions, LayerNorm: one native kernel in eager too, GeLU with bias, dropout)
    gpt = PRESETS["gpt3-175b"].layers[1]
    assert not gpt.rope and gpt.norm == "layernorm"
    gpt_gap = layer_cost(gpt, shape, "none", hw, eager).fwd_s - \
        layer_cost(gpt, shape, "none", hw, fused).fwd_s
    h, f = gpt.hidden_size, gpt.ffn_hidden_size
    gpt_extra = 2 * 2 * T * f + 2 * 4 * 2 * T * h  # bias before GeLU; two unfused bias-dropout-adds
    assert gpt_gap == pytest.approx(gpt_extra / rate, rel=1e-6)


def test_split_overlap_flags_expose_what_is_not_overlapped():
    base = default_stack()
    _, both = _predict(base, zero=1)
    _, no_reduce = _predict(with_overrides(base, overlap_grad_reduce=False), zero=1)
    _, neither = _predict(with_overrides(base, overlap_grad_reduce=False,
                                         overlap_param_gather=False), zero=1)
    assert both.step_s < no_reduce.step_s < neither.step_s


def test_a_stack_file_on_a_base_gives_only_what_differs(tmp_path):
    """A user's stack names a bundled stack as base and changes one field: every other field and
    its source come from the base, so the file survives fields added in later releases."""
    from planner.stack import load_stack

    path = tmp_path / "my-stack.json"
    path.write_text(json.dumps({"base": "megatron-core", "name": "my-megatron", "version": "mine",
                                "description": "our fork", "overlap_grad_reduce": False,
                                "sources": {"overlap_grad_reduce": "our launcher omits it"}}))
    mine, base = load_stack(str(path)), load_stack("megatron-core")
    assert mine.name == "my-megatron" and mine.overlap_grad_reduce is False
    assert mine.schedules == base.schedules and mine.grad_dtype == base.grad_dtype
    assert dict(mine.sources)["overlap_grad_reduce"] == "our launcher omits it"
    assert dict(mine.sources)["grad_dtype"] == dict(base.sources)["grad_dtype"]


@pytest.mark.parametrize("doc, match", [
    ({"base": "megatron-3000", "name": "x", "version": "1", "description": "d"},
     r"'base' must name a bundled stack"),
    ({"base": "megatron-core", "version": "1", "description": "d"}, r"missing 'name'"),
    ({"base": "megatron-core", "name": "x", "version": "1", "description": "d",
      "overlap_grad_reduce": "yes"}, r"overlap_grad_reduce"),
])
def test_a_bad_base_file_is_one_line(tmp_path, doc, match):
    from planner.core.errors import PlanInputError
    from planner.stack import load_stack

    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanInputError, match=match):
        load_stack(str(path))
