"""Closed forms the screen relies on, checked against the op-by-op simulator."""

import pytest

from planner.evaluate import inflight_closed_form
from planner.simulate import simulate

CASES = [(name, p, m, v) for name in ("gpipe", "1f1b", "zb-h1", "interleaved")
         for p in (1, 2, 4, 8) for m in (1, 4, 8, 16, 32)
         for v in ((2, 3, 4) if name == "interleaved" else (1,))
         if not (name == "interleaved" and (m % p or p == 1))]


@pytest.mark.parametrize("name, p, m, v", CASES)
def test_closed_form_inflight_never_below_the_simulated_peak(name, p, m, v):
    """The screen's memory uses the closed form; it must not promise less than the schedule
    holds (equal for GPipe, 1F1B and ZB-H1; interleaved may round up per chunk)."""
    counts = inflight_closed_form(name, p, m, v)
    per_rank = [sum(counts[k] for k in range(r, p * v, p)) for r in range(p)]
    peak = simulate(name, p, m, v, fwd_s=1.0, bwd_s=2.0).peak_inflight
    assert all(c >= s for c, s in zip(per_rank, peak))
    if name != "interleaved":
        assert tuple(per_rank) == peak
