"""The helpers behind the hostile-input guarantees (issue #12), property-tested: quoting round
trips in each format, divisors equal the brute-force ones, schemas cover the dataclasses they
guard, JSON reading refuses what it must."""

from __future__ import annotations

import ast
import json
import shlex
import tomllib
from dataclasses import fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.divisors import divisors, prime_factors
from planner.core.errors import PlanInputError
from planner.core.jsonfile import nesting_depth, parse_json
from planner.core.schema import Int, Num, OneOf, check_object, suggestion
from planner.core.text import check_name, for_rich, visible
from planner.hardware.profiles import Hardware
from planner.hardware.schema import HARDWARE_JSON
from planner.launchers.quoting import comment, py_str, sh_token, sh_word, toml_list, toml_str
from planner.model.schema import HF_CONFIG, LAYER_ENTRY, MODEL_JSON
from planner.model.spec import Layer, ModelSpec
from planner.report.output import error_document, finite, json_text

# any text a JSON string can hold, lone surrogates excepted (UTF-8 files cannot hold them)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@given(TEXT)
def test_toml_strings_parse_back_to_the_same_text(text):
    assert tomllib.loads(f"k = {toml_str(text)}\nl = {toml_list([text, 'x'])}\n") == {
        "k": text, "l": [text, "x"]}


@given(TEXT)
def test_python_literals_evaluate_to_the_same_text(text):
    assert ast.literal_eval(py_str(text)) == text


@given(TEXT)
def test_shell_words_split_back_to_the_same_text(text):
    assert shlex.split(sh_word(text)) == [text]


@given(TEXT)
def test_comments_and_tokens_stay_on_one_printable_line(text):
    for out in (comment(text), visible(text), sh_token(text)):
        assert out.isprintable() and "\n" not in out
    assert "\x1b" not in for_rich(text)


def test_ansi_sequences_are_removed_whole():
    assert visible("\x1b[31mred\x1b[0m") == "red"
    assert visible("\x1b]0;title\x07x") == "x"
    assert visible("a\nb\u2028c\x00") == "a\\x0ab\\u2028c\\x00"


@given(st.integers(1, 5000))
@settings(max_examples=200)
def test_divisors_equal_the_brute_force_ones(n):
    assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


def test_divisors_of_a_huge_count_are_quick():
    assert len(divisors(10**12)) == 169  # (12 + 1)^2: 2^12 x 5^12
    assert prime_factors(999_999_999_989) == {999_999_999_989: 1}  # a prime near 10^12


def test_every_dataclass_field_has_a_schema_entry():
    """A field added to ModelSpec, Layer or Hardware without a schema entry would be refused as
    unknown in every file; this test names it instead."""
    assert {f.name for f in fields(ModelSpec)} <= set(MODEL_JSON)
    # a head's MTP modules come from the model's mtp_layers, never from a layer entry
    assert {f.name for f in fields(Layer)} - {"mtp_depth", "mtp_block"} <= set(LAYER_ENTRY)
    assert {f.name for f in fields(Hardware)} <= set(HARDWARE_JSON)
    assert {"num_hidden_layers", "hidden_size", "vocab_size"} <= set(HF_CONFIG)


@pytest.mark.parametrize("value, field, message", [
    (True, Int(1), "whole number"),
    (8.0, Int(1), "no decimal point"),
    (0, Int(1), "positive"),
    (2000, Int(1, 1024), "at most 1024"),
    (float("nan"), Num(0), "finite"),
    (0.0, Num(0, 1, low_open=True), "positive"),
    (1.5, Num(0, 1, low_open=True), "at most 1"),
    ("relu", OneOf("gelu", "swiglu"), "one of gelu, swiglu"),
])
def test_field_checks(value, field, message):
    with pytest.raises(PlanInputError, match=message):
        check_object({"k": value}, {"k": field}, "f.json")


def test_unknown_keys_get_the_closest_suggestion():
    assert suggestion("num_kv_head", MODEL_JSON) == " (did you mean 'num_kv_heads'?)"
    assert suggestion("zzz", MODEL_JSON) == ""


@pytest.mark.parametrize("name", ["a\nb", "a\rb", "\x00", "\u2028", "\x1b[1m", "", " ",
                                  "x" * 300])
def test_names_with_control_characters_or_no_length_limit_are_refused(name):
    with pytest.raises(PlanInputError):
        check_name(name, "model name")


@pytest.mark.parametrize("name", ["llama3-8b", "GPT-3 175B (Brown et al.)", "模型", "[/bold]x",
                                  "$(not run)"])
def test_printable_names_are_accepted(name):
    assert check_name(name, "model name") == name


@pytest.mark.parametrize("text, message", [
    (b"[" * 50 + b"]" * 50, "nested"),
    (b'{"a": NaN}', "NaN"),
    (b'{"a": -Infinity}', "Infinity"),
    (b"[1e999]", r"'\[0\]' is Infinity"),
    (b"\xff", "UTF-8"),
    (b"", "empty"),
    (b'{"zero": 1, "tp": 2, "zero": 3}', "'zero' is given twice"),
    (b'{"a": [{"b": 1, "b": 1}]}', "'b' is given twice"),
])
def test_json_parsing_refuses(text, message):
    with pytest.raises(PlanInputError, match=message):
        parse_json(text, "f.json")


def test_nesting_depth_needs_no_recursion():
    doc = []
    for _ in range(100_000):
        doc = [doc]
    assert nesting_depth(doc) > 32


def test_json_output_never_holds_nan():
    doc = {"a": float("nan"), "b": [float("inf"), 1.5], "c": "x"}
    assert json.loads(json_text(doc)) == {"a": None, "b": [None, 1.5], "c": "x"}
    assert finite(doc)["b"] == [None, 1.5]
    assert error_document("input", "bad\nline", 2)["error"]["message"] == "bad\\x0aline"
