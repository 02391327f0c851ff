"""Schedule generation, p2p insertion and the rendezvous deadlock checker."""

import re
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from planner.core.parallel import schedule_problem
from planner.pipeline.schedule import (
    SCHEDULES, Deadlock, Op, ScheduleError, build_schedule, find_deadlock, with_communication,
)


def kinds(row):
    return [f"{op.kind}{op.microbatch}" for op in row]


def test_gpipe_order_forwards_then_reversed_backwards():
    for row in build_schedule("gpipe", 4, 4):
        assert kinds(row) == ["F0", "F1", "F2", "F3", "B3", "B2", "B1", "B0"]


def test_1f1b_warmup_counts():
    ops = build_schedule("1f1b", 4, 8)
    for r, row in enumerate(ops):
        first_b = next(i for i, op in enumerate(row) if op.kind == "B")
        assert first_b == min(4 - r, 8)  # warm-up p-r-1 plus the first steady F


def test_interleaved_first_rank_follows_megatron_groups():
    row = build_schedule("interleaved", 2, 4, 2)[0]
    # forwards in groups of p microbatches per chunk: chunk 0 (mb 0,1), chunk 2 (mb 0,1), ...
    fwd = [(op.microbatch, op.chunk) for op in row if op.kind == "F"]
    assert fwd == [(0, 0), (1, 0), (0, 2), (1, 2), (2, 0), (3, 0), (2, 2), (3, 2)]
    bwd = [(op.microbatch, op.chunk) for op in row if op.kind == "B"]
    assert bwd[:2] == [(0, 2), (1, 2)]  # backward visits the last chunk first


@pytest.mark.parametrize("name,p,m,v,msg", [
    ("interleaved", 4, 6, 2, "interleaved needs the microbatch count (6) divisible by pp (4): use 8"),
    ("1f1b", 4, 8, 2, "virtual stages need the interleaved schedule"),
    ("gpipe", 0, 8, 1, "pipeline size"),
    ("gpipe", 2, 0, 1, "microbatch count"),
    ("pipedream", 2, 2, 1, "unknown schedule"),
])
def test_bad_arguments_raise_one_line(name, p, m, v, msg):
    with pytest.raises(ScheduleError, match=re.escape(msg)) as err:
        build_schedule(name, p, m, v)
    assert "\n" not in str(err.value)
    assert isinstance(err.value, ValueError)


def owned(name, p, m, v):
    """Expected multiset of compute ops for rank r (dualpipe: tests/test_dualpipe.py)."""
    kinds_ = ("F", "B", "W") if name in ("zb-h1", "zb-2p") else ("F", "B")
    return [Counter((k, mb, c * p + r) for k in kinds_ for mb in range(m) for c in range(v))
            for r in range(p)]


@pytest.mark.parametrize("name", [s for s in SCHEDULES if s != "dualpipe"])
@pytest.mark.parametrize("p,m", [(1, 1), (1, 3), (2, 2), (3, 6), (4, 4), (4, 8), (5, 10), (8, 16)])
def test_each_op_exactly_once(name, p, m):
    for v in ((1, 2, 3) if name == "interleaved" else (1,)):
        ops = build_schedule(name, p, m, v)
        got = [Counter((op.kind, op.microbatch, op.chunk) for op in row) for row in ops]
        assert got == owned(name, p, m, v)


def test_naive_order_deadlocks_and_is_reported():
    ops = with_communication(build_schedule("1f1b", 4, 8), order="naive")
    dead = find_deadlock(ops)
    assert isinstance(dead, Deadlock)
    assert {r for r, _, _ in dead.waiting} == {0, 1, 2, 3}
    assert all(op.kind.startswith("SEND") for _, _, op in dead.waiting)
    text = str(dead)
    assert text.startswith("deadlock:") and "rank 0 waits" in text and "SEND_F" in text


def test_two_ranks_both_sending_deadlock():
    ops = ((Op("SEND_F", 0, 0, 1), Op("RECV_B", 0, 1, 1)),
           (Op("SEND_B", 0, 1, 0), Op("RECV_F", 0, 0, 0)))
    assert find_deadlock(ops) is not None
    fixed = ((Op("SEND_F", 0, 0, 1), Op("RECV_B", 0, 1, 1)),
             (Op("RECV_F", 0, 0, 0), Op("SEND_B", 0, 1, 0)))
    assert find_deadlock(fixed) is None


def test_literal_parity_rule_deadlocks_when_receive_needs_own_send():
    # odd rank 1 turning from its only F to its B would wait for a gradient of an activation it
    # has not sent yet; the safe order places the send first.
    ops = build_schedule("gpipe", 3, 1)
    assert find_deadlock(with_communication(ops, order="even-odd")) is not None
    assert find_deadlock(with_communication(ops)) is None


def test_parity_rule_kept_for_symmetric_swaps():
    # 1F1B steady state: rank 1 (odd) receives the activation before sending the gradient back
    row = with_communication(build_schedule("1f1b", 2, 4))[1]
    i = row.index(Op("SEND_B", 0, 1, 0))
    assert row[i - 1] == Op("RECV_F", 1, 0, 0)


def test_with_communication_keeps_compute_order_and_pairs_all_transfers():
    comp = build_schedule("interleaved", 4, 8, 2)
    full = with_communication(comp)
    for c_row, f_row in zip(comp, full):
        assert tuple(op for op in f_row if op.peer is None) == c_row
    sends = Counter((op.kind[5:], op.microbatch, op.chunk) for row in full for op in row if op.kind.startswith("SEND"))
    recvs = Counter((op.kind[5:], op.microbatch, op.chunk) for row in full for op in row if op.kind.startswith("RECV"))
    assert sends == recvs and len(sends) == 2 * 8 * (4 * 2 - 1)


def _cases():
    for name in SCHEDULES:
        for p in range(1, 17):
            for m in sorted({1, 2, 3, p, 2 * p, 64} - {0}):
                for v in ((1, 2, 4) if name == "interleaved" else (1,)):
                    if name == "interleaved" and m % p:
                        continue
                    if name == "dualpipe" and schedule_problem(name, p, m, v):
                        continue
                    yield name, p, m, v


def test_every_generated_schedule_is_deadlock_free_small_grid():
    count = 0
    for name, p, m, v in _cases():
        dead = find_deadlock(with_communication(build_schedule(name, p, m, v)))
        assert dead is None, (name, p, m, v, str(dead))
        count += 1
    assert count > 200


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(SCHEDULES), p=st.integers(1, 16), m=st.integers(1, 64),
       v=st.sampled_from((1, 2, 4)))
def test_every_generated_schedule_is_deadlock_free_sampled(name, p, m, v):
    if name != "interleaved":
        v = 1
    else:
        m = max(p, m - m % p)
    if name == "dualpipe":  # its rules: even p, an even m of at least 2p
        p = max(2, p - p % 2)
        m = max(2 * p, m - m % 2)
    assert find_deadlock(with_communication(build_schedule(name, p, m, v))) is None


def test_the_whole_issue_grid_is_deadlock_free():
    """Every generated schedule for all p <= 16, M <= 64 and v in {1, 2, 4} (interleaved needs
    M divisible by p): 4,390 schedules under blocking send/receive, about 17 s."""
    from planner.pipeline.schedule import build_schedule, find_deadlock, with_communication

    checked = 0
    for p in range(1, 17):
        for m in range(1, 65):
            runs = [(name, 1) for name in ("gpipe", "1f1b", "zb-h1", "zb-2p")]
            if p > 1 and m % p == 0:
                runs += [("interleaved", 2), ("interleaved", 4)]
            for name, v in runs:
                ops = with_communication(build_schedule(name, p, m, v))
                assert find_deadlock(ops) is None, (name, p, m, v)
                checked += 1
    assert checked == 3366 + 16 * 64


@pytest.mark.parametrize("p,m", [(2, 8), (4, 4), (4, 24), (8, 24), (8, 100)])
def test_zb_2p_warms_up_to_the_returning_gradient_and_holds_at_most_2p(p, m):
    """Rank r runs min(m, 2(p - r) - 1) forwards before its first B (those that fit before
    microbatch 0's input gradient returns when F = B = W) and never holds more than 2p
    microbatches' activations (F run, W not yet)."""
    for r, ops in enumerate(build_schedule("zb-2p", p, m)):
        kinds = [op.kind for op in ops]
        assert kinds.index("B") == min(m, 2 * (p - r) - 1)
        live = peak = 0
        for kind in kinds:
            live += {"F": 1, "W": -1}.get(kind, 0)
            peak = max(peak, live)
        assert peak == min(m, 2 * p)
