"""The bundled torchtitan stack prices "selective" as what its export launches: torchtitan's
op-level selective AC (``[activation_checkpoint] mode = "selective"``, ``selective_ac_option =
"op"``; priced in cost/recompute.py, checked by hand in tests/test_torchtitan_sac.py).

Where the op policy is not priced (MoE or MLA blocks, FP8 linears) a search counts those
configurations as rejected under their reason, and a pinned ``--recompute selective`` is refused
in one line (exit 2)."""

from collections import Counter

import pytest
from conftest import engine_module
from typer.testing import CliRunner

from cli import app
from planner.core.errors import PlanInputError
from planner.core.parallel import Parallel
from planner.cost import recompute
from planner.fidelity.cases import MODERN_FILE, case_setup, load_cases
from planner.hardware.profiles import load_hardware, make_cluster
from planner.launchers import torchtitan
from planner.model.load import load_model
from planner.predict.stages import allowed_modes
from planner.predict.step import evaluate
from planner.search.explain import explain
from planner.search.request import Pins, Request
from planner.search.solver import search
from planner.search.space import enumerate_configs, space_size
from planner.stack import load_stack, with_overrides

TITAN = load_stack("torchtitan")
LLAMA3_8B = load_model("llama3-8b")
MOE = load_model("tests/hf_configs/moe/qwen1.5-moe-a2.7b.json").with_seq_length(4096)
MLA = load_model("tests/hf_configs/moe/deepseek-v3.json")
UNPRICED_MOE = "torchtitan_op selective AC not priced for MoE/MLA blocks"


def _plan(recompute_mode: str):
    """Llama 3 8B on 8 A100s, FSDP (ZeRO-3), one microbatch of 2, on the bundled stack."""
    cluster = make_cluster(load_hardware("a100"), 8, 1)
    par = Parallel(tp=1, pp=1, dp=8, micro_batch=2, num_microbatches=1, schedule="1f1b",
                   virtual_stages=1, recompute=recompute_mode, zero=3, sequence_parallel=False)
    return evaluate(LLAMA3_8B, cluster, par, TITAN, simulated=True)


def test_the_stack_names_the_op_policy():
    assert TITAN.recompute_modules == (recompute.OP_POLICY,)
    assert recompute.selective_refusal(LLAMA3_8B, TITAN) is None
    assert not recompute.selective_discards_nothing(LLAMA3_8B, TITAN)


def test_the_stacks_selective_prices_the_op_policy():
    # memory strictly between none and full (it keeps the block input, the saved mms' and
    # SDPA's outputs); time above none (wk, wo, w3 and every element-wise op run again), below
    # full (which re-runs the whole forward)
    none, op, full = (_plan(m) for m in ("none", "selective", "full"))
    mem = [p.metrics.peak_memory_bytes for p in (none, op, full)]
    step = [p.metrics.step_time_s for p in (none, op, full)]
    assert mem[0] > mem[1] > mem[2]
    assert step[0] < step[1] < step[2]
    # and it is the op policy's price, not Megatron's core_attn (a no-op under flash)
    scores = with_overrides(TITAN, "test", recompute_modules=["core_attn"])
    cluster = make_cluster(load_hardware("a100"), 8, 1)
    core = evaluate(LLAMA3_8B, cluster, op.parallel, scores, simulated=True)
    assert core.metrics.step_time_s == pytest.approx(step[0])
    assert core.metrics.step_time_s < step[1]


def test_selective_is_searched_where_it_changes_something():
    cluster = make_cluster(load_hardware("a100"), 8, 1)

    def modes(stack):
        req = Request(model=LLAMA3_8B, cluster=cluster, options=stack, pins=Pins(tp=1, pp=1))
        return {par.recompute for par in enumerate_configs(req, Counter())}

    assert modes(TITAN) == {"none", "selective", "full"}
    # Megatron's core_attn under flash attention drops nothing flash has not already dropped
    megatron = load_stack("megatron-core")
    assert megatron.flash_attention and megatron.recompute_modules == ("core_attn",)
    assert modes(megatron) == {"none", "full"}


def test_the_partitioner_gets_selective_only_where_it_is_priced():
    full = Parallel(tp=1, pp=2, dp=4, micro_batch=1, num_microbatches=8, schedule="1f1b",
                    virtual_stages=1, recompute="full", zero=1, sequence_parallel=False)
    assert allowed_modes(LLAMA3_8B, full, TITAN) == ("none", "selective", "full")
    assert allowed_modes(MOE, full, TITAN) == ("none", "full")
    assert allowed_modes(LLAMA3_8B, full, load_stack("megatron-core")) == ("none", "full")


def test_unpriced_reasons():
    assert recompute.selective_refusal(MOE, TITAN) == UNPRICED_MOE
    assert recompute.selective_refusal(MLA, TITAN) == UNPRICED_MOE
    fp8 = with_overrides(TITAN, "test", precision="fp8")
    assert recompute.selective_refusal(LLAMA3_8B, fp8) == \
        "torchtitan_op selective AC not priced for FP8 linears"
    # other stacks' selective (Megatron's modules) is priced on every model
    assert recompute.selective_refusal(MOE, load_stack("megatron-core")) is None


def test_an_moe_search_counts_the_unpriced_selective_configurations():
    cluster = make_cluster(load_hardware("h100"), 8, 1)
    req = Request(model=MOE, cluster=cluster, options=TITAN, pins=Pins(tp=1), top=3)
    result = search(req)
    assert result.rejected[UNPRICED_MOE] > 0
    assert result.accounted and result.considered == space_size(req)
    assert all(s.recompute != "selective" for p in result.plans for s in p.stages)
    # exactly the selective configurations the launcher runs: as many as the full ones
    configs = list(enumerate_configs(req, Counter()))
    assert result.rejected[UNPRICED_MOE] == sum(p.recompute == "full" for p in configs)


def test_a_pinned_selective_on_an_moe_model_is_refused_in_one_line():
    result = CliRunner().invoke(app, [
        "solve", "--stack", "torchtitan", "--model", "tests/hf_configs/moe/qwen1.5-moe-a2.7b.json",
        "--seq-len", "4096", "--gpus", "8", "--nodes", "1", "--gpu", "h100",
        "--recompute", "selective"])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert errors == ["error: --recompute selective: " + UNPRICED_MOE + " (qwen1.5-moe-a2.7b on "
                      "the torchtitan stack); use --recompute full or none, or leave --recompute "
                      "out"]
    assert "Traceback" not in result.output
    # the API refuses the same, explain included
    req = Request(model=MOE, cluster=make_cluster(load_hardware("h100"), 8, 1), options=TITAN,
                  pins=Pins(recompute="selective"))
    for run in (search, explain):
        with pytest.raises(PlanInputError, match="not priced for MoE/MLA blocks"):
            run(req)


def test_explain_and_export_agree_with_the_search():
    cluster = make_cluster(load_hardware("a100"), 16, 2)
    pins = Pins(tp=1, pp=2, dp=8, micro_batch=1, schedule="1f1b", zero=3, recompute="selective")
    req = Request(model=LLAMA3_8B.with_seq_length(8192), cluster=cluster, options=TITAN,
                  pins=pins, top=1)
    plan = search(req).plans[0]
    assert {s.recompute for s in plan.stages} == {"selective"}
    assert plan.stack.recompute_modules == ("torchtitan_op",)  # plan.json records the stack
    shown = explain(req)
    assert shown.plan.metrics.step_time_s == pytest.approx(plan.metrics.step_time_s)
    assert shown.plan.metrics.peak_memory_bytes == pytest.approx(plan.metrics.peak_memory_bytes)
    # what the export launches is the policy priced
    toml = torchtitan.render(plan)["torchtitan.toml"]
    assert '[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "op"\n' in toml


def test_validation_prices_op_rows_on_the_stacks_own_field():
    rows = [case_setup(c) for c in load_cases(MODERN_FILE)
            if c["name"].endswith("ac_selective-op")]
    assert rows
    for row in rows:
        assert row.parallel.recompute == "selective"
        assert row.options.recompute_modules == TITAN.recompute_modules
        assert "recompute_modules" not in dict(row.options.overrides)  # the stack's own value


def test_torchtitan_parses_the_selective_export_as_its_op_policy(tmp_path):
    engine_module("torchtitan", reason="torchtitan is not installed; the render test above "
                  "stands in for its parser")
    from torchtitan.config.manager import ConfigManager

    cluster = make_cluster(load_hardware("a100"), 8, 1)
    req = Request(model=LLAMA3_8B.with_seq_length(8192), cluster=cluster, options=TITAN,
                  pins=Pins(tp=1, pp=1, recompute="selective"), top=1)
    plan = search(req).plans[0]
    (tmp_path / "t.toml").write_text(torchtitan.render(plan)["torchtitan.toml"])
    cfg = ConfigManager().parse_args(["--job.config_file", str(tmp_path / "t.toml")])
    assert (cfg.activation_checkpoint.mode, cfg.activation_checkpoint.selective_ac_option) \
        == ("selective", "op")
