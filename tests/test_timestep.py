"""Lockstep time steps (planner/pipeline/timestep.py): torch 2.6's interleaved 1F1B table and
its timing, against the source and a hand-worked run; the walk that skips its steady periods
against the full walk of the table."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import engine_module
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planner.core.parallel import Parallel
from planner.hardware.profiles import Cluster, load_hardware
from planner.model.presets import PRESETS
from planner.pipeline.schedule import interleaved_order
from planner.pipeline.simulate import simulate
from planner.pipeline import timestep
from planner.pipeline.timestep import (interleaved_makespan_s, interleaved_slots,
                                       interleaved_steps, makespan_s)
from planner.predict.step import evaluate
from planner.stack import load_stack


def _text(program):
    return [[None if op is None else f"{op.kind}{op.chunk}.{op.microbatch}" for op in row]
            for row in program]


def test_two_ranks_two_stages_each_hand_worked():
    """p = 2, m = 2, v = 2 with F = 1, B = 2, free transfers. torch 2.6's table (warm-up
    2 + 2·(p-1-r) forwards, r idle slots first, idle slots after the warm-up up to step
    v·p + 2(p-1-r), an idle slot before each cool-down backward):

        step  0    1    2    3    4    5    6    7    8    9    10   11   12   13
        r0    F0.0 F0.1 F2.0 F2.1 -    -    -    B2.0 -    B2.1 -    B0.0 -    B0.1
        r1    -    F1.0 F1.1 -    F3.0 B3.0 F3.1 B3.1 -    B1.0 -    B1.1

    In lockstep rank 1 holds F3.0 at step 4 although F2.0's output came at step 2: at step 3 it
    must receive F2.1, which rank 0 computes during that step. Working the steps through
    (each ends when the step's senders and receivers are done): 1, 2, 3, 4, 5 (r1), 7, 8 (r1),
    10, 12, 14, 16. Run as data arrives (pipeline/simulate.py) the same order takes 15."""
    assert _text(interleaved_steps(2, 2, 2)) == [
        ["F0.0", "F0.1", "F2.0", "F2.1", None, None, None, "B2.0", None, "B2.1", None, "B0.0",
         None, "B0.1"],
        [None, "F1.0", "F1.1", None, "F3.0", "B3.0", "F3.1", "B3.1", None, "B1.0", None,
         "B1.1"]]
    assert interleaved_makespan_s(2, 2, 2, [1.0] * 4, [2.0] * 4) == pytest.approx(16.0)
    assert simulate("interleaved", 2, 2, 2, fwd_s=1.0, bwd_s=2.0,
                    timeline=False).makespan_s == pytest.approx(15.0)


def test_transfers_are_waited_on_inside_the_step():
    """Each step's batch is waited on before the next step: a transfer of c seconds on every
    step that exchanges. In the hand-worked run above steps 0-3, 5, 7, 9 and 11 exchange (a
    forward of chunk 3 and a backward of chunk 0 send nothing), all on the chain that ends the
    step, so free transfers' 16 becomes 16 + 8c."""
    c = 0.01
    assert interleaved_makespan_s(2, 2, 2, [1.0] * 4, [2.0] * 4, comm_s=c) == \
        pytest.approx(16.0 + 8 * c)
    # per-action cost, charged on every action: the chain that ends the step runs 11 of them
    # (steps 0-7, 9, 11, 13), so the 16 becomes 16 + 11a
    assert interleaved_makespan_s(2, 2, 2, [1.0] * 4, [2.0] * 4, action_s=0.1) == \
        pytest.approx(16.0 + 11 * 0.1)


@pytest.mark.parametrize("p,m,v", [(2, 2, 2), (4, 8, 2), (8, 16, 2), (4, 4, 3), (8, 32, 4),
                                   (4, 3, 2), (4, 10, 2), (3, 6, 2)])
def test_table_is_torchs(p, m, v):
    """The table torch builds (ScheduleInterleaved1F1B._calculate_single_rank_operations). The
    installed torch (2.13) still builds the table with the code torch 2.6 ran in lockstep
    (_get_1f1b_rank_ops is unchanged but for type hints; 2.13 lowers the table into send and
    receive actions instead of walking it step by step)."""
    schedules = engine_module("torch.distributed.pipelining.schedules",
                              "torch (the engine extra) builds the table to compare")
    sched = object.__new__(schedules.ScheduleInterleaved1F1B)
    sched.pp_group_size, sched.n_local_stages, sched._n_microbatches = p, v, m
    sched.number_of_rounds = max(1, m // p)
    sched.microbatches_per_round = m // sched.number_of_rounds
    forward = schedules._ComputationType.FORWARD
    for r, row in enumerate(interleaved_steps(p, m, v)):
        torch_row = sched._calculate_single_rank_operations(r)
        assert [None if a is None else ("F" if a.computation_type == forward else "B",
                                        a.microbatch_index, a.stage_index) for a in torch_row] \
            == [None if op is None else (op.kind, op.microbatch, op.chunk) for op in row]


def test_refuses_what_torch_refuses():
    """torch: 'Interleaved 1F1B requires the number of microbatches to be a multiple of the
    number of rounds' (4 ranks, 9 microbatches: 2 rounds)."""
    with pytest.raises(ValueError, match="multiple of the rounds"):
        interleaved_steps(4, 9, 2)


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 6), rounds=st.integers(1, 3), v=st.integers(2, 3),
       f=st.lists(st.floats(0.1, 2.0), min_size=18, max_size=18),
       ratio=st.floats(1.0, 3.5), comm=st.floats(0.0, 0.2))
def test_same_order_never_faster_than_dataflow(p, rounds, v, f, ratio, comm):
    """The table holds Megatron's interleaved order (idle slots aside), every forward and
    backward once; and lockstep only adds waits to a run of that order as data arrives, so it
    is never shorter than the op-by-op simulation with the same times."""
    m = p * rounds
    fwd = f[:p * v]
    bwd = [x * ratio for x in fwd]
    program = interleaved_steps(p, m, v)
    for r, row in enumerate(program):
        assert [op for op in row if op is not None] == interleaved_order(p, m, v, r)
    lock = interleaved_makespan_s(p, m, v, fwd, bwd, comm_s=comm)
    flow = simulate("interleaved", p, m, v, fwd_s=fwd, bwd_s=bwd, comm_s=comm,
                    timeline=False).makespan_s
    assert lock >= flow - 1e-9


@pytest.mark.parametrize("p,m,v", [(1, 1, 1), (1, 5, 3), (2, 1, 3), (2, 2, 2), (4, 8, 2),
                                   (4, 3, 2), (4, 10, 2), (3, 6, 2), (6, 30, 3), (5, 7, 1),
                                   (8, 64, 4)])
def test_the_walk_reads_the_tables_slots_without_building_it(p, m, v):
    # the kind and chunk of every slot, found by arithmetic, are the table's (microbatch aside)
    per_round, total, ranks = timestep._layout(p, m, v)
    table = interleaved_steps(p, m, v)
    length = timestep._window(p, m, v)[3]
    assert length == max(len(row) for row in table)
    for r, row in enumerate(table):
        assert [timestep._action(p, v, per_round, total, ranks[r], r, c)
                for c in range(length + 2)] == \
            [None if op is None else (op.kind, op.chunk) for op in row] + \
            [None] * (length + 2 - len(row))


@settings(max_examples=100, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 64), v=st.integers(1, 4),
       f=st.lists(st.floats(0.01, 3.0), min_size=24, max_size=24),
       b=st.lists(st.floats(0.01, 9.0), min_size=24, max_size=24),
       comm=st.lists(st.floats(0.0, 0.5), min_size=23, max_size=23),
       action=st.floats(0.0, 0.1))
def test_skipping_steady_periods_gives_the_full_walks_makespan(p, m, v, f, b, comm, action):
    # issue #31: the same makespan as the walk of the whole table, within 1e-9 relative, with
    # the periods found (the default), and with the max-plus matrix fallback forced (after no
    # period or one); the work never over interleaved_slots' count
    assume(m % max(1, m // p) == 0)  # torch's rule (test_refuses_what_torch_refuses)
    fwd, bwd, links = f[:p * v], b[:p * v], comm[:p * v - 1]
    full = makespan_s(interleaved_steps(p, m, v), fwd, bwd, links, action)
    assert interleaved_makespan_s(p, m, v, fwd, bwd, links, action) == \
        pytest.approx(full, rel=1e-9)
    for periods in (timestep.MAX_PERIODS, 0, 1):
        seconds, work = timestep._walk(p, m, v, fwd, bwd, links, action, periods)
        assert seconds == pytest.approx(full, rel=1e-9)
        if periods == timestep.MAX_PERIODS:
            assert work <= interleaved_slots(p, m, v)


def test_a_long_run_walks_as_much_as_a_short_one(monkeypatch):
    # 125,000 microbatches per rank: the table (2 million slots a rank) is never built, and the
    # walk's work bound is a short run's but for the fallback's log2 term
    monkeypatch.setattr(timestep, "interleaved_steps", lambda *a: pytest.fail("built the table"))
    p, v, m = 8, 2, 8 * 125_000
    fwd, bwd = [1.0 + 0.01 * k for k in range(p * v)], [2.1] * (p * v)
    seconds, work = timestep._walk(p, m, v, fwd, bwd, [0.01] * (p * v - 1), 0.001)
    assert work == timestep._walk(p, 8 * 1000, v, fwd, bwd, [0.01] * (p * v - 1), 0.001)[1]
    assert work <= interleaved_slots(p, m, v) <= 20_000
    assert interleaved_slots(p, m, v) - interleaved_slots(p, 8 * 1000, v) <= 8 * p ** 3
    # the makespan grows by the steady period's time: a rank's M·v forwards and backwards
    # bound it below
    assert seconds >= m * (sum(fwd) + sum(bwd)) / p


def test_plan_solve_on_time_steps_at_a_large_batch_does_bounded_work(monkeypatch):
    # issue #31: `plan solve` prices every configuration it searches on the stack's time steps;
    # at 20,000 microbatches (40,000 on one data-parallel rank) no table is built nor walked
    # whole, and each walk does at most what interleaved_slots counts, a few hundredths of the
    # table's slots. Counted, not timed.
    import planner
    walks = []
    walk = timestep._walk

    def counted(p, m, v, *args):
        seconds, work = walk(p, m, v, *args)
        walks.append((p, m, v, work))
        return seconds, work

    monkeypatch.setattr(timestep, "_walk", counted)
    monkeypatch.setattr(timestep, "interleaved_steps", lambda *a: pytest.fail("built the table"))
    lockstep = replace(load_stack("megatron-core"), pipeline_timesteps=True)
    solution = planner.solve(gpus=8, nodes=1, global_batch=40_000, stack=lockstep,
                             schedule="interleaved", pp=4, virtual_stages=2, micro_batch=1)
    assert solution.best.parallel.num_microbatches >= 20_000
    assert walks and min(m for _, m, _, _ in walks) >= 20_000
    for p, m, v, work in walks:
        assert work <= interleaved_slots(p, m, v) <= interleaved_slots(p, 1_000_000, v) \
            < p * 2 * m * v / 30
    assert sum(work for *_, work in walks) <= len(walks) * interleaved_slots(4, 1_000_000, 2)


def test_stack_field_prices_only_the_interleaved_schedule():
    """torchtitan as measured here (torch 2.13) runs as data arrives; a run on torch <= 2.6
    sets pipeline_timesteps, which lengthens an interleaved step and leaves 1F1B alone."""
    titan = load_stack("torchtitan")
    assert not titan.pipeline_timesteps
    lockstep = replace(titan, pipeline_timesteps=True)
    model = PRESETS["llama3-8b"]
    cluster = Cluster(hardware=load_hardware("h100-sxm-80gb"), nodes=1, gpus_per_node=8)
    inter = Parallel(tp=1, pp=4, dp=2, micro_batch=1, num_microbatches=8,
                     schedule="interleaved", virtual_stages=2, recompute="full", zero=1)
    one = replace(inter, schedule="1f1b", virtual_stages=1)
    for sim in (True, False):
        a = evaluate(model, cluster, inter, titan, simulated=sim).metrics
        b = evaluate(model, cluster, inter, lockstep, simulated=sim).metrics
        assert b.step_time_s > a.step_time_s and b.bubble_fraction > a.bubble_fraction
        assert evaluate(model, cluster, one, lockstep, simulated=sim).metrics.step_time_s == \
            evaluate(model, cluster, one, titan, simulated=sim).metrics.step_time_s


def test_plan_simulate_says_it_draws_the_data_driven_run(tmp_path):
    """`plan simulate --stack` on a stack with lockstep time steps: the chart is the op-by-op
    run, and a note says the time steps are priced by plan solve, not drawn."""
    import json as _json
    from typer.testing import CliRunner
    from planner.cli import app
    path = tmp_path / "torch26.json"
    path.write_text(_json.dumps({"base": "torchtitan", "name": "torch26", "version": "1",
                                 "description": "torchtitan on torch 2.6",
                                 "pipeline_timesteps": True}))
    args = ["simulate", "--pp", "2", "--microbatches", "4", "--schedule", "interleaved",
            "--virtual-stages", "2", "--stack", str(path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "lockstep time steps" in result.output
    plain = CliRunner().invoke(app, args[:-2] + ["--stack", "torchtitan"])
    assert plain.exit_code == 0 and "lockstep" not in plain.output
