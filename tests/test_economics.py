"""Time, GPU-hours, energy and cost of a token budget (planner/predict/economics.py), checked
against Meta's published Llama 3.1 405B training, and `plan solve --train-tokens`."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st
from typer.testing import CliRunner

from cli import app
from planner.core.errors import PlanInputError
from planner.predict.economics import parse_token_count, training_budget, training_cost

runner = CliRunner()


def test_llama31_405b_gpu_hours_are_a_lower_bound_of_the_model_cards():
    """Dubey et al. 2024 ('The Llama 3 Herd of Models'): 405B trained with "3.8 x 10^25 FLOPs"
    on 16,384 H100s at 400 TFLOP/s per GPU (Table 4, the 16K-GPU row). At that steady rate the
    formulas give 26.4M GPU-hours; the model card (meta-llama/llama-models
    models/llama3_1/MODEL_CARD.md) reports "30.84M" GPU hours at "700" W: the steady-throughput
    figure is below it (restarts, the long-context phases) and within 15%."""
    gpus, per_gpu_flops, total_flops, tokens = 16384, 400e12, 3.8e25, 15.6e12
    seconds = total_flops / (gpus * per_gpu_flops)
    cost = training_cost(tokens / seconds, gpus, tokens, board_w=700.0, price=2.0)
    assert cost.gpu_hours == pytest.approx(gpus * seconds / 3600)
    assert 0.85 * 30.84e6 < cost.gpu_hours < 30.84e6
    assert cost.energy_mwh == pytest.approx(cost.gpu_hours * 700 / 1e6)
    assert cost.cost == pytest.approx(2.0 * cost.gpu_hours)
    assert cost.to_dict()["days"] == pytest.approx(seconds / 86400)


@pytest.mark.parametrize("text, tokens", [("15T", 15e12), ("300B", 300e9), ("2.5e12", 2.5e12),
                                          ("4m", 4e6), (" 1 ", 1.0)])
def test_token_counts_read_as_practitioners_write_them(text, tokens):
    assert parse_token_count(text) == tokens


@pytest.mark.parametrize("text", ["15Q", "", "-3T", "1e30", "nan", "0"])
def test_a_bad_token_count_is_one_line(text):
    with pytest.raises(PlanInputError, match="--train-tokens must be"):
        parse_token_count(text)


def test_a_price_needs_tokens_and_a_sane_value():
    with pytest.raises(PlanInputError, match="add --train-tokens"):
        training_budget(None, 2.5)
    with pytest.raises(PlanInputError, match="--gpu-hour-price must be"):
        training_budget("15T", -1.0)
    assert training_budget(None, None) is None
    assert training_budget("1T", None) == (1e12, None)


def test_solve_prints_and_reports_the_training_budget():
    args = ["solve", "--gpus", "16", "--nodes", "2", "--gpu", "h100", "--train-tokens", "1T",
            "--gpu-hour-price", "2.5"]
    text = runner.invoke(app, args)
    assert text.exit_code == 0, text.output
    line = next(row for row in text.output.splitlines() if row.startswith("training 1T tokens"))
    assert "GPU-hours" in line and "MWh of GPU board power" in line and "$2.50/GPU-hour" in line
    doc = json.loads(runner.invoke(app, args + ["--json"]).output)
    plan = doc["plans"][0]
    tokens_per_s = plan["metrics"]["tokens_per_s"]
    assert doc["training"]["time_to_train_s"] == pytest.approx(1e12 / tokens_per_s, rel=1e-5)
    assert doc["training"]["cost"] == pytest.approx(2.5 * doc["training"]["gpu_hours"])
    failures = doc["training"]["failures"]
    assert failures["wall_time_s"] == pytest.approx(
        doc["training"]["time_to_train_s"] / failures["goodput"])
    assert any(row.startswith("GPU failures at") for row in text.output.splitlines())


# --- failures and checkpointing (planner/predict/goodput.py) -------------------------------------

def test_llama3_405b_failures_and_goodput():
    """Llama 3 405B on 16,384 H100 (Dubey et al. 2024, sec. 3.3): 419 unexpected interruptions
    in a 54-day snapshot, and more than 90% effective training time."""
    from planner.predict.goodput import goodput

    g = goodput(405e9, 16384)
    assert g.interruptions(54 * 86400) == pytest.approx(419)  # the rate's own units, back
    assert 0.90 < g.goodput < 1  # an upper bound (restarts not counted): above Meta's > 90%
    assert g.save_s == pytest.approx(405e9 * 14 / 2e12)  # 14 bytes a parameter at 2 TB/s
    assert g.interval_s == pytest.approx((2 * g.save_s * g.mtbf_s) ** 0.5)  # Young 1974


@given(params=st.floats(1e8, 2e12), gpus=st.integers(8, 100_000))
def test_young_interval_is_the_best_interval(params, gpus):
    """Young's tau minimises the lost share delta/tau + tau/(2M): any other interval loses more."""
    from planner.predict.goodput import goodput

    g = goodput(params, gpus)

    def lost(tau):
        return g.save_s / tau + tau / (2 * g.mtbf_s)

    assert lost(g.interval_s) <= min(lost(g.interval_s * 0.8), lost(g.interval_s * 1.25))
    assert goodput(params * 2, gpus).goodput <= g.goodput  # a bigger checkpoint costs more


# --- the batch in tokens (--global-batch-tokens) ------------------------------------------------

def test_llama3_batch_in_tokens_is_its_2048_sequences():
    """Llama 3 405B trained at 16M tokens a step with 8,192-token sequences (Dubey et al. 2024,
    Table 4): 16Mi = 2,048 x 8,192 exactly; a decimal 16M is the nearest whole count, 1,953."""
    from planner.predict.economics import batch_of_tokens

    assert parse_token_count("16Mi") == 2**24
    assert batch_of_tokens("16Mi", 8192) == 2048
    assert batch_of_tokens("16M", 8192) == 1953
    assert batch_of_tokens("100", 8192) == 1  # never none


def test_solve_takes_the_batch_in_tokens_once():
    from planner import api

    plan = api.solve(16, 2, global_batch_tokens="4Mi", top=1).best
    assert plan.parallel.global_batch == 512  # 4Mi / 8192
    with pytest.raises(PlanInputError, match="give the batch once"):
        api.solve(16, 2, global_batch_tokens="4M", global_batch=64)
    done = runner.invoke(app, ["solve", "--gpus", "16", "--nodes", "2", "--global-batch-tokens",
                               "2Mi", "--top", "1"])
    assert done.exit_code == 0, done.output
    assert "--global-batch-tokens 2Mi: 256 sequences of 8192 tokens" in done.output
    assert "global batch 256" in done.output
