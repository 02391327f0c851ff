"""The Python API under wrong types (issue #31 item 4): whatever a caller passes, the answer is a
result, PlanInputError (bad input) or NoFeasiblePlan (nothing fits) -- never a TypeError,
AttributeError, ZeroDivisionError or OverflowError, and never a plan of something else
(``flash='no'`` planned flash, ``gpus=True`` planned 1 GPU, ``validate(file={})`` validated the
bundled runs)."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import api
from planner.core.errors import NoFeasiblePlan, PlanInputError
from planner.hardware.profiles import Hardware
from planner.model.spec import ModelSpec

# a small plan that solves in milliseconds: every dimension pinned, one configuration refined
SOLVE = dict(gpus=2, nodes=1, model="megatron-1.7b", tp=1, pp=2, micro_batch=1, schedule="1f1b",
             recompute="full", zero=1, refine=1, top=1)
EXPLAIN = {k: v for k, v in SOLVE.items() if k not in ("refine", "top")}
PARTITION = dict(model="megatron-1.7b", pp=2, tp=1, dp=1, micro_batch=1, microbatches=4,
                 solver="dp")

SOLVE_ARGS = [*SOLVE, "hardware", "gpu", "global_batch", "global_batch_range", "seq_len",
              "max_bubble", "launcher", "partition", "profile", "stack", "flash", "overlap",
              "tp_overlap", "grad_dtype", "precision", "dp", "virtual_stages",
              "sequence_parallel", "cp", "ep", "etp", "power_limit", "expert_load", "progress"]
EXPLAIN_ARGS = [a for a in SOLVE_ARGS if a not in ("refine", "top", "global_batch_range",
                                                   "max_bubble", "partition", "profile",
                                                   "progress")]
PARTITION_ARGS = [*PARTITION, "schedule", "virtual_stages", "recompute", "zero", "gpu",
                  "hardware", "nodes", "seq_len", "stack", "flash", "overlap", "tp_overlap",
                  "grad_dtype", "precision"]

# values of the wrong kind, or of the right kind at its edges
HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([2**31, 2**64, 10**20]),
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, 1e-300, 0.0, 2.0]),
    st.text(max_size=4), st.sampled_from(["16", "2", "no", "yes", "auto", "", "a100", "h100"]),
    st.lists(st.integers(-1, 4), max_size=3), st.dictionaries(st.text(max_size=2), st.integers(),
                                                               max_size=2),
    st.just(object()), st.just(b"16"), st.just(()),
)

FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])


def _call(function, base: dict, changes: dict):
    try:
        return function(**{**base, **changes})
    except (PlanInputError, NoFeasiblePlan):
        return None


def _changes(names):
    return st.dictionaries(st.sampled_from(names), HOSTILE, min_size=1, max_size=2)


@FUZZ
@given(_changes(SOLVE_ARGS))
def test_solve_answers_or_refuses(changes):
    result = _call(api.solve, SOLVE, changes)
    assert result is None or isinstance(result, api.Solution)


@FUZZ
@given(_changes(EXPLAIN_ARGS))
def test_explain_answers_or_refuses(changes):
    result = _call(api.explain, EXPLAIN, changes)
    assert result is None or isinstance(result, api.Explanation)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(_changes(PARTITION_ARGS))
def test_partition_answers_or_refuses(changes):
    result = _call(api.partition, PARTITION, changes)
    assert result is None or isinstance(result, api.Partition)


@pytest.mark.parametrize("changes,words", [
    (dict(gpus="16"), "gpus must be a whole number"),
    (dict(tp="2"), "tp must be a whole number"),
    (dict(hardware=123), "hardware must be"),
    (dict(flash="no"), "flash must be True or False"),
    (dict(gpus=True), "gpus must be a whole number"),
    (dict(power_limit=math.nan), "power_limit must be a finite number"),
    (dict(power_limit=math.inf), "power_limit must be a finite number"),
    (dict(expert_load="2"), "expert_load must be a number"),
    (dict(sequence_parallel=1), "sequence_parallel must be True or False"),
    (dict(model=7), "model must be"),
    (dict(gpu="a100", hardware="x.json"), "not both"),
])
def test_the_examples_of_the_issue_are_refused_in_one_line(changes, words):
    with pytest.raises(PlanInputError, match=words):
        api.solve(**{**SOLVE, **changes})


@pytest.mark.parametrize("file", [{}, [], (), 5, [5]])
def test_validate_refuses_a_file_that_is_not_a_path(file):
    """{} is falsy: it validated the bundled runs without a word."""
    with pytest.raises(PlanInputError, match="file must be a runs-file path"):
        api.validate(file=file)


@pytest.mark.parametrize("changes,words", [
    (dict(budget_s=math.inf), "budget_s must be a finite number"),
    (dict(budget_s=1e308 * 10), "budget_s must be a finite number"),
    (dict(tp="1"), "tp must be a whole number"), (dict(repeats=2.0), "repeats must be"),
    (dict(device=None), "device is required"),
])
def test_profile_refuses_wrong_types_before_measuring(changes, words):
    with pytest.raises(PlanInputError, match=words):
        api.profile("megatron-1.7b", **changes)


def test_power_limit_and_expert_load_reach_the_api():
    """The two options only the CLI had (issue #28 item 4) now change the plan through the API."""
    full = api.solve(**{**SOLVE, "gpu": "h100"}).best.metrics.step_time_s
    capped = api.solve(**{**SOLVE, "gpu": "h100", "power_limit": 400}).best.metrics.step_time_s
    assert capped > full


# --- the types the API takes: a ModelSpec or a Hardware built by the caller ---------------------

MODEL_FIELDS = [f.name for f in dataclasses.fields(ModelSpec)]
HARDWARE_FIELDS = [f.name for f in dataclasses.fields(Hardware)]


def _built(cls_base, changes: dict):
    """``replace(base, **changes)``: the object, or None where its constructor refused it in
    one PlanInputError line (anything else propagates and fails the test)."""
    try:
        return dataclasses.replace(cls_base, **changes)
    except PlanInputError as e:
        assert "\n" not in str(e)
        return None


@FUZZ
@given(_changes(MODEL_FIELDS))
def test_a_model_spec_of_wrong_types_is_refused_by_its_constructor(changes):
    spec = _built(api.model("megatron-1.7b"), changes)
    if spec is not None:  # what it took plans, or is refused, through the API
        result = _call(api.explain, {**EXPLAIN, "model": spec}, {})
        assert result is None or isinstance(result, api.Explanation)


@FUZZ
@given(_changes(HARDWARE_FIELDS))
def test_a_hardware_of_wrong_types_is_refused_by_its_constructor(changes):
    hw = _built(api.hardware("a100"), changes)
    if hw is not None:
        result = _call(api.explain, {**EXPLAIN, "hardware": hw}, {})
        assert result is None or isinstance(result, api.Explanation)


@pytest.mark.parametrize("field, value, words", [
    ("hidden_size", "2048", "'hidden_size' must be a whole number, got '2048'"),
    ("num_layers", True, "'num_layers' must be a whole number, got True"),
    ("num_layers", 10**6, "'num_layers' must be positive, at most 1024"),
    ("seq_length", 2048.0, "'seq_length' must be a whole number (no decimal point)"),
    ("bias", "no", "'bias' must be true or false, got 'no'"),
    ("tie_embeddings", 1, "'tie_embeddings' must be true or false, got 1"),
    ("mlp", "relu", "'mlp' must be one of gelu, swiglu, got 'relu'"),
    ("norm", "batchnorm", "'norm' must be one of layernorm, rmsnorm"),
    ("qk_norm", None, "'qk_norm' must be one of '' (none), head, full, got None"),
    ("rope_theta", math.nan, "'rope_theta' must be a finite number"),
    ("router_aux_loss", 1.0, "'router_aux_loss' must be below 1"),
    ("dense_layers", [0], "'dense_layers' must be a tuple of block indices"),
    ("layers", [1], "'layers' must be a tuple of Layer"),
    ("name", 5, "model: 'name' must be a string"),
    # what no field says alone is the constructor's too (model/consistency.py), not the loader's
    ("num_kv_heads", 5, "is not a multiple of num_kv_heads 5"),
    ("moe_top_k", 2, "moe_top_k, moe_ffn_hidden_size, dense_layers, shared experts and "
                     "router_bias need num_experts > 0"),
])
def test_each_model_field_is_named_with_what_it_takes(field, value, words):
    with pytest.raises(PlanInputError, match=re.escape(words)):
        dataclasses.replace(api.model("megatron-1.7b"), **{field: value})


def test_a_layer_checks_its_fields_too():
    from planner.model.spec import Layer
    with pytest.raises(PlanInputError, match=re.escape("a block layer: 'mlp' must be one of")):
        Layer(kind="block", hidden_size=64, num_attention_heads=4, num_kv_heads=4,
              ffn_hidden_size=256, mlp="relu")
    with pytest.raises(PlanInputError, match="a layer: 'kind' must be one of embedding, block"):
        Layer(kind="conv", hidden_size=64)
