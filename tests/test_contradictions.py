"""Contradictions refused (issue #31 item 5): a `plan solve` flag that would be ignored, or a stack
and launcher whose plans cannot be exported, is refused before the search: exit 2, one line on
stderr naming the flags and what to do, no traceback, nothing written. planner.api refuses the
same inputs with the same line.

The search and explain functions are replaced by ones that fail, so a case that reached them
fails here: "before the search" is tested, not assumed.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

import planner
from cli import app
from planner import api
from planner.launchers import LAUNCHERS, runs_on_stack, stack_refusal
from planner.launchers import stack_problems
from planner.stack import LAUNCHER_STACKS, bundled_stacks, load_stack

runner = CliRunner()
BASE = ["solve", "--gpus", "16", "--nodes", "2"]


@pytest.fixture
def no_search(monkeypatch):
    """The CLI's and the API's search and explain, failing if called."""
    def reached(*args, **kwargs):
        raise AssertionError("the search ran before the contradiction was refused")

    for name in ("planner.api.solving.search", "planner.api.solving._explain"):
        monkeypatch.setattr(name, reached)


def refused(args, *flags) -> str:
    """Run `plan solve ARGS`; assert a clean one-line refusal naming every flag in ``flags``."""
    result = runner.invoke(app, [*BASE, *(str(a) for a in args)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for flag in flags:
        assert flag in lines[0], (flag, lines[0])
    return lines[0]


# --- 1. --explain prices one pinned plan: it writes nothing ---------------------------------------

@pytest.mark.parametrize("extra, named", [
    (["--export", "json", "--out", "{d}"], ["--export", "--out"]),
    (["--export", "megatron,torchrun", "--out", "{d}", "--force"], ["--export", "--out"]),
    (["--csv", "{d}/plans.csv"], ["--csv"]),
])
def test_explain_with_an_output_file_is_refused(tmp_path, no_search, extra, named):
    out = tmp_path / "run"
    line = refused(["--explain", "--tp", "2", "--pp", "2",
                    *(a.format(d=out) for a in extra)], "--explain", *named)
    assert "drop --explain" in line
    assert not out.exists()


def test_explain_with_max_bubble_is_refused(no_search):
    line = refused(["--explain", "--tp", "2", "--pp", "2", "--max-bubble", "0.1"],
                   "--explain", "--max-bubble")
    assert "drop --max-bubble" in line


def test_explain_still_takes_the_search_flags_it_ignores_harmlessly():
    """A search's command line with pins and --explain added still runs (--top, --refine)."""
    result = runner.invoke(app, [*BASE, "--tp", "2", "--pp", "2", "--explain", "--top", "3",
                                 "--refine", "2", "--json"])
    assert result.exit_code == 0, result.output
    assert "fits" in json.loads(result.stdout)


# --- 2. --out and --force need something to write --------------------------------------------------

def test_out_without_export_is_refused(tmp_path, no_search):
    out = tmp_path / "run"
    line = refused(["--out", out], "--out", "--export")
    assert "add --export" in line
    assert not out.exists()


def test_export_without_out_is_still_refused(no_search):
    refused(["--export", "json"], "--export", "--out")


def test_force_with_nothing_to_overwrite_is_refused(no_search):
    refused(["--force"], "--force", "--export", "--csv")


def test_wide_with_json_is_refused(no_search):
    refused(["--json", "--wide"], "--wide", "--json")


# --- 3. a stack another launcher runs ---------------------------------------------------------------

def test_a_stack_another_launcher_runs_is_refused_before_the_search(no_search):
    line = refused(["--stack", "torchtitan", "--launcher", "megatron"],
                   "--stack torchtitan", "--launcher megatron")
    assert "drop --stack" in line and "megatron-core" in line


def test_an_export_implying_another_launcher_is_refused_before_the_search(tmp_path, no_search):
    out = tmp_path / "run"
    refused(["--stack", "torchtitan", "--export", "megatron", "--out", out],
            "--stack torchtitan", "--export megatron")
    assert not out.exists()


def test_a_stack_file_naming_no_launcher_is_told_how_to_name_one(tmp_path, no_search):
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"base": "megatron-core", "name": "mine", "version": "1",
                                "description": "ours", "launcher": None}))
    line = refused(["--stack", mine, "--launcher", "megatron"], "--launcher megatron")
    assert '"launcher": "megatron"' in line


def test_an_unknown_launcher_is_named_as_a_launcher(no_search):
    line = refused(["--launcher", "slurm"], "--launcher")
    assert "export target" not in line and "megatron, deepspeed, torchtitan" in line


def test_the_refusal_is_a_json_error_with_json(no_search):
    result = runner.invoke(app, [*BASE, "--stack", "deepspeed", "--launcher", "torchtitan",
                                 "--json"])
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc["plans"] == [] and "--stack deepspeed" in doc["error"]["message"]


@pytest.mark.parametrize("kwargs, words", [
    (dict(stack="torchtitan", launcher="megatron"), "--stack torchtitan"),
    (dict(stack=load_stack("deepspeed"), launcher="torchtitan"), "--stack deepspeed"),
    (dict(launcher="slurm"), "--launcher must be one of"),
    (dict(expert_load=1.5), "--expert-load"),
])
@pytest.mark.parametrize("front", [api.solve, api.explain])
def test_the_api_refuses_the_same_before_the_search(no_search, front, kwargs, words):
    with pytest.raises(planner.PlanInputError, match=words):
        front(16, 2, tp=2, **kwargs)


def test_the_api_and_the_cli_say_the_same_line(no_search):
    line = refused(["--stack", "torchtitan", "--launcher", "megatron"])
    with pytest.raises(planner.PlanInputError) as raised:
        api.solve(16, 2, stack="torchtitan", launcher="megatron")
    assert line == f"error: {raised.value}"


def test_one_rule_decides_the_search_and_the_export():
    """What is refused before the search is exactly what the export would refuse after it."""
    for stack in bundled_stacks().values():
        for launcher in LAUNCHERS:
            before = stack_refusal(stack, launcher)
            after = stack_problems(SimpleNamespace(stack=stack), launcher)
            assert (before is None) == (not after) == runs_on_stack(stack, launcher)
        assert stack_refusal(stack, None) is None  # json and torchrun go with any stack
    for launcher, name in LAUNCHER_STACKS.items():
        assert stack_refusal(load_stack(name), launcher) is None


def test_a_matching_stack_and_launcher_still_plan():
    result = runner.invoke(app, [*BASE, "--stack", "megatron-2021", "--launcher", "megatron",
                                 "--top", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plans"][0]["stack"]["name"] == "megatron-2021"


# --- 4. other flags that would be ignored -----------------------------------------------------------

def test_expert_load_on_a_dense_model_is_refused(no_search):
    line = refused(["--expert-load", "1.5"], "--expert-load")
    assert "dense" in line and "drop it" in line
