"""torchtitan 0.2.2 runs the export as priced: one training step of its own trainer
(``torchtitan.train.Trainer``) on 4 gloo CPU processes with the unchanged ``torchtitan.toml``
(planner/engine/torchtitan_run.py), and what it built read back against plan.json: the mesh
degrees, each stage's module FQNs, which blocks are checkpointed (and how), FSDP2's
reshard_after_forward and dtypes, the schedule class, microbatch count and size.

The model is torchtitan's ``debugmodel`` flavor (6 blocks, hidden 256), which plan3d expresses
exactly. Needs the engine extra (torch 2.13, torchtitan 0.2.2); skipped without it, a failure
with PLAN3D_REQUIRE_ENGINE=1.
"""

import json
from dataclasses import replace

import pytest
from conftest import engine_module

from planner.hardware.profiles import Cluster
from planner.launchers import ExportError, export_plan
from planner.launchers import torchtitan
from planner.model.spec import ModelSpec
from planner.core.parallel import Parallel
from planner.predict.plan import Metrics, Plan, Stage
from planner.stack import load_stack
from test_export import HW

DEBUG = ModelSpec(name="torchtitan-debugmodel", num_layers=6, hidden_size=256,
                  num_attention_heads=16, num_kv_heads=16, ffn_hidden_size=768,
                  vocab_size=2048, seq_length=32, mlp="swiglu", norm="rmsnorm", bias=False,
                  dropout=False, rope_theta=500000.0)
STACK = load_stack("torchtitan")


def debug_plan(tp=1, pp=2, dp=2, bounds=(0, 4, 8), schedule="1f1b", v=1, recompute="none",
               zero=3, micro_batch=1, m=4, blocks=None, stage_recompute=None) -> Plan:
    par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, num_microbatches=m,
                   schedule=schedule, virtual_stages=v, recompute=recompute, zero=zero,
                   sequence_parallel=tp > 1)
    modes = stage_recompute or [recompute] * (len(bounds) - 1)
    stages = tuple(Stage(stage=i, rank=i % pp, first=bounds[i], last=bounds[i + 1],
                         recompute=modes[i], recompute_layers=blocks, time_s=3e-3,
                         memory_bytes=1e6, fwd_s=1e-3, bwd_s=2e-3, wgrad_s=1e-3)
                   for i in range(len(bounds) - 1))
    return Plan(model=DEBUG, cluster=Cluster(hardware=HW, nodes=1, gpus_per_node=tp * pp * dp),
                parallel=par, stages=stages, stack=STACK,
                metrics=Metrics(step_time_s=1.0, tokens_per_s=1.0, tflops_per_gpu=1.0, mfu=0.1,
                                hfu=0.1, bubble_fraction=0.1, peak_memory_bytes=1.0))


# Cells run in one launch of 4 gloo processes (one Trainer after another in the same processes,
# as torchtitan skips init_distributed when a process group exists). PP cells are pp 2 x FSDP 2
# (bf16 with PP needs FSDP: torchtitan.mixed_precision_rules); the TP cell is tp 2 x FSDP 2.
CELLS = {
    "1f1b-full-zero3": debug_plan(recompute="full", zero=3),
    "gpipe-selective-zero2": debug_plan(schedule="gpipe", recompute="selective", zero=2,
                                        micro_batch=2, m=2),
    "interleaved-none-zero3": debug_plan(schedule="interleaved", v=2, bounds=(0, 2, 4, 6, 8)),
    "zb-full-zero2": debug_plan(schedule="zb-h1", v=2, bounds=(0, 2, 4, 6, 8), recompute="full",
                                zero=2),
    "tp2-selective-zero3": debug_plan(tp=2, pp=1, dp=2, bounds=(0, 8), recompute="selective",
                                      m=2),
    "ddp4-full-zero0": debug_plan(pp=1, dp=4, bounds=(0, 8), recompute="full", zero=0, m=1),
    "layer-sac-1-of-3": debug_plan(recompute="full", blocks=1),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    engine_module("torchtitan", reason="torchtitan 0.2.2 is not installed (the engine extra)")
    from planner.engine.torchtitan_run import run_torchtitan

    root = tmp_path_factory.mktemp("titan")
    dirs = []
    for name, plan in CELLS.items():
        export_plan(plan, ["json", "torchtitan"], root / name)
        dirs.append(root / name)
    return dict(zip(CELLS, zip((json.loads((d / "plan.json").read_text()) for d in dirs),
                               run_torchtitan(dirs, root / "run"))))


def expected_ac(stage: dict, blocks: int) -> list[str]:
    """What the plan prices for a stage's blocks: every block at its recompute mode."""
    return [stage["recompute"]] * blocks


@pytest.mark.parametrize("cell", CELLS)
def test_torchtitan_runs_what_plan_json_says(runs, cell):
    doc, ranks = runs[cell]
    par, titan = doc["parallel"], doc["engines"]["torchtitan"]
    shard = par["dp"] if par["zero"] >= 2 else 1
    stages = {}
    for seen in ranks:
        assert seen["step"] == 1 and seen["finite"], cell
        assert (seen["tp"], seen["pp"], seen["dp_shard"], seen["dp_replicate"]) == \
            (par["tp"], par["pp"], shard, par["dp"] // shard)
        stages.update(seen["stages"])
        if par["pp"] > 1:
            pipe = doc["engines"]["torch_pipelining"]
            assert seen["schedule"] == {"class": pipe["schedule_class"],
                                        "n_microbatches": par["num_microbatches"]}
            assert seen["accumulation"] == 1
        else:
            assert seen["schedule"] is None
            assert seen["accumulation"] == par["num_microbatches"]
        if seen["microbatch_rows"]:  # the ranks holding the embedding
            assert set(seen["microbatch_rows"]) == {par["micro_batch"]}
        for stage in seen["stages"].values():
            for fsdp in stage["fsdp"].values():
                if shard == 1:
                    assert fsdp is None
                    assert seen["autocast"] == "torch.bfloat16"  # DDP: torch.autocast
                    continue
                reshard = {"always": True, "never": False,
                           "default": par["pp"] == 1}[titan["fsdp_reshard_after_forward"]]
                assert fsdp == {"reshard": reshard, "param_dtype": "torch.bfloat16",
                                "reduce_dtype": "torch.float32"}
    assert sorted(stages) == [s["stage"] for s in doc["stages"]]
    for s in doc["stages"]:
        built = stages[s["stage"]]
        assert built["modules"] == s["modules"]
        ac = list(built["ac"].values())
        if cell == "layer-sac-1-of-3":  # every 3rd block: as many as the plan's first 1
            assert titan["activation_checkpoint"] == {"mode": "selective",
                                                      "selective_ac_option": "3"}
            assert ac.count("full") == 1 and ac.count("none") == len(ac) - 1
        else:
            assert ac == expected_ac(s, len(ac))
    assert doc["precision"]["dtype"] == "bfloat16" and doc["precision"]["gradients"] == "float32"


# --- what torchtitan 0.2.2 cannot run as priced: refused before writing, and before searching --

def facts(**change):
    from planner.launchers import Facts

    base = dict(tp=2, pp=2, dp=2, micro_batch=1, num_microbatches=4, schedule="1f1b", zero=3,
                sequence_parallel=True, num_heads=16, num_kv_heads=16, ffn=768, vocab=2048)
    return Facts(**{**base, **change})


@pytest.mark.parametrize("change,phrase", [
    (dict(dp=1), "only under FSDP"),  # bf16 with TP/PP and no FSDP trains in fp32
    (dict(tp=1, dp=1, zero=0, sequence_parallel=False), "only under FSDP"),
    (dict(sequence_parallel=False), "always runs sequence parallel"),
    (dict(cp=2), "context_parallel_degree is not exported"),
    (dict(zero=1), "no ZeRO-1"),
    (dict(zero=0), "DDP"),
    (dict(schedule="zb-h1"), "at least 2 stages per rank"),
])
def test_search_refuses_what_torchtitan_cannot_run(change, phrase):
    from planner.launchers import launcher_allows

    assert launcher_allows("torchtitan", facts()) is None
    rule = launcher_allows("torchtitan", facts(**change))
    assert rule is not None and phrase in rule, rule


def _refused(tmp_path, plan, phrase):
    with pytest.raises(ExportError, match=phrase) as err:
        export_plan(plan, ["json", "torchtitan"], tmp_path / "out")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_mixed_stage_recompute_is_refused_in_one_line(tmp_path):
    _refused(tmp_path, debug_plan(stage_recompute=["none", "full"]),
             "stages recompute differently")


def test_block_recompute_without_an_exact_layer_sac_is_refused(tmp_path):
    # 2 and 4 blocks, the first 2 of each: no k gives floor(n / k) = 2 on both ranks
    _refused(tmp_path, debug_plan(bounds=(0, 3, 8), recompute="full", blocks=2),
             "cannot set")


def test_fp8_and_odd_sequence_are_refused(tmp_path):
    from planner.stack import with_overrides

    fp8 = replace(debug_plan(), stack=with_overrides(STACK, precision="fp8"))
    _refused(tmp_path, fp8, "FP8 export is not supported")
    odd = debug_plan(tp=2, pp=1, dp=2, bounds=(0, 8))
    _refused(tmp_path, replace(odd, model=replace(DEBUG, seq_length=30)),
             "not divisible by 2 \\* tp \\* cp = 4")


def test_debugmodel_flavor_and_toml():
    text = torchtitan.render(CELLS["1f1b-full-zero3"])["torchtitan.toml"]
    assert 'flavor = "debugmodel"' in text and 'fsdp_reshard_after_forward = "default"' in text
    assert '[activation_checkpoint]\nmode = "full"\n' in text
    assert torchtitan.flavor(replace(DEBUG, qk_norm="rmsnorm")) is None


def test_solve_for_torchtitan_prices_one_recompute_per_plan():
    import planner

    solution = planner.solve(gpus=8, nodes=1, model="llama3-8b", launcher="torchtitan", top=3,
                             pp=2, refine=1)
    assert solution.plans
    for plan in solution.plans:
        assert len({(s.recompute, s.recompute_layers) for s in plan.stages}) == 1
        assert torchtitan.check(plan) == []
