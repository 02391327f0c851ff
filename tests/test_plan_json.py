"""plan.json v2: every exported plan validates against the shipped JSON Schema, the document says
what an engine needs (modules per stage, half-open ranges, split backward, the loss stage, engine
names), and `plan simulate --plan` reads v1 and v2 alike and refuses other versions."""

import json
from dataclasses import replace

import jsonschema
import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from cli import app
from planner.core.errors import PlanInputError
from planner.launchers import export_plan, plan_json
from planner.model.spec import Layer
from planner.model.presets import PRESETS
from planner.pipeline.job import simulation_job
from test_export import make_plan

VALIDATOR = jsonschema.Draft202012Validator(plan_json.schema())


def exported(plan, tmp_path) -> dict:
    """plan.json as a user gets it: written by the exporter, read back from disk."""
    export_plan(plan, ["json"], tmp_path, force=True)
    return json.loads((tmp_path / "plan.json").read_text())


def test_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(plan_json.schema())


def test_the_schemas_schedules_and_recompute_modes_are_the_registrys():
    """The schema's enums are the planner's own lists, so a new schedule (dualpipe was missing)
    cannot be planned and exported yet refused by the schema that describes the export."""
    from planner.core.parallel import RECOMPUTE_MODES
    from planner.core.schedules import SCHEDULES
    parallel = plan_json.schema()["properties"]["parallel"]["properties"]
    assert tuple(parallel["schedule"]["enum"]) == SCHEDULES
    assert tuple(parallel["recompute"]["enum"]) == RECOMPUTE_MODES


VARIANTS = [
    dict(),
    dict(schedule="gpipe", zero=0),
    dict(schedule="zb-h1", zero=2),
    dict(bounds=(0, 5, 9, 13, 17, 21, 25, 29, 34), schedule="interleaved", virtual_stages=2),
    dict(bounds=(0, 9, 17, 25, 34), zero=3, recompute="selective"),
    dict(bounds=(0, 34), pp=1, dp=8, tp=2),
]


@pytest.mark.parametrize("change", VARIANTS)
def test_exported_plans_validate(tmp_path, change):
    doc = exported(make_plan(**change), tmp_path)
    VALIDATOR.validate(doc)
    assert doc["schema"] == "plan3d/plan/v2"
    # and plan simulate's strict reading takes every variant as exported
    assert simulation_job(None, None, None, None, None, None, tmp_path / "plan.json")


def test_gpt_and_nonstandard_models_validate(tmp_path):
    gpt = replace(make_plan(), model=PRESETS["gpt3-175b"])  # learned positions, tied, biases
    gpt = replace(gpt, stages=tuple(replace(s, first=b, last=e) for s, (b, e) in
                                    zip(gpt.stages, [(0, 25), (25, 49), (49, 73), (73, 98)])))
    doc = exported(gpt, tmp_path)
    VALIDATOR.validate(doc)
    assert doc["layers"][0]["modules"] == ["tok_embeddings", "pos_embeddings"]
    assert doc["model"]["position_embedding"] == "learned"
    assert doc["engines"]["torchtitan"]["supported"] is False  # no torchtitan flavor
    base = make_plan()
    layers = base.model.layers[:-1] + (Layer(kind="linear", hidden_size=4096, out_features=10),)
    odd = replace(base, model=replace(base.model, layers=layers))
    doc = exported(odd, tmp_path)
    VALIDATOR.validate(doc)
    assert doc["layers"][-1]["modules"] == ["linear.0"]
    assert doc["layers"][-1]["overrides"] == {"bias": True, "out_features": 10}
    assert doc["engines"]["megatron"]["supported"] is False


def test_solver_plan_validates(tmp_path):
    result = CliRunner().invoke(app, ["solve", "--gpus", "8", "--nodes", "1", "--model",
                                      "llama2-7b", "--tp", "2", "--pp", "4",
                                      "--micro-batch", "1", "--export", "json",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "plan.json").read_text())
    VALIDATOR.validate(doc)
    assert any(s["fwd_s"] > 0 and s["bwd_input_s"] > 0 and s["bwd_weight_s"] > 0
               for s in doc["stages"])


def test_schema_rejects_v1_stage_ranges(tmp_path):
    doc = exported(make_plan(), tmp_path)
    doc["stages"][0]["layers"] = [0, 8]  # v1's [first, last] pair
    with pytest.raises(jsonschema.ValidationError):
        VALIDATOR.validate(doc)
    doc = exported(make_plan(), tmp_path)
    del doc["engines"]["deepspeed"]
    with pytest.raises(jsonschema.ValidationError):
        VALIDATOR.validate(doc)


def test_stack_block_kept(tmp_path):
    """The plan's ``stack`` block (the stack it was priced on) stays in v2."""
    from planner.stack import load_stack

    plan = replace(make_plan(), stack=load_stack("megatron-core"))
    doc = exported(plan, tmp_path)
    VALIDATOR.validate(doc)
    assert doc["stack"] == plan.to_dict()["stack"] and doc["stack"] is not None
    assert doc["precision"]["dtype"] == {"bf16": "bfloat16", "fp16": "float16"}[
        plan.stack.param_dtype]
    assert doc["precision"]["gradients"] == {"bf16": "bfloat16", "fp32": "float32"}[
        plan.stack.grad_dtype]


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(1, 33), min_size=3, max_size=3, unique=True),
       fwd=st.floats(1e-4, 1.0), share=st.floats(0.0, 1.0))
def test_document_invariants(cuts, fwd, share):
    bounds = (0, *sorted(cuts), 34)
    base = make_plan(bounds=bounds)
    plan = replace(base, stages=tuple(replace(s, fwd_s=fwd, bwd_s=2 * fwd,
                                              wgrad_s=2 * fwd * share) for s in base.stages))
    doc = plan_json.document(plan)
    VALIDATOR.validate(json.loads(json.dumps(doc)))
    stages = doc["stages"]
    # half-open, contiguous, covering every layer; modules in order, each layer's once
    assert [s["layers"]["start"] for s in stages] == list(bounds[:-1])
    assert [s["layers"]["stop"] for s in stages] == list(bounds[1:])
    assert [m for s in stages for m in s["modules"]] == \
        [m for layer in doc["layers"] for m in layer["modules"]]
    assert [s["holds_loss"] for s in stages] == [False, False, False, True]
    assert doc["loss_stage"] == 3
    for s in stages:
        assert s["bwd_input_s"] + s["bwd_weight_s"] == pytest.approx(2 * fwd, rel=1e-5)
        assert s["bwd_weight_s"] == pytest.approx(2 * fwd * share, rel=1e-5, abs=1e-12)
    engines = doc["engines"]
    assert engines["deepspeed"]["supported"] is False  # tp = 2: DeepSpeed runs no TP
    untp = replace(plan, parallel=replace(plan.parallel, tp=1, dp=4, sequence_parallel=False))
    assert plan_json.document(untp)["engines"]["deepspeed"]["parts"] == list(bounds)
    titan = plan_json.document(replace(plan, parallel=replace(plan.parallel, zero=2)))
    assert titan["engines"]["torchtitan"]["module_fqns_per_model_part"] == \
        [s["modules"] for s in stages]  # torchtitan 0.2.2's Llama names its head "output"


def test_simulate_reads_v1_and_v2_alike(tmp_path):
    base = make_plan()
    plan = replace(base, stages=tuple(replace(s, fwd_s=0.01 * (i + 1), bwd_s=0.03 * (i + 1),
                                              wgrad_s=0.01 * (i + 1), send_s=0.001)
                                      for i, s in enumerate(base.stages)))
    v2 = tmp_path / "v2.json"
    v2.write_text(json.dumps(plan_json.document(plan)))
    v1 = tmp_path / "v1.json"
    v1.write_text(json.dumps(plan.to_dict()))
    assert plan.to_dict()["schema"] == "plan3d/plan/v1"
    job1 = simulation_job(None, None, None, None, None, None, v1)
    job2 = simulation_job(None, None, None, None, None, None, v2)
    assert job1.bwd_s == pytest.approx(job2.bwd_s) and job1.wgrad_s == job2.wgrad_s
    assert job1 == replace(job2, bwd_s=job1.bwd_s)


def test_simulate_refuses_other_versions(tmp_path):
    doc = plan_json.document(make_plan())
    path = tmp_path / "v9.json"
    path.write_text(json.dumps({**doc, "schema": "plan3d/plan/v9"}))
    with pytest.raises(PlanInputError, match="plan3d/plan/v9"):
        simulation_job(None, None, None, None, None, None, path)
    result = CliRunner().invoke(app, ["simulate", "--plan", str(path)])
    assert result.exit_code == 2 and "plan3d/plan/v9" in result.output


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(bogus=1), "unknown field 'bogus'"),
    (lambda d: d.update(stagse=1), "did you mean 'stages'"),
    (lambda d: d["model"].update(name="x\n\x1b[31m"), "control or invisible character"),
    (lambda d: d["stages"][1].update(stage=0), "numbered 0, 1, ... in order"),
    (lambda d: d["stages"][0].update(layers={"start": 5, "stop": 2}), "at least one"),
])
def test_simulate_refuses_an_edited_plan_in_one_line(tmp_path, edit, message):
    """plan simulate --plan reads a v2 plan.json strictly (core/plan_schema.py): a key v2 does not
    write, a name with control characters, stages renumbered, an empty layer range. The file is
    read on its own (outside its export set, so the manifest check does not catch it first)."""
    doc = exported(make_plan(), tmp_path)
    assert simulation_job(None, None, None, None, None, None, _saved(tmp_path, doc))
    edit(doc)
    with pytest.raises(PlanInputError, match=message):
        simulation_job(None, None, None, None, None, None, _saved(tmp_path, doc))


def _saved(tmp_path, doc):
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_predicted_plan_carries_its_memory_by_part_per_rank(tmp_path):
    """A plan predicted by the model (not built by hand) writes each pipeline rank's peak by
    part; the parts sum to the rank's total (to the byte rounding of each part), the largest
    total is the plan's peak, the document validates and `plan simulate --plan` still reads it."""
    from planner.predict.step import evaluate
    plan = make_plan()
    predicted = evaluate(plan.model, plan.cluster,
                         plan.parallel, bounds=[(s.first, s.last) for s in plan.stages])
    doc = exported(predicted, tmp_path)
    VALIDATOR.validate(doc)
    ranks = doc["memory"]["ranks"]
    assert [r["rank"] for r in ranks] == list(range(plan.parallel.pp))
    for r in ranks:
        assert abs(sum(r["parts"].values()) - r["total_bytes"]) <= len(r["parts"])
        assert r["parts"]["weights"] > 0 and r["parts"]["activations"] > 0
    assert max(r["total_bytes"] for r in ranks) == doc["metrics"]["peak_memory_bytes"]
    assert simulation_job(None, None, None, None, None, None, tmp_path / "plan.json")
    assert "memory" not in exported(plan, tmp_path)  # a plan built without its parts: none
