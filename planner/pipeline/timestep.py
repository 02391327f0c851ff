"""Lockstep time steps: a multi-stage pipeline schedule as torch.distributed.pipelining ran it
up to torch 2.6 (PipelineScheduleMulti), where no rank starts its next action before the
point-to-point batch of the current one, with its neighbours, has completed.

The compute order of ScheduleInterleaved1F1B is Megatron's interleaved order (schedule.py
``interleaved_order`` builds the same per-rank sequence). What differs is how torch 2.6 ran it.
``ScheduleInterleaved1F1B(PipelineScheduleMulti)`` fills a table of time steps, one action or
an idle slot (None) per rank and step (torch/distributed/pipelining/schedules.py,
``_get_1f1b_rank_ops``, torch 2.6.0):

    "rank_ops: List[Optional[_Action]] = [None for _ in range(rank)]"          (pre-padding)
    "post_warmup_ops = (n_local_stages * pp_group_size + 2 * (pp_group_size - 1 - rank))
        - (warmup_ops + rank)"     ... "rank_ops.extend([None] * post_warmup_ops)"
    "# During cooldown phase, we need steps to align with 1f1b happening in other ranks"
        ... "rank_ops.append(None)"                                            (before each B)

with ``warmup_ops = (n_local_stages - 1) * microbatches_per_round + 2 * ((pp_group_size - 1)
- rank)`` capped at ``n_microbatches * n_local_stages``, ``microbatches_per_round =
n_microbatches // max(1, n_microbatches // pp_group_size)``. PipelineScheduleMulti's
``_step_microbatches`` then walks the table one step at a time (``for time_step, action in
enumerate(self.pipeline_order[self.rank])``): it runs the rank's action and adds its sends
(``ops.extend(stage.get_fwd_send_ops(mb_index))``, ``get_bwd_send_ops``), adds a receive for
each neighbour whose action *at the same time step* sends to one of its stages ("Look at the
neighboring ranks for this current timestep and determine whether this current rank needs to do
any recv communication"), and waits for the whole batch before the next step:

    "# do the communication"  "if ops:"  "_batch_p2p(ops).wait()"

A step therefore ends, on each rank, when its own action and those of the neighbours it
exchanges with at that step have finished and the transfers between them are done; idle slots
with no exchange cost nothing. Later torch versions lower the same table into
send/receive actions run as data arrives (``class ScheduleInterleaved1F1B(_PipelineScheduleRuntime)``,
torch 2.13; benchmarks/bench_engine.py measures that one against pipeline/simulate.py), which is
what ``Stack.pipeline_timesteps`` = False prices.

Timing (``makespan_s``): on step t rank r finishes its compute at X[r] = E[r] + d(action),
d = the chunk's forward or backward plus the stack's per-action cost; a transfer across boundary
k between ranks r and q starts when both have finished their compute of the step and takes
``comm_s[k]``; E[r] of the step is the latest of X[r] and the end of each of its transfers. A
transfer's wait is on the GPU stream (NCCL's ``wait()`` orders the compute stream after the
batch), so the host running ahead does not shorten it.

Work independent of M (``interleaved_makespan_s``; issue #31, "every path bounded"). The walk
builds no table: a slot's kind and chunk come by arithmetic from its rank and column
(``_action``, the same rows as ``interleaved_steps``). Between the column where the last rank
starts its steady (F, B) pairs and the first where one starts its cool-down, every rank's column
equals the one 2·microbatches-per-round·v columns later (the chunk of a step's forward and
backward repeats every round·v steps: ``fwd_chunk`` and ``bwd_chunk`` in ``interleaved_steps``),
and a slot's time depends on its kind and chunk only, so each such period applies one map F to
the ranks' end times. F is built of sums and maxima only (max-plus linear: Baccelli, Cohen,
Olsder and Quadrat, Synchronization and Linearity, 1992, ch. 3), so F(x + c) = F(x) + c for a
constant c added to every rank, and F is monotone. Hence once the end times at a period's start
equal those k periods earlier plus one shift c on every rank, each later k periods add c again
(by induction: F^k(x + c) = F^k(x) + c); the walk adds c for every k whole periods left in the
window and walks the rest and the cool-down column by column. That is exact; the comparison
allows TOLERANCE (1e-12 of the latest end time) for the rounding of the sums. F does not expand
distances (|F(x) - F(y)| <= |x - y| in the largest entry, as any monotone map with F(x + c) =
F(x) + c: Crandall and Tartar, Proc. AMS 78, 1980), so an accepted difference e adds at most e
per k periods skipped: relative to the makespan about TOLERANCE times the periods walked, under
1e-10 at MAX_PERIODS (tests/test_timestep.py checks 1e-9 against the full walk, ``makespan_s``,
kept as the reference). Such recurrences become
periodic after a transient (the cyclicity theorem, same source), with a period of k >= 1 of ours
and a transient that grows as two cycles' mean times draw close; compared with up to
MAX_CYCLICITY periods back and not periodic within MAX_PERIODS periods, the walk falls back to
the period's max-plus matrix raised to the periods left by squaring (``_period_power``): exact as
well, its work p times a period's slots and, per bit of the periods left, a p×p product: still
bounded. ``interleaved_slots`` counts the most work the walk does, before it runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from planner.pipeline.ops import Op

Program = tuple[tuple[Op | None, ...], ...]  # per rank, per time step: an action or idle


def _rounds(p: int, m: int) -> int:
    """Microbatches per round: torch 2.6's ``number_of_rounds = max(1, n_microbatches //
    self.pp_group_size)`` and ``microbatches_per_round = n_microbatches // number_of_rounds``,
    with its refusal when the rounds do not divide the microbatches."""
    rounds = max(1, m // p)
    if m % rounds:
        raise ValueError(f"interleaved 1F1B needs the microbatches ({m}) to be a multiple of the "
                         f"rounds ({rounds})")
    return m // rounds


@lru_cache(maxsize=64)
def interleaved_steps(p: int, m: int, v: int) -> Program:
    """Per rank, the time-step table of torch 2.6's ScheduleInterleaved1F1B for p ranks, m
    microbatches and v stages per rank (global chunk c * p + r on rank r): actions as Op("F" or
    "B", microbatch, chunk), idle slots as None (module docstring quotes the source)."""
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"p, m and v must be >= 1, got {p}, {m}, {v}")
    per_round = _rounds(p, m)
    total = m * v
    out = []
    for r in range(p):
        warmup = min((v - 1) * per_round + 2 * (p - 1 - r), total)

        def fwd_chunk(step: int) -> int:
            return ((step // per_round) % v) * p + r

        def bwd_chunk(step: int) -> int:
            return (v - 1 - ((step - warmup) // per_round) % v) * p + r

        seen_f: dict[int, int] = defaultdict(int)
        seen_b: dict[int, int] = defaultdict(int)

        def action(kind: str, chunk: int) -> Op:
            seen = seen_f if kind == "F" else seen_b
            seen[chunk] += 1
            return Op(kind, seen[chunk] - 1, chunk)

        ops: list[Op | None] = [None] * r
        post_warmup = (v * p + 2 * (p - 1 - r)) - (warmup + r)
        for step in range(total + warmup):
            if step < warmup:
                ops.append(action("F", fwd_chunk(step)))
                if step == warmup - 1:
                    ops += [None] * max(0, post_warmup)
            elif step < total:
                ops += [action("F", fwd_chunk(step)), action("B", bwd_chunk(step))]
            else:
                ops += [None, action("B", bwd_chunk(step))]
        out.append(tuple(ops))
    return tuple(out)


def _transfers(program: Program, t: int, chunks: int) -> list[tuple[int, int, int]]:
    """(sender rank, receiver rank, boundary) of every transfer of step t: a forward of chunk k
    < chunks - 1 sends over boundary k to chunk k + 1's rank, a backward of chunk k > 0 sends
    its input gradient over boundary k - 1 to chunk k - 1's rank (chunk c lives on rank c mod
    p). The receiver posts its receive at the same step (PipelineScheduleMulti)."""
    p = len(program)
    out = []
    for r, ops in enumerate(program):
        op = ops[t] if t < len(ops) else None
        if op is None:
            continue
        if op.kind == "F" and op.chunk < chunks - 1:
            out.append((r, (op.chunk + 1) % p, op.chunk))
        elif op.kind == "B" and op.chunk > 0:
            out.append((r, (op.chunk - 1) % p, op.chunk - 1))
    return out


def makespan_s(program: Program, fwd_s: Sequence[float], bwd_s: Sequence[float],
               comm_s: float | Sequence[float] = 0.0, action_s: float = 0.0) -> float:
    """Seconds from the first step's start to the last rank's end when every rank runs its row
    of ``program`` in lockstep time steps (module docstring): per chunk ``fwd_s`` and ``bwd_s``,
    per boundary ``comm_s`` (one value for all), ``action_s`` more for every action."""
    p = len(program)
    chunks = len(fwd_s)
    _check_times(fwd_s, bwd_s)
    comm = _boundary_times(comm_s, chunks)
    end = [0.0] * p
    for t in range(max((len(ops) for ops in program), default=0)):
        done = []
        for r, ops in enumerate(program):
            op = ops[t] if t < len(ops) else None
            work = 0.0 if op is None else \
                (fwd_s[op.chunk] if op.kind == "F" else bwd_s[op.chunk]) + action_s
            done.append(end[r] + work)
        end = list(done)
        for sender, receiver, k in _transfers(program, t, chunks):
            finish = max(done[sender], done[receiver]) + comm[k]
            end[sender] = max(end[sender], finish)
            end[receiver] = max(end[receiver], finish)
    return max(end, default=0.0)


def _check_times(fwd_s: Sequence[float], bwd_s: Sequence[float]) -> None:
    if len(bwd_s) != len(fwd_s):
        raise ValueError(f"{len(bwd_s)} backward times for {len(fwd_s)} chunks")


def _boundary_times(comm_s: float | Sequence[float], chunks: int) -> list[float]:
    """Per chunk boundary, its transfer's seconds (one value for all, or one per boundary)."""
    comm = [float(comm_s)] * max(0, chunks - 1) if isinstance(comm_s, (int, float)) \
        else [float(x) for x in comm_s]
    if len(comm) != max(0, chunks - 1):
        raise ValueError(f"{len(comm)} transfer times for {chunks} chunks; need {chunks - 1}")
    return comm


# --- the bounded walk: steady periods skipped (module docstring) ------------------------------

# Steady periods walked, their states kept, before the walk falls back to the period's max-plus
# matrix; states compared up to MAX_CYCLICITY periods back; TOLERANCE: two normalised states
# this close (relative to the latest end time) count as equal. Chosen so a skipped period's
# error stays far under 1e-9 relative (module docstring) and the fallback rare: of 300 random
# shapes (p 2-8, v 1-4, M 20p-60p, random times) about 293 were periodic after one or two periods,
# the slowest after 12 (measured while writing this; the fallback is exact either way).
MAX_PERIODS = 32
MAX_CYCLICITY = 4
TOLERANCE = 1e-12

Column = tuple[tuple[float, ...], tuple[tuple[int, int, float], ...]]  # per rank, then transfers


@lru_cache(maxsize=256)
def _layout(p: int, m: int, v: int) -> tuple[int, int, tuple[tuple[int, int, int], ...]]:
    """(microbatches per round, m·v, per rank (warm-up forwards, idle slots after them, first
    column after both)) of :func:`interleaved_steps`'s rows, in O(p): row r is r idle slots, the
    warm-up's forwards, the idle slots after them, an (F, B) pair of slots per step up to m·v
    and an (idle, B) pair per cool-down step."""
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"p, m and v must be >= 1, got {p}, {m}, {v}")
    per_round, total = _rounds(p, m), m * v
    ranks = []
    for r in range(p):
        warmup = min((v - 1) * per_round + 2 * (p - 1 - r), total)
        post_warmup = (v * p + 2 * (p - 1 - r)) - (warmup + r)
        padding = max(0, post_warmup) if warmup else 0  # added after the last warm-up step
        ranks.append((warmup, padding, r + warmup + padding))
    return per_round, total, tuple(ranks)


def _action(p: int, v: int, per_round: int, total: int, rank: tuple[int, int, int], r: int,
            c: int) -> tuple[str, int] | None:
    """(kind, chunk) of row r's slot at column c, or None for an idle one: the same slot as
    :func:`interleaved_steps` builds, found by arithmetic (microbatch indices aside: a slot's
    time depends on its kind and chunk only)."""
    warmup, padding, base = rank
    if c < r + warmup:
        return None if c < r else ("F", ((c - r) // per_round) % v * p + r)
    if c < base:
        return None
    step, odd = divmod(c - base, 2)  # step after the warm-up: (F, B) pairs, then (idle, B)
    if step >= total:
        return None
    backward = (v - 1 - (step // per_round) % v) * p + r
    if not odd:
        return None if warmup + step >= total else \
            ("F", ((warmup + step) // per_round) % v * p + r)
    return "B", backward


def _column(p: int, m: int, v: int, t: int, fwd_s: Sequence[float], bwd_s: Sequence[float],
            comm: Sequence[float], action_s: float) -> Column:
    """Column t of the table as its timing reads it: per rank the seconds of its action (0 for
    an idle slot) and each transfer (sender, receiver, seconds), as :func:`_transfers` finds
    them."""
    per_round, total, ranks = _layout(p, m, v)
    chunks = p * v
    work, transfers = [], []
    for r, rank in enumerate(ranks):
        act = _action(p, v, per_round, total, rank, r, t)
        if act is None:
            work.append(0.0)
            continue
        kind, chunk = act
        work.append((fwd_s[chunk] if kind == "F" else bwd_s[chunk]) + action_s)
        if kind == "F" and chunk < chunks - 1:
            transfers.append((r, (chunk + 1) % p, comm[chunk]))
        elif kind == "B" and chunk > 0:
            transfers.append((r, (chunk - 1) % p, comm[chunk - 1]))
    return tuple(work), tuple(transfers)


def _advance(end: list, column: Column, most=max) -> list:
    """The end times after one column, exactly as :func:`makespan_s` steps: each rank's compute
    after its last end, each transfer after both ends' compute. ``end`` holds floats, or numpy
    rows with ``most`` = np.maximum (the period's matrix, :func:`_period_power`)."""
    work, transfers = column
    done = [e + w for e, w in zip(end, work)]
    out = list(done)
    for sender, receiver, seconds in transfers:
        finish = most(done[sender], done[receiver]) + seconds
        out[sender] = most(out[sender], finish)
        out[receiver] = most(out[receiver], finish)
    return out


def _window(p: int, m: int, v: int) -> tuple[int, int, int, int]:
    """(first, end, period, length) in columns: every rank is in its steady (F, B) pairs from
    column ``first`` to ``end``; there a column equals the one ``period`` = 2 · microbatches
    per round · v columns later (a step's forward and backward chunks repeat every round · v
    steps: :func:`interleaved_steps`' fwd_chunk and bwd_chunk); ``length``: the longest row."""
    per_round, total, ranks = _layout(p, m, v)
    first = max(base for _, _, base in ranks)
    end = min(base + 2 * (total - warmup) for warmup, _, base in ranks)
    return first, end, 2 * per_round * v, max(base + 2 * total for _, _, base in ranks)


def _same_state(now: list[float], then: list[float]) -> bool:
    """Whether two end-time vectors are equal but for a shift of all of them (TOLERANCE)."""
    top_now, top_then = max(now), max(then)
    bound = TOLERANCE * max(abs(top_now), abs(top_then))
    return all(abs((a - top_now) - (b - top_then)) <= bound for a, b in zip(now, then))


def _period_power(end: list[float], columns: list[Column], periods: int) -> list[float]:
    """The end times after ``periods`` repeats of ``columns``: the period's max-plus matrix A
    (row r: rank r's end as the max over ranks j of A[r, j] + its start end[j]) from walking
    the period once on the identity, then A^periods applied by squaring (Baccelli, Cohen,
    Olsder and Quadrat, Synchronization and Linearity, 1992, ch. 3: the max-plus product is
    associative, so A^n x = A^(2^a) (A^(2^b) (... x)) for the bits of n)."""
    p = len(end)
    rows = list(np.where(np.eye(p, dtype=bool), 0.0, -np.inf))
    for column in columns:
        rows = _advance(rows, column, np.maximum)
    matrix, x = np.array(rows), np.array(end, dtype=float)
    while periods:
        if periods & 1:
            x = (matrix + x[None, :]).max(axis=1)
        periods >>= 1
        if periods:
            matrix = np.array([(row[:, None] + matrix).max(axis=0) for row in matrix])
    return x.tolist()


def _fallback_work(p: int, periods: int) -> int:
    """The fallback's work, element by element: the period's p·period slots walked on p start
    vectors (counted by the caller as p per column step), then per bit of ``periods`` one
    p×p product (p³) and one matrix-vector product (p²): a bound, each numpy element far
    cheaper than a walked slot."""
    bits = periods.bit_length()
    return max(0, bits - 1) * p ** 3 + bits * p * p


def _walk(p: int, m: int, v: int, fwd_s: Sequence[float], bwd_s: Sequence[float],
          comm: Sequence[float], action_s: float,
          max_periods: int = MAX_PERIODS) -> tuple[float, int]:
    """(makespan, work) of the table walked column by column with its steady periods skipped
    (module docstring); work: rank-steps walked, p per column, plus the fallback's
    (:func:`_fallback_work`). Each steady column is built once and reused every period."""
    first, stop, period, length = _window(p, m, v)
    end, t, work = [0.0] * p, 0, 0
    marks: list[list[float]] = []  # the end times at each steady period's first column
    steady: dict[int, Column] = {}
    skipping = True

    def column(at: int) -> Column:
        if not first <= at < stop:
            return _column(p, m, v, at, fwd_s, bwd_s, comm, action_s)
        phase = (at - first) % period
        if phase not in steady:
            steady[phase] = _column(p, m, v, at, fwd_s, bwd_s, comm, action_s)
        return steady[phase]

    while t < length:
        if skipping and t >= first and (t - first) % period == 0 and t + period <= stop:
            left = (stop - t) // period  # whole periods before the window ends
            back = next((k for k in range(1, min(MAX_CYCLICITY, len(marks)) + 1)
                         if _same_state(end, marks[-k])), None)
            if back is not None:  # each k periods from here add the same shift
                repeats = left // back
                shift = max(end) - max(marks[-back])
                end = [e + repeats * shift for e in end]
                t += repeats * back * period
                skipping = False
                continue
            if len(marks) >= max_periods:  # not periodic yet: the period's matrix, exactly
                columns = [column(t + i) for i in range(period)]
                end = _period_power(end, columns, left)
                work += p * period + _fallback_work(p, left)
                t += left * period
                skipping = False
                continue
            marks.append(end)
        end = _advance(end, column(t))
        work += p
        t += 1
    return max(end, default=0.0), work


def interleaved_slots(p: int, m: int, v: int) -> int:
    """The most work :func:`interleaved_makespan_s` does for p ranks, m microbatches and v
    stages per rank (rank-steps, as :func:`_walk` counts), in O(p) before it runs: every
    column of the table where no steady period can be skipped; else the columns before the
    steady window, at most max_periods + MAX_CYCLICITY periods in it, the columns after it,
    and the fallback's work. Independent of m but for the fallback's log2 term; what a
    caller's work budget counts (planner/fidelity/work.py)."""
    first, stop, period, length = _window(p, m, v)
    boundaries = max(0, (stop - first) // period)  # steady periods' first columns to compare
    if boundaries <= 1:
        return p * length
    walked = first + (min(boundaries, MAX_PERIODS) + MAX_CYCLICITY) * period + (length - stop)
    work = p * min(length, walked)
    if boundaries > MAX_PERIODS:  # the fallback may run, on at most the periods left
        work += p * period + _fallback_work(p, boundaries)
    return work


def interleaved_makespan_s(p: int, m: int, v: int, fwd_s: Sequence[float],
                           bwd_s: Sequence[float], comm_s: float | Sequence[float] = 0.0,
                           action_s: float = 0.0) -> float:
    """:func:`makespan_s` of torch 2.6's interleaved 1F1B table (:func:`interleaved_steps`),
    walked without building it and with its steady periods skipped: work independent of m
    (:func:`interleaved_slots`; module docstring)."""
    if len(fwd_s) != p * v:
        raise ValueError(f"{len(fwd_s)} forward times; need p * v = {p * v} (one per chunk)")
    _check_times(fwd_s, bwd_s)
    return _walk(p, m, v, fwd_s, bwd_s, _boundary_times(comm_s, p * v), action_s)[0]
