"""The Megatron-LM core_r0.13 export checked on megatron-core 0.13.1 itself: the unchanged
megatron_args.sh becomes megatron-core's own TransformerConfig / MLATransformerConfig (its
__post_init__ validates them) the way core_transformer_config_from_args builds them
(planner/engine/megatron_config.py), and what they say Megatron runs must equal plan.json.
Cells Megatron refuses are refused by check() and, for parallel settings, by the Facts rules
the search uses (launcher_allows)."""

import json
from dataclasses import replace

import pytest
from conftest import MOE_CONFIGS, engine_module

from planner.launchers import ExportError, Facts, export_plan, launcher_allows, megatron, render_all
from planner.model.load import load_model
from planner.stack import load_stack, with_overrides
from test_export import make_plan

INTERLEAVED = (0, 4, 8, 12, 16, 20, 24, 28, 34)  # chunks of 3, 4 x 6, 5 blocks
ONE_F_ONE_B = (0, 8, 17, 26, 34)  # 7, 9, 9, 7 blocks


@pytest.fixture(scope="module", autouse=True)
def mcore():
    return engine_module("megatron.core", reason="megatron-core 0.13.1 is not installed")


def plan_of(recompute="full", blocks=None, stack="megatron-core", model=None, **par):
    settings = {"bounds": ONE_F_ONE_B, **par}
    p = make_plan(recompute=recompute, **settings)
    stages = tuple(replace(s, recompute_layers=blocks) for s in p.stages)
    p = replace(p, stages=stages, stack=load_stack(stack) if isinstance(stack, str) else stack)
    return replace(p, model=model) if model is not None else p


def exported(p):
    files = render_all(p, ["json", "megatron"])
    return json.loads(files["plan.json"]), files["megatron_args.sh"]


def assert_runs_as_planned(p):
    from planner.engine.megatron_config import read_back

    doc, text = exported(p)
    got, par = read_back(text), doc["parallel"]
    kinds = [layer.kind for layer in p.model.layers]
    blocks = [kinds[s["layers"]["start"]:s["layers"]["stop"]].count("block")
              for s in doc["stages"]]
    recomputed = [(s.get("recompute_layers", n) if s["recompute"] == "full" else 0)
                  for s, n in zip(doc["stages"], blocks)]
    assert (got["tp"], got["pp"], got["v"], got["cp"]) == (par["tp"], par["pp"],
                                                         par["virtual_stages"], par.get("cp", 1))
    assert got["sequence_parallel"] == par["sequence_parallel"]
    assert got["stage_blocks"] == blocks
    assert got["recomputed"] == [min(r, n) for r, n in zip(recomputed, blocks)]
    mode = {"none": None}.get(par["recompute"], par["recompute"])
    assert got["recompute"][0] == mode
    assert got["distributed_optimizer"] == (par["zero"] >= 1)
    fp8 = p.stack.precision == "fp8"
    assert got["bf16"] and (got["fp8"] is not None) == fp8
    if fp8:
        assert got["fp8_recipe"] == megatron.FP8_RECIPES[p.stack.fp8_recipe]
    if p.model.is_moe:
        m = p.model
        assert (got["ep"], got["etp"]) == (par["ep"], par["etp"])
        assert (got["num_experts"], got["topk"]) == (m.num_experts, m.moe_top_k)
        assert got["aux_loss"] == m.router_aux_loss and got["grouped_gemm"]
        assert got["balancing"] == ("none" if not m.router_aux_loss else "seq_aux_loss"
                                    if m.router_aux_loss_per_sequence else "aux_loss")
    return got


SCHEDULES = {"1f1b": {}, "interleaved": dict(bounds=INTERLEAVED, virtual_stages=2,
                                             schedule="interleaved")}
RECOMPUTES = {"none": ("none", None), "selective": ("selective", None),
              "full": ("full", None), "block2": ("full", 2)}


@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize("recompute", list(RECOMPUTES))
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_dense_matrix_runs_as_planned(schedule, recompute, zero):
    mode, blocks = RECOMPUTES[recompute]
    p = plan_of(mode, blocks, zero=zero, **SCHEDULES[schedule])
    got = assert_runs_as_planned(p)
    if recompute == "block2":
        assert got["recompute"] == ("full", "block", 2)
    if recompute == "full":
        assert got["recompute"] == ("full", "uniform", 1)


def test_fp8_cell_runs_as_planned():
    stack = with_overrides(load_stack("megatron-core"), precision="fp8", fp8_recipe="delayed")
    got = assert_runs_as_planned(plan_of(stack=stack))
    assert got["fp8"] == "hybrid"


def test_mixtral_moe_cell_runs_with_its_balancing_loss():
    m = load_model(MOE_CONFIGS / "mixtral-8x7b-v0.1.json").with_seq_length(4096)
    got = assert_runs_as_planned(plan_of(model=m, ep=2))
    assert (got["balancing"], got["aux_loss"], got["ep"]) == ("aux_loss", 0.02, 2)


def test_deepseek_mla_yarn_cell_runs_its_rope():
    m = load_model(MOE_CONFIGS / "deepseek-v2-lite.json").with_seq_length(4096)
    p = plan_of(model=m, bounds=(0, 29), pp=1, dp=8, ep=2)
    got = assert_runs_as_planned(p)
    assert got["config"] == "MLATransformerConfig" and got["rope_type"] == "yarn"
    yarn = m.rope_scaling
    assert (got["rotary_scaling_factor"], got["mscale"], got["mscale_all_dim"]) == (
        yarn["factor"], yarn["mscale"], yarn["mscale_all_dim"])
    assert (got["original_max_positions"], got["beta_fast"], got["beta_slow"]) == (
        yarn["original_max_position_embeddings"], yarn["beta_fast"], yarn["beta_slow"])
    assert (got["balancing"], got["aux_loss"]) == ("seq_aux_loss", 0.001)


def test_interleaved_on_two_ranks_runs_with_megatrons_default_p2p_overlap():
    """validate_args asserts pp > 2 for interleaving only under --no-overlap-p2p-communication
    (the overlap is on by default), so a v = 2 plan on pp = 2 runs as planned."""
    got = assert_runs_as_planned(plan_of(schedule="interleaved", virtual_stages=2, pp=2, dp=4,
                                         bounds=(0, 9, 17, 25, 34)))
    assert (got["pp"], got["v"]) == (2, 2)


# --- refused cells ---------------------------------------------------------------------------

@pytest.mark.parametrize("change,phrase", [
    (dict(zero=2), "ZeRO-2"),
    (dict(schedule="gpipe"), "no GPipe"),
    (dict(schedule="interleaved", virtual_stages=2, num_microbatches=6, bounds=INTERLEAVED),
     "divisible by pp"),
])
def test_parallel_refusals_in_check_and_search(change, phrase, tmp_path):
    p = plan_of(**change)
    assert any(phrase in x for x in megatron.check(p))
    assert phrase in (launcher_allows("megatron", Facts.of(p.parallel, p.model)) or "")
    with pytest.raises(ExportError, match=phrase):
        export_plan(p, ["json", "megatron"], tmp_path)
    assert list(tmp_path.iterdir()) == []


def deepseek(**rope):
    m = load_model(MOE_CONFIGS / "deepseek-v2-lite.json").with_seq_length(4096)
    return replace(m, rope_scaling={**m.rope_scaling, **rope}) if rope else m


@pytest.mark.parametrize("model,phrase", [
    (lambda: deepseek().with_seq_length(8192), "validate_args needs it >= --seq-length"),
    (lambda: deepseek(beta_fast=16), "YaRN beta_fast 16 has no core_r0.13 flag"),
    (lambda: deepseek(extrapolation_factor=1.0), "YaRN key 'extrapolation_factor'"),
    (lambda: replace(make_plan().model, rope_scaling={"type": "yarn", "factor": 4}),
     "YaRN RoPE only in multi-latent attention"),
    (lambda: replace(make_plan().model, rope_scaling={"rope_type": "dynamic", "factor": 2}),
     "RoPE scaling 'dynamic'"),
])
def test_rope_refusals_name_what_core_r013_lacks(model, phrase):
    m = model()
    dense = not m.kv_lora_rank
    p = plan_of(model=m, **({} if dense else dict(bounds=(0, 29), pp=1, dp=8, ep=2)))
    assert any(phrase in x for x in megatron.check(p)), megatron.check(p)


# --- recompute regressions ---------------------------------------------------------------------

def test_mixed_none_full_stages_are_refused_in_one_line(tmp_path):
    p = plan_of()
    stages = tuple(replace(s, recompute="none" if s.stage % 2 else "full") for s in p.stages)
    with pytest.raises(ExportError) as err:
        export_plan(replace(p, stages=stages), ["json", "megatron"], tmp_path)
    assert "recompute differently" in str(err.value) and "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("counts,ok", [((7, 8, 8, 7), True), ((6, 8, 8, 7), False)])
def test_block_plan_exports_only_when_one_n_runs_each_chunk(counts, ok, tmp_path):
    p = plan_of()  # chunks of 7, 9, 9, 7 blocks
    stages = tuple(replace(s, recompute_layers=n) for s, n in zip(p.stages, counts))
    p = replace(p, stages=stages)
    if not ok:
        with pytest.raises(ExportError, match="recompute differently"):
            export_plan(p, ["json", "megatron"], tmp_path)
        return
    got = assert_runs_as_planned(p)
    assert got["recompute"] == ("full", "block", 8) and got["recomputed"] == list(counts)
