"""Every bundled launcher applies one recompute setting to all stages (Megatron's
--recompute-granularity/-method/-num-layers, DeepSpeed's activation_checkpoint_interval,
torchtitan's activation_checkpoint), so a solve on a launcher's stack prices only plans whose
stages recompute alike, and each export writes that one setting (issue #27: exports raised every
stage to the strongest mode any stage asked for, e.g. a plan whose stages recompute nothing
exported full recompute on every layer)."""

from dataclasses import replace

import pytest

import planner
from planner.launchers import ExportError, export_plan, megatron
from planner.launchers.common import launched_recompute
from planner.stack import load_stack

# llama3-8b on 8 A100-40GB: with stage recompute left free (a stack on no launcher) the best
# plan recomputes the first 3 blocks of stage 0 and nothing elsewhere
CASE = dict(model="llama3-8b", gpus=8, nodes=1, gpu="a100-40gb", top=5)


def test_free_stages_mix_recompute_where_no_launcher_runs_the_plan():
    free = replace(load_stack("megatron-core"), launcher=None)
    best = planner.solve(**CASE, stack=free).plans[0]
    assert launched_recompute(best) is None, [s.recompute_label for s in best.stages]


@pytest.mark.parametrize("stack", ["megatron-core", "deepspeed", "torchtitan"])
def test_a_launchers_plans_recompute_alike_on_every_stage(stack):
    result = planner.solve(**CASE, stack=stack)
    assert result.plans
    for plan in result.plans:
        setting = launched_recompute(plan)
        assert setting is not None, [s.recompute_label for s in plan.stages]
        assert {s.recompute for s in plan.stages} == {setting.mode}


def test_megatron_writes_the_recompute_its_stages_priced(tmp_path):
    plan = planner.solve(**CASE, stack="megatron-core").plans[0]
    setting = launched_recompute(plan)
    flags = dict(megatron.args(plan))
    assert flags.get("--recompute-granularity") == (None if setting.mode == "none"
                                                    else setting.mode)
    mixed = replace(plan, stages=(replace(plan.stages[0], recompute="full"),
                                  *(replace(s, recompute="none") for s in plan.stages[1:])))
    assert len(plan.stages) > 1
    with pytest.raises(ExportError, match="recompute differently"):
        export_plan(mixed, ["megatron"], tmp_path / "out")
    assert not (tmp_path / "out").exists()
