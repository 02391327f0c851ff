"""model.json as documented: `plan models show`, docs/model-files.md's field table and the loader agree."""

import json
from dataclasses import fields
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from planner.model.spec import ModelSpec
from planner.model.load import model_from_dict
from planner.model.presets import PRESETS
from planner.model.template import FIELDS, fields_markdown, model_template

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = Path(__file__).parent / "hf_configs"
runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


def test_the_documented_fields_are_the_spec_fields():
    assert {f.name for f in FIELDS} == {f.name for f in fields(ModelSpec)}


def test_readme_model_table_is_current():
    text = (ROOT / "docs" / "model-files.md").read_text()
    block = text.split("<!-- model-fields:start -->\n", 1)[1].split("<!-- model-fields:end -->")[0]
    assert block == fields_markdown(), "docs/model-files.md's model.json table is stale: paste fields_markdown()"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_round_trips_through_its_template(name):
    doc = json.loads(run("models", "show", name, "--json").output)
    spec = model_from_dict(doc, "template")
    assert spec == PRESETS[name] and spec.params == PRESETS[name].params


def test_an_hf_config_becomes_an_equivalent_model_json():
    result = run("models", "show", str(CONFIGS / "qwen3-0.6b.json"), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["head_dim"] == 128 and doc["qk_norm"] == "head" and doc["tie_embeddings"]
    assert doc["rope_theta"] == 1000000 and doc["max_position_embeddings"] == 40960
    assert model_from_dict(doc, "converted").params == 596_049_920


def test_an_explicit_layer_model_keeps_its_layers():
    custom = model_from_dict({"name": "custom", "hidden_size": 64, "num_attention_heads": 4,
                              "vocab_size": 100, "seq_length": 32,
                              "layers": [{"kind": "embedding"}, {"kind": "block", "repeat": 3},
                                         {"kind": "linear", "out_features": 10}]})
    doc = json.loads(json.dumps(model_template(custom)))
    assert "num_layers" not in doc and len(doc["layers"]) == 5
    again = model_from_dict(doc, "again")
    assert again.layers == custom.layers and again.params == custom.params


def test_show_prints_every_field_with_its_meaning():
    result = run("models", "show", "gpt3-175b")
    assert result.exit_code == 0, result.output
    for f in FIELDS[:-1]:  # layers only for explicit layer models
        assert f.name in result.output
    assert "--json > model.json" in result.output
    assert run("models").exit_code == 0 and "llama3-405b" in run("models").output


def test_show_refuses_an_unknown_model_in_one_line():
    result = run("models", "show", "gpt-17")
    assert result.exit_code == 2 and "plan models" in result.output
    assert "Traceback" not in result.output


def test_solve_says_when_the_planned_length_is_not_the_declared_context():
    result = run("partition", "--model", str(CONFIGS / "llama-3.1-8b.json"), "--pp", "4",
                 "--json")
    assert result.exit_code == 0, result.output
    assert "declares 131072 positions; planning 8192-token sequences" in result.output


def test_a_sliding_window_shorter_than_the_sequence_is_refused_by_the_cli():
    gemma = str(CONFIGS / "gemma-2-9b.json")
    result = run("partition", "--model", gemma, "--pp", "2")
    assert result.exit_code == 2 and "sliding-window attention" in result.output
    assert "--seq-len 4096" in result.output
    assert run("partition", "--model", gemma, "--pp", "4", "--seq-len", "4096",
               "--json").exit_code == 0
