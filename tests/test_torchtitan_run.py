"""torchtitan 0.2.2 runs the export as priced: one training step of its own trainer
(``torchtitan.train.Trainer``) on 4 gloo CPU processes with the unchanged ``torchtitan.toml``
(planner/engine/torchtitan_run.py), and what it built read back against plan.json: the mesh
degrees, each stage's module FQNs, which blocks are checkpointed (and how), FSDP2's
reshard_after_forward and dtypes, the schedule class, microbatch count and size.

The models are torchtitan's Llama 3 ``debugmodel`` flavor (6 blocks, hidden 256) and its Qwen3
``debugmodel`` (8 blocks, head_dim 128, per-head QK norms, tied embeddings), which plan3d
expresses exactly. Needs the engine extra (torch 2.13, torchtitan 0.2.2); skipped without it, a failure
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
# torchtitan/models/qwen3/__init__.py "debugmodel": 'vocab_size=2048, max_seq_len=4096,
# head_dim=128, dim=256, n_layers=8, n_heads=16, n_kv_heads=8, qk_norm=True, hidden_dim=3072,
# rope_theta=1000000, enable_weight_tying=True'
QWEN3 = ModelSpec(name="qwen3-debugmodel", num_layers=8, hidden_size=256, num_attention_heads=16,
                  num_kv_heads=8, head_dim=128, ffn_hidden_size=3072, vocab_size=2048,
                  seq_length=32, mlp="swiglu", norm="rmsnorm", bias=False, dropout=False,
                  qk_norm="head", tie_embeddings=True, rope_theta=1e6)
STACK = load_stack("torchtitan")


def debug_plan(tp=1, pp=2, dp=2, bounds=(0, 4, 8), schedule="1f1b", v=1, recompute="none",
               zero=3, micro_batch=1, m=4, blocks=None, stage_recompute=None, model=DEBUG) -> Plan:
    par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, num_microbatches=m,
                   schedule=schedule, virtual_stages=v, recompute=recompute, zero=zero,
                   sequence_parallel=tp > 1)
    modes = stage_recompute or [recompute] * (len(bounds) - 1)
    stages = tuple(Stage(stage=i, rank=i % pp, first=bounds[i], last=bounds[i + 1],
                         recompute=modes[i], recompute_layers=blocks, time_s=3e-3,
                         memory_bytes=1e6, fwd_s=1e-3, bwd_s=2e-3, wgrad_s=1e-3)
                   for i in range(len(bounds) - 1))
    return Plan(model=model, cluster=Cluster(hardware=HW, nodes=1, gpus_per_node=tp * pp * dp),
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
    # Qwen3 in 0.2.2: no PP, no FSDP with its tied embeddings, TP not runnable on CPU
    # (torchtitan.qwen3_rules): DDP over 4, bf16 under autocast, full recompute
    "qwen3-ddp4-full": debug_plan(pp=1, dp=4, bounds=(0, 10), recompute="full", zero=0, m=1,
                                  model=QWEN3),
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
    qwen = doc["model"]["name"] == QWEN3.name
    assert (titan["module"], titan["flavor"]) == (("qwen3" if qwen else "llama3"), "debugmodel")
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
        assert seen["tied"] == ([doc["model"]["tie_embeddings"]] if par["pp"] == 1 else [])
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
    assert torchtitan.flavor(replace(DEBUG, qk_norm="head")) is None


def test_solve_for_torchtitan_prices_one_recompute_per_plan():
    import planner

    solution = planner.solve(gpus=8, nodes=1, model="llama3-8b", launcher="torchtitan", top=3,
                             pp=2, refine=1)
    assert solution.plans
    for plan in solution.plans:
        assert len({(s.recompute, s.recompute_layers) for s in plan.stages}) == 1
        assert torchtitan.check(plan) == []


# --- Qwen3: the dense flavors torchtitan 0.2.2 ships, and what it cannot run for them ---------

def qwen3_plan(**kw) -> Plan:
    return debug_plan(**{"pp": 1, "dp": 4, "bounds": (0, 10), "zero": 0, "m": 1,
                         "model": QWEN3, **kw})


def _hf_qwen3(**change) -> ModelSpec:
    """A HuggingFace Qwen3-0.6B config.json (Qwen/Qwen3-0.6B), read by plan3d's importer."""
    from planner.model.load import model_from_dict

    data = {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 3072, "vocab_size": 151936, "max_position_embeddings": 40960,
            "rope_theta": 1000000, "rope_scaling": None, "tie_word_embeddings": True,
            "attention_dropout": 0.0, "use_sliding_window": False}
    return replace(model_from_dict({**data, **change}, "config.json"), seq_length=4096)


def test_qwen3_flavors_match_hf_configs_exactly():
    f = torchtitan.flavor(_hf_qwen3())
    assert (f.module, f.flavor, f.tied) == ("qwen3", "0.6B", True)
    big = _hf_qwen3(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                    intermediate_size=12288, tie_word_embeddings=False)
    assert (torchtitan.flavor(big).flavor, torchtitan.flavor(big).tied) == ("8B", False)
    assert torchtitan.flavor(QWEN3).flavor == "debugmodel"
    for change in (dict(tie_word_embeddings=False), dict(rope_theta=500000), dict(head_dim=64),
                   dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
                   dict(model_type="llama")):  # no QK norm
        assert torchtitan.flavor(_hf_qwen3(**change)) is None, change


def test_qwen3_toml_and_plan_json(tmp_path):
    plan = CELLS["qwen3-ddp4-full"]
    text = torchtitan.render(plan)["torchtitan.toml"]
    assert '[model]\nname = "qwen3"\nflavor = "debugmodel"' in text
    assert "data_parallel_replicate_degree = 4" in text
    entry = torchtitan.entry(plan)
    assert entry["supported"] and (entry["module"], entry["flavor"]) == ("qwen3", "debugmodel")
    assert torchtitan.check(qwen3_plan(pp=1, dp=1, bounds=(0, 10))) == []


def qwen3_facts(**change):
    return facts(**{"tp": 1, "pp": 1, "dp": 4, "zero": 0, "sequence_parallel": False,
                    "num_heads": 16, "num_kv_heads": 8, "ffn": 3072, "vocab": 2048,
                    "num_blocks": 8, **change})


@pytest.mark.parametrize("change,phrase", [
    (dict(pp=2, dp=2, zero=3), "qwen3 has no pipelining"),
    (dict(zero=3), "shared with a parameter already managed by another FSDP group"),
    (dict(zero=2), "shared with a parameter already managed by another FSDP group"),
    (dict(tp=2, dp=2, zero=3, sequence_parallel=True), "does not have a sharding strategy"),
])
def test_search_refuses_what_torchtitan_cannot_run_for_qwen3(change, phrase):
    from planner.launchers import launcher_allows

    assert launcher_allows("torchtitan", qwen3_facts()) is None
    rule = launcher_allows("torchtitan", qwen3_facts(**change))
    assert rule is not None and phrase in rule, rule


def test_qwen3_untied_flavors_run_fsdp_but_not_pp():
    from planner.launchers import launcher_allows

    q8b = dict(num_heads=32, num_kv_heads=8, ffn=12288, vocab=151936, num_blocks=36)
    assert launcher_allows("torchtitan", qwen3_facts(zero=3, **q8b)) is None
    assert "no pipelining" in launcher_allows("torchtitan", qwen3_facts(pp=2, dp=2, zero=3, **q8b))


def test_qwen3_refusals_in_one_line(tmp_path):
    _refused(tmp_path, qwen3_plan(pp=2, dp=2, zero=3, bounds=(0, 5, 10)), "no pipelining")
    _refused(tmp_path, qwen3_plan(zero=3), "another FSDP group")
    long = qwen3_plan(model=replace(QWEN3, seq_length=8192))
    _refused(tmp_path, long, "exceeds qwen3 debugmodel's max_seq_len 4096")
    assert "max_seq_len 4096" in torchtitan.model_rules(long.model)[0]


def test_qwen3_moe_is_refused_with_the_reason():
    from planner.model.load import load_model

    moe = load_model("profiles/validation/configs/qwen3-30b-a3b.json")
    rule = torchtitan.model_rules(moe)[0]
    assert "MoE models" in rule and "30B-A3B" in rule and "DeepSeek-V3" in rule
