"""The stack's loss dtype and gradient-reduce dtype (planner/stack/spec.py loss_dtype,
grad_reduce_dtype): what a bf16 loss keeps and writes, what an FSDP2 run over bf16-resident
parameters holds and reduces, and the NeMo Automodel Qwen3-30B run (8 H100s, ep 8) that ran and
must not be predicted out of memory."""

import pytest

from planner.core.parallel import Parallel
from planner.core.units import GIB
from planner.cost.layer import layer_cost
from planner.cost.memory import Shape, activation_bytes
from planner.fidelity.cases import MOE_FILE, case_setup, load_cases
from planner.hardware.profiles import load_hardware
from planner.model.load import load_model
from planner.predict.memory import state_parts
from planner.predict.step import predict_plan
from planner.stack import load_stack, with_overrides

H100 = load_hardware("h100")
TITAN = load_stack("torchtitan")
BF16_LOSS = with_overrides(TITAN, "test", loss_dtype="bf16")


def _head():
    return load_model("llama3-8b").layers[-1]


def test_bundled_stacks_run_the_loss_in_fp32_and_reduce_as_held():
    """Every bundled stack's loss is fp32 (Megatron's output.float(), torchtitan's fp32 logits)
    and reduces gradients in the dtype it holds them: the fields change no bundled prediction."""
    for name in ("megatron-core", "megatron-2021", "deepspeed", "torchtitan"):
        stack = load_stack(name)
        assert stack.loss_dtype == "fp32" and stack.loss_bytes == 4
        assert stack.grad_reduce_dtype is None
        for zero in range(4):
            held = stack.held_grad_bytes(zero)
            assert stack.reduced_grad_bytes(zero) == (4 if stack.fp32_accumulation(zero)
                                                      else held)


def test_a_bf16_loss_keeps_and_writes_half_the_bytes_per_logit():
    """The head keeps its log-probabilities (one per token and vocabulary entry) and an unfused
    backward writes two gradient buffers of them: 4 bytes each in fp32, 2 in bf16."""
    head = _head()
    tokens, vocab = 2 * 4096, head.padded_vocab(1)
    fp32 = Shape(tp=1, sp=False, micro_batch=2, seq_len=4096)
    bf16 = Shape(tp=1, sp=False, micro_batch=2, seq_len=4096, loss_bytes=2)
    kept = activation_bytes(head, fp32, "none", True) - activation_bytes(head, bf16, "none", True)
    assert kept == 2 * tokens * vocab
    work32 = layer_cost(head, fp32, "none", H100, TITAN).work_bytes
    work16 = layer_cost(head, bf16, "none", H100, BF16_LOSS).work_bytes
    assert work32 - work16 == 2 * (4 - 2) * tokens * vocab


def test_fsdp2_over_bf16_parameters_holds_bf16_gradients_and_reduces_fp32():
    """FSDP2 reduce-scatters in reduce_dtype (fp32) and keeps the sharded gradient in the
    parameters' dtype (bf16): 2 bytes held per parameter, 4 moved; Adam's state on the bf16
    shard is the shard and its two moments, 6 bytes, the only copy at ZeRO-3."""
    stack = with_overrides(TITAN, "test", grad_dtype="bf16", grad_reduce_dtype="fp32",
                           optimizer_state_bytes=6)
    assert stack.held_grad_bytes(3) == 2 and stack.reduced_grad_bytes(3) == 4
    par = Parallel(tp=1, pp=1, dp=8, micro_batch=1, num_microbatches=1, zero=3)
    weights, grads, optim = state_parts(8e9, par, stack)
    assert (weights, grads, optim) == (0.0, 2 * 1e9, 6 * 1e9)


def test_the_automodel_qwen3_30b_run_fits_as_it_ran():
    """NeMo Automodel's Qwen3-30B-A3B benchmark (8 H100s, ep 8, FSDP 8, local batch 4) ran.
    Priced on its own stack's dtypes (bf16 parameters with torch.optim.Adam states on them,
    bf16 gradients, a bf16 loss: the case's automodel-te-deepep component and its sources) it
    fits in 80 GiB; on fp32 states and an fp32 loss it would not (112 GiB). The model states are by hand: every
    GPU holds 1/8 of the parameters (dense ones sharded over FSDP 8, experts over EP 8), 6 bytes
    of optimizer state and 2 of gradient each."""
    case = next(c for c in load_cases(MOE_FILE) if c["name"] ==
                "moe-automodel-qwen3-30b-h100-8gpu-ep8")
    setup = case_setup(case)
    plan, pred = predict_plan(setup.model, setup.cluster, setup.parallel, setup.options,
                              simulated=True)
    assert plan.metrics.peak_memory_bytes < setup.cluster.hardware.memory_bytes
    parts = pred.memory_parts
    params = setup.model.params
    assert float(parts["optimizer"][0]) == pytest.approx(6 * params / 8, rel=1e-9)
    assert float(parts["gradients"][0]) == pytest.approx(2 * params / 8, rel=1e-9)
    fp32 = with_overrides(setup.options, "test", optimizer_state_bytes=12, grad_dtype="fp32",
                          grad_reduce_dtype=None, loss_dtype="fp32")
    wide, _ = predict_plan(setup.model, setup.cluster, setup.parallel, fp32, simulated=True)
    assert wide.metrics.peak_memory_bytes > setup.cluster.hardware.memory_bytes
    assert wide.metrics.peak_memory_bytes / GIB > 100
