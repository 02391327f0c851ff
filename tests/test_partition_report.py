"""`plan partition` output: what it assumed, node placement, and no printed baseline beating it."""

import json

import pytest
from hypothesis import given, strategies as st
from typer.testing import CliRunner

from cli import app
from planner.report.partition import SPLITS, place_nodes

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.integers(1, 12), dp=st.integers(1, 6),
       gpus_per_node=st.sampled_from([4, 8]))
def test_nodes_hold_whole_tp_groups_within_the_hardware_node(tp, pp, dp, gpus_per_node):
    if tp > gpus_per_node:
        return
    gpus = tp * pp * dp
    nodes, how = place_nodes(gpus, tp, gpus_per_node)
    per = gpus // nodes
    assert nodes * per == gpus and per <= gpus_per_node and per % tp == 0 and how
    if gpus % gpus_per_node == 0:
        assert per == gpus_per_node  # whole nodes whenever the GPUs fill them


def test_twelve_gpus_at_tp4_are_three_nodes_of_four_and_say_so():
    nodes, how = place_nodes(12, 4, 8)
    assert nodes == 3 and "do not fill 8-GPU nodes" in how and "--nodes" in how
    assert place_nodes(12, 4, 8, nodes=2) == (2, "--nodes")


def test_partition_states_its_assumptions():
    result = run("partition", "--model", "llama3-8b", "--tp", "4", "--pp", "3", "--gpu", "h100")
    assert result.exit_code == 0, result.output
    line = " ".join(result.output.split("min-bottleneck split")[0].split())  # unwrapped
    for part in ("tp 4 x pp 3 x dp 1 = 12", "3 nodes of 4", "M = 12 microbatches of 1",
                 "global batch 12 x 8192 tokens", "do not fill 8-GPU nodes"):
        assert part in line, part
    doc = json.loads(run("partition", "--model", "llama3-8b", "--tp", "4", "--pp", "3", "--gpu",
                         "h100", "--json").output)
    a = doc["assumptions"]
    assert (a["nodes"], a["gpus_per_node"], a["dp"], a["num_microbatches"],
            a["global_batch"]) == (3, 4, 1, 12, 12)


def test_partition_nodes_option_is_used():
    doc = json.loads(run("partition", "--model", "llama3-8b", "--tp", "2", "--pp", "4", "--gpu",
                         "h100", "--nodes", "2", "--json").output)
    assert (doc["assumptions"]["nodes"], doc["assumptions"]["placement"]) == (2, "--nodes")


@pytest.mark.parametrize("args", [
    ("--model", "llama3-8b", "--pp", "4"),
    ("--model", "gpt3-175b", "--pp", "8", "--tp", "8", "--gpu", "h100"),
    ("--model", "llama2-7b", "--pp", "2", "--microbatches", "3"),
])
def test_no_printed_split_beats_the_recommended_one(args):
    doc = json.loads(run("partition", *args, "--json").output)
    best = doc[doc["best"]]
    assert best["vs_best"] == "best"
    for key, _ in SPLITS:
        split = doc[key]
        if split["fits"]:
            assert best["metrics"]["step_time_s"] <= split["metrics"]["step_time_s"]
        if split["metrics"]["step_time_s"] == best["metrics"]["step_time_s"] and key != doc["best"]:
            assert split["vs_best"] == "ties"
    assert doc["gain_over_even"] >= 0


def test_a_baseline_as_fast_as_the_optimum_is_called_a_tie():
    """llama3-8b on 4 stages without recompute: the equal-parameter split is the min-bottleneck
    split (with recompute allowed, stage 0 recomputes 2 of its blocks and the optimum is faster)."""
    result = run("partition", "--model", "llama3-8b", "--pp", "4", "--recompute", "none")
    row = next(l for l in result.output.splitlines() if "equal parameters" in l)
    assert "ties" in row


def test_a_baseline_that_simulates_faster_is_recommended_instead():
    """llama3-8b on 8 stages: the equal-parameter split has the same bottleneck as the ILP's and
    simulates a slightly shorter step (where the slowest stage sits), so it is the one shown."""
    doc = json.loads(run("partition", "--model", "llama3-8b", "--pp", "8", "--json").output)
    assert doc["best"] == "equal_params" and doc["optimal"]["vs_best"].startswith("-")
    text = run("partition", "--model", "llama3-8b", "--pp", "8").output
    assert "best split: equal parameters (the min-bottleneck split" in text
    assert "gain of the equal parameters split over the even split" in text
