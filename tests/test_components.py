"""Named components (planner/stack/components.py, profiles/components/): what a run ran over a
bundled stack, as a reviewable set of sourced fields instead of per-case overrides (issue #28)."""

from __future__ import annotations

import json

import pytest

from planner.core.errors import PlanInputError
from planner.fidelity.case_stack import case_stack
from planner.fidelity.cases import DEFAULT_FILES, load_cases
from planner.stack import (bundled_components, load_component, load_stack, stack_from_dict,
                           with_components, with_overrides)
from planner.stack import components as components_module
from planner.stack.components import component_from_dict

CASES = [case for path in DEFAULT_FILES for case in load_cases(path)]
# A case's own overrides are launch flags of its source, a handful at most (issue #28's "at
# most a handful of overrides, each a documented launch flag of its source").
MAX_CASE_OVERRIDES = 4


def _mentioned(case: dict, field: str) -> bool:
    """Whether the case's provenance says where its override of ``field`` comes from."""
    provenance = case.get("provenance") or {}
    keys = [key for part in ("stack", "derived", "assumed")
            for key in (provenance.get(part) or {})]
    return any(field in key for key in keys)


def test_every_component_sources_every_field_and_changes_its_stacks():
    """A component that sets nothing a stack does not already have would hide no difference
    worth naming: each changes at least one field of every stack it runs over."""
    components = bundled_components()
    assert len(components) >= 6
    for name, component in components.items():
        assert dict(component.sources).keys() == dict(component.fields).keys(), name
        assert all(text.strip() for _, text in component.sources), name
        for stack_name in component.over:
            stack = load_stack(stack_name)
            assert any(getattr(stack, key) != value for key, value in component.fields), name


def test_cases_name_components_and_keep_only_a_handful_of_quoted_flags():
    named = {name for case in CASES for name in case.get("components", [])}
    assert named == set(bundled_components())  # every bundled component is some source's
    for case in CASES:
        overrides = case.get("stack_overrides") or {}
        assert len(overrides) <= MAX_CASE_OVERRIDES, case["name"]
        for field in overrides:
            assert _mentioned(case, field), f"{case['name']}: override {field} has no source"
    with_overrides_count = sum(bool(case.get("stack_overrides")) for case in CASES)
    assert with_overrides_count <= 28  # 59 of 82 before components


def test_a_case_stack_is_its_stack_running_its_components():
    case = next(c for c in CASES if c["name"] == "llmfoundry-mpt7b-h100_80gb-8gpu-seq2048")
    stack = case_stack(case)
    assert stack.components == ("llm-foundry 061f2c7",)
    assert stack.attention_kernel == "flash_triton" and stack.fused_cross_entropy
    assert stack.label() == "torchtitan 0.2.2 + llm-foundry 061f2c7"
    assert not stack.overrides  # the component's fields are not overrides
    assert dict(stack.sources)["attention_kernel"].startswith("llm-foundry 061f2c7: ")
    assert stack.to_dict()["components"] == ["llm-foundry 061f2c7"]
    assert "components" not in load_stack("torchtitan").to_dict()  # plan.json unchanged


def test_an_override_on_top_of_a_component_is_recorded_as_one():
    stack = with_components(load_stack("torchtitan"), ["llm-foundry"], "test")
    flagged = with_overrides(stack, "test", grad_reduce_dtype="bf16")
    assert flagged.label() == "torchtitan 0.2.2 + llm-foundry 061f2c7 with grad_reduce_dtype=bf16"


def test_a_user_stack_file_names_a_base_and_components():
    """A new framework's stack: its base, the components it runs, and only what else differs."""
    stack = stack_from_dict({"base": "torchtitan", "name": "my-pp", "version": "1",
                             "description": "torchtitan on torch 2.6",
                             "components": ["torch-pipelining-2.6"],
                             "fp8_all_gather": True}, "my.json")
    assert stack.name == "my-pp" and stack.pipeline_timesteps and stack.zero3_reduce_chain
    assert stack.fp8_all_gather and stack.components == ("torch-pipelining-2.6 2.6.0",)


@pytest.mark.parametrize("data, message", [
    ({"components": ["llm-foundry"], "attention_kernel": "flash2"},
     "'attention_kernel' is set both by the file and by component llm-foundry; drop one"),
    ({"components": ["llm-fondry"]}, "did you mean 'llm-foundry'"),
    ({"components": ["bigscience-tr11"]}, "runs over deepspeed, not the torchtitan stack"),
    ({"components": "llm-foundry"}, "'components' must be a list of component names"),
    ({"components": ["llm-foundry", "llm-foundry"]}, "names one component twice"),
])
def test_a_stack_file_with_bad_components_is_one_line(data, message):
    doc = {"base": "torchtitan", "name": "x", "version": "1", "description": "d", **data}
    with pytest.raises(PlanInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        stack_from_dict(doc, "my.json")


def test_components_need_a_base_to_run_over():
    with pytest.raises(PlanInputError, match="names the bundled stack they run over as"):
        stack_from_dict({"name": "x", "components": ["llm-foundry"]}, "my.json")


def test_two_components_that_disagree_are_refused(monkeypatch):
    real = components_module.load_component
    other = component_from_dict({
        "name": "other", "version": "1", "description": "d", "over": ["torchtitan"],
        "fields": {"attention_kernel": "flash2"}, "sources": {"attention_kernel": "here"}},
        "other.json")
    monkeypatch.setattr(components_module, "load_component",
                        lambda name: other if name == "other" else real(name))
    with pytest.raises(PlanInputError, match="components llm-foundry and other both set "
                                             "'attention_kernel'"):
        with_components(load_stack("torchtitan"), ["llm-foundry", "other"], "test")


@pytest.mark.parametrize("change, message", [
    (lambda d: d["sources"].pop("attention_kernel"), "sources has no entry for 'attention_kernel'"),
    (lambda d: d.update(fields={"attention_kernal": "flash2"}, sources={}),
     "did you mean 'attention_kernel'"),
    (lambda d: d["fields"].update(attention_kernel="bogus"), "must be one of flash2"),
    (lambda d: d.update(colour="red"), "unknown key 'colour'"),
    (lambda d: d.pop("over"), "missing 'over'"),
    (lambda d: d["sources"].update(zero3_prefetch="x"), "which 'fields' does not set"),
])
def test_a_bad_component_file_is_one_line(change, message):
    data = json.loads(json.dumps({
        "name": "c", "version": "1", "description": "d", "over": ["torchtitan"],
        "fields": {"attention_kernel": "flash2"}, "sources": {"attention_kernel": "here"}}))
    change(data)
    with pytest.raises(PlanInputError, match=message):
        component_from_dict(data, "c.json")


def test_an_unknown_component_lists_the_known_ones():
    with pytest.raises(PlanInputError, match="the components are automodel-te-deepep, "):
        load_component("nothing-like-it")


def test_plan_stacks_lists_the_components():
    from typer.testing import CliRunner

    from cli import app
    runner = CliRunner()
    table = runner.invoke(app, ["stacks", "--components"])
    assert table.exit_code == 0 and "torch-pipelining-2.6" in table.output
    doc = json.loads(runner.invoke(app, ["stacks", "--components", "--json"]).output)
    assert doc["llm-foundry"]["fields"] == {"attention_kernel": "flash_triton",
                                            "fused_cross_entropy": True}
    assert set(doc["llm-foundry"]["sources"]) == set(doc["llm-foundry"]["fields"])
    assert "plan stacks --components" in runner.invoke(app, ["stacks"]).output
