"""Context parallelism in the exports: Megatron's --context-parallel-size (and --cp-comm-type when
the stack exchanges K/V another way), torchtitan 0.2.2 refuses CP (not run here),
DeepSpeed refusing (Ulysses is a separate API)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.core.parallel import Parallel
from planner.hardware.profiles import load_hardware, make_cluster
from planner.launchers import ExportError, deepspeed, render_all
from planner.launchers.megatron import parse_megatron_args
from planner.model.presets import PRESETS
from planner.predict.step import evaluate
from planner.stack import load_stack, with_overrides


def _plan(stack: str = "megatron-core", zero: int = 1, **stack_changes):
    model = replace(PRESETS["llama3-8b"], seq_length=32768)
    cluster = make_cluster(load_hardware("h100"), 16, 2)
    par = Parallel(tp=2, pp=2, dp=2, micro_batch=1, num_microbatches=4, cp=2,
                   sequence_parallel=True, zero=zero)
    return evaluate(model, cluster, par, with_overrides(load_stack(stack), **stack_changes))


def test_megatron_carries_cp_and_reads_it_back():
    files = render_all(_plan(), ["megatron"])
    text = files["megatron_args.sh"]
    assert "--context-parallel-size 2" in text
    assert "--cp-comm-type" not in text  # p2p is Megatron's default
    parsed = parse_megatron_args(text + "\nPLAN3D_WORLD_SIZE=16\n")
    assert (parsed["tp"], parsed["cp"], parsed["pp"], parsed["dp"]) == (2, 2, 2, 2)


def test_megatron_names_the_all_to_all_variant():
    text = render_all(_plan(cp_comm="a2a"), ["megatron"])["megatron_args.sh"]
    assert "--cp-comm-type a2a" in text
    assert parse_megatron_args(text)["cp_comm"] == "a2a"


def test_megatron_refuses_a_sequence_it_cannot_balance():
    plan = _plan()
    odd = replace(plan, model=replace(plan.model, seq_length=32766))
    with pytest.raises(ExportError, match=r"divisible by 2\*cp = 4"):
        render_all(odd, ["megatron"])


def test_torchtitan_refuses_context_parallelism():
    """torchtitan 0.2.2's context_parallel_degree is not run in CI here: refused, not exported."""
    with pytest.raises(ExportError, match="context_parallel_degree is not exported"):
        render_all(_plan("torchtitan", zero=2), ["torchtitan"])


def test_deepspeed_refuses_cp():
    plan = _plan("deepspeed", cp_comm="p2p")  # priced as if it could: the exporter's own rule
    with pytest.raises(ExportError):  # its first rule: tp = 2 (DeepSpeed runs no TP)
        render_all(plan, ["deepspeed"])
    assert any("no context parallelism in this export" in p for p in deepspeed.check(plan))

