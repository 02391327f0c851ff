"""Fidelity against published training runs (planner/validate.py): a regression in the cost model
that moves the predictions away from what was measured fails here.

The pinned values are today's results (see the README's validation table); the tolerances let
harmless refactors through but not a loss of fidelity. Issue targets not yet reached are pinned at
today's value and marked as such, so an improvement shows up as an easy tightening.
"""

import pytest

from planner.validate import (DEFAULT_FILE, case_setup, load_cases, spearman, summarize,
                              validate_cases, validation_markdown, validation_table)


@pytest.fixture(scope="module")
def result():
    rows = validate_cases(load_cases(DEFAULT_FILE))
    return rows, summarize(rows)


def test_every_case_is_evaluated_or_explicitly_skipped(result):
    rows, s = result
    assert s.cases == 41
    assert s.evaluated == 35
    # ZB-2p (activation limit 2p) has no equivalent schedule: skipped, said so in the note.
    assert all("ZB-2p" in name for name in s.skipped) and len(s.skipped) == 6
    assert all(r.note.startswith("skipped") for r in rows if not r.supported)


def test_step_time_error(result):
    _, s = result
    assert s.mean_abs_time_error <= 0.10  # issue target: mean |error| <= 10%
    assert s.mean_abs_time_error == pytest.approx(0.061, abs=0.01)
    assert s.max_abs_time_error <= 0.25  # issue target: no case worse than 25%
    # the worst case is BLOOM's TP8/DP4 run, 18.6% slower than predicted
    assert s.max_abs_time_error == pytest.approx(0.186, abs=0.015)


def test_groups_outside_bloom_are_within_twelve_percent(result):
    rows, _ = result
    for r in rows:
        if r.supported and not r.group.startswith("bloom"):
            assert abs(r.time_error) <= 0.12, r.case


def test_memory_error(result):
    rows, s = result
    assert s.memory_cases == 23
    # zero-bubble Table 4: never under-estimated by more than 3% (issue target), over <= 15%
    zb = [r.memory_error for r in rows if r.group == "zero_bubble_table4" and r.supported]
    assert min(zb) >= -0.03 and max(zb) <= 0.15
    # BLOOM: issue target (>= -3%) not reached; pinned at today's -16.5%
    assert s.min_memory_error == pytest.approx(-0.165, abs=0.02)
    assert s.max_memory_error <= 0.15


def test_speed_ranking_within_sweeps(result):
    _, s = result
    rho = dict(s.spearman)
    assert rho["bloom_sweep_0228"] >= 0.7
    assert rho["zero_bubble_table4:1.5B"] >= 0.8
    assert rho["zero_bubble_table4:14.6B"] >= 0.7


def test_no_published_run_is_predicted_out_of_memory(result):
    assert result[1].oom_mismatches == ()


def test_tflops_follow_the_sources_definition(result):
    rows, _ = result
    by_name = {r.case: r for r in rows}
    assert by_name["megatron2021-table1-1.7B"].tflops_definition == "hardware"
    assert by_name["bloom-176B-production"].tflops_definition == "hardware"


def test_documented_assumptions():
    cases = {c["name"]: c for c in load_cases(DEFAULT_FILE)}
    readme = case_setup(cases["megatron-readme-gpt3-175B-1024gpu"])
    assert readme.parallel.schedule == "1f1b" and readme.parallel.micro_batch == 1
    table1 = case_setup(cases["megatron2021-table1-145.6B"])
    assert table1.parallel.schedule == "interleaved" and table1.parallel.virtual_stages == 2
    assert not table1.options.flash_attention and not table1.options.overlap_dp
    bloom = case_setup(cases["bloom-176B-production"])
    assert bloom.model.position_embeddings == 0 and bloom.model.vocab_size == 250880
    assert bloom.bounds[0] == (0, 6) and bloom.parallel.zero == 1  # embedding + 5 blocks
    zb = case_setup(cases["zerobubble-1.5B-1F1B-I-m24"])
    assert zb.parallel.virtual_stages == 3 and zb.model.vocab_size == 51200
    assert any("unpublished" in n for n in zb.notes)


def test_spearman_ranks_ties_and_reversals():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.866, abs=1e-3)


def test_renderings(result):
    rows, s = result
    md = validation_markdown(rows, s)
    assert sum(line.startswith("| ") for line in md.splitlines()) == len(rows) + 1  # + header
    assert "| megatron2021-table1-1.7B |" in md and "Spearman" in md
    assert validation_table(rows, s).row_count == len(rows)
