"""Pipeline schedules: which compute op each rank runs, in which order.

A schedule is a tuple with one entry per pipeline rank; each entry is the ordered tuple of compute
ops (`F`, `B`, and for zero-bubble `W`) that rank executes.  The model is cut into `p * v` chunks;
global chunk `c * p + r` lives on rank `r` (virtual slot `c`), so with `v == 1` chunk `r` is rank
`r`'s stage.  `with_communication` adds the point-to-point SEND/RECV ops between neighbouring
ranks, and `find_deadlock` executes such op lists under blocking rendezvous semantics to prove
(or refute) that they finish.  Timing lives in `planner/pipeline/simulate.py`.

Schedules (see DESIGN.md §3):
- gpipe: all forwards, then all backwards in reverse microbatch order (Huang et al. 2019).
- 1f1b: PipeDream-Flush; rank i runs min(p-i-1, M) warm-up forwards, then alternates (Narayanan 2021).
- interleaved: Megatron's interleaved 1F1B with v chunks per rank (Narayanan et al. 2021 §2.2).
- zb-h1: 1F1B with the backward split into B (input grad) and W (weight grad); rank i defers its
  W ops by i microbatches so they fill the cool-down bubble (Qi et al. 2023, ZB-H1).
- zb-2p: zero bubble under the 2p activation limit (Qi et al. 2023's ZB-2p runs): rank i runs
  2(p - i) - 1 warm-up forwards, then B and F alternately, a W before any F that would hold more
  than 2p microbatches' activations, and in the cool-down a W before each B (see `_zb_2p`).
- dualpipe: DeepSeek-V3's bidirectional schedule, two directions of microbatches, forwards and
  full backwards of different microbatches overlapped in pairs (planner/pipeline/dualpipe.py).
  Its ops name the model stage they run (rank k for even microbatches, p - 1 - k for odd ones)
  and add the kind "BW", a backward that computes the input and weight gradients together.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import lru_cache

from planner.core.parallel import SCHEDULES, schedule_problem
from planner.core.schedules import (DUALPIPE, GPIPE, INTERLEAVED, ONE_F_ONE_B, ZB_2P, ZB_H1,
                                    schedule_traits)
from planner.pipeline import dualpipe
from planner.pipeline.ops import Op  # defined apart so dualpipe.py builds ops without a cycle
COMPUTE_KINDS = ("F", "B", "W", "BW")
COMM_KINDS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")


class ScheduleError(ValueError):
    """A schedule was asked for with arguments it cannot honour (one-line message)."""


def check_args(name: str, p: int, m: int, v: int) -> None:
    """Raise ScheduleError (one line) unless schedule `name` can run p ranks, m microbatches, v chunks."""
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    if not isinstance(p, int) or p < 1:
        raise ScheduleError(f"pipeline size (p) must be an integer >= 1, got {p!r}")
    if not isinstance(m, int) or m < 1:
        raise ScheduleError(f"microbatch count (m) must be an integer >= 1, got {m!r}")
    if not isinstance(v, int) or v < 1:
        raise ScheduleError(f"virtual stages (v) must be an integer >= 1, got {v!r}")
    problem = schedule_problem(name, p, m, v)
    # p = 1 interleaving runs, as a plain loop
    if problem and not (schedule_traits(name).takes_virtual_stages and p == 1):
        raise ScheduleError(f"{problem}; got {name} with p={p}, m={m}, v={v}")


def _gpipe(p: int, m: int, r: int) -> list[Op]:
    return [Op("F", i, r) for i in range(m)] + [Op("B", i, r) for i in reversed(range(m))]


def _one_f_one_b(p: int, m: int, r: int) -> list[Op]:
    warmup = min(p - r - 1, m)
    ops = [Op("F", i, r) for i in range(warmup)]
    for i in range(m - warmup):
        ops += [Op("F", warmup + i, r), Op("B", i, r)]
    ops += [Op("B", i, r) for i in range(m - warmup, m)]
    return ops


def _zb_h1(p: int, m: int, r: int) -> list[Op]:
    """1F1B order of F and B; W(j) follows B(j + r), the rest of the W ops close the step.

    Deferring W by r microbatches on rank r is what lets every rank's W ops fill the cool-down,
    where in 1F1B rank r waits for gradients to come back through the later ranks.
    """
    lag = r
    ops: list[Op] = []
    done_w = 0
    for op in _one_f_one_b(p, m, r):
        ops.append(op)
        if op.kind == "B" and op.microbatch - lag >= 0:
            ops.append(Op("W", op.microbatch - lag, r))
            done_w += 1
    ops += [Op("W", i, r) for i in range(done_w, m)]
    return ops


ZB_2P_LIMIT = ZB_2P.inflight_limit  # at most 2p microbatches' activations (F run, W not yet) a rank


def _zb_2p(p: int, m: int, r: int) -> list[Op]:
    """The zero-bubble order within a 2p activation limit, from the parallelogram the paper
    draws for its ZB-H2 schedule (Qi et al. 2023 §2.2: extra forwards in the warm-up fill the
    bubble before the first B, W passes fill the tail) and the 1F-1B-1W steady state its
    automatic scheduler settles in under a memory limit (§3).

    Rank r runs w = min(m, 2(p - r) - 1) warm-up forwards: exactly the forwards that fit before
    microbatch 0's input gradient comes back when F = B = W (rank r is free from time r, the
    gradient arrives at 2p - 1 - r). Then B and F alternate; before an F that would make more
    than 2p activations live (a microbatch's are held from its F to its W), the oldest pending
    W runs. The cool-down runs one pending W before each remaining B (filling the wait for the
    next gradient; not on the last rank, whose B waits only for its own F), then the rest of
    the W ops. Same order for any stage times (the paper's
    ZB-2p searches an order with the profiled times; this is its F = B = W shape).
    """
    limit = ZB_2P_LIMIT * p
    warmup = min(m, 2 * (p - r) - 1)
    ops = [Op("F", i, r) for i in range(warmup)]
    live, next_w = warmup, 0
    for i in range(m):
        if warmup + i >= m and next_w < i and r < p - 1:  # cool-down: a W fills the wait
            ops.append(Op("W", next_w, r))
            next_w += 1
        ops.append(Op("B", i, r))
        if warmup + i < m:
            if live == limit:
                ops.append(Op("W", next_w, r))
                next_w, live = next_w + 1, live - 1
            ops.append(Op("F", warmup + i, r))
            live += 1
    return ops + [Op("W", i, r) for i in range(next_w, m)]


def interleaved_order(p: int, m: int, v: int, r: int) -> list[Op]:
    """Megatron's interleaved 1F1B program for rank r.

    Virtual microbatch k (0..m*v-1) maps to a chunk and a microbatch in groups of p: forward k runs
    local chunk (k mod p*v) // p on microbatch (k // (p*v)) * p + k mod p; backward visits the
    chunks in reverse.  Warm-up forwards: (p - r - 1) * 2 + (v - 1) * p, capped at m*v.
    """
    total = m * v
    warmup = min((p - r - 1) * 2 + (v - 1) * p, total)

    def unpack(k: int, forward: bool) -> tuple[int, int]:
        in_group = k % (p * v)
        local = in_group // p
        if not forward:
            local = v - 1 - local
        return (k // (p * v)) * p + in_group % p, local * p + r

    ops = [Op("F", *unpack(k, True)) for k in range(warmup)]
    for i in range(total - warmup):
        ops.append(Op("F", *unpack(warmup + i, True)))
        ops.append(Op("B", *unpack(i, False)))
    ops += [Op("B", *unpack(k, False)) for k in range(total - warmup, total)]
    return ops


@lru_cache(maxsize=64)
def build_schedule(name: str, p: int, m: int, v: int = 1) -> tuple[tuple[Op, ...], ...]:
    """Per-rank ordered compute ops (F/B/W only) of schedule `name` for p ranks and m microbatches.

    Immutable and a pure function of its arguments, so it is memoised: the planner simulates many
    configurations with the same schedule shape. Raises ScheduleError on arguments the schedule cannot honour (unknown name, p/m/v < 1, v > 1
    outside interleaved, interleaved with m not divisible by p).
    """
    check_args(name, p, m, v)
    return tuple(tuple(_BUILDERS[name](p, m, v, r)) for r in range(p))


# each schedule's op order of rank r: (p, m, v, r) -> its ops
_BUILDERS = {GPIPE.name: lambda p, m, v, r: _gpipe(p, m, r),
             ONE_F_ONE_B.name: lambda p, m, v, r: _one_f_one_b(p, m, r),
             INTERLEAVED.name: interleaved_order,
             ZB_H1.name: lambda p, m, v, r: _zb_h1(p, m, r),
             ZB_2P.name: lambda p, m, v, r: _zb_2p(p, m, r),
             DUALPIPE.name: lambda p, m, v, r: dualpipe.rank_order(p, m, r)}


def _placement(compute_ops: tuple[tuple[Op, ...], ...]):
    """(microbatch, chunk) -> the rank that runs it: chunk k on rank k mod p, or, where a rank
    runs chunks not its own (DualPipe's reverse direction), whatever rank lists the op."""
    p = len(compute_ops)
    if all(op.chunk % p == r for r, ops in enumerate(compute_ops) for op in ops):
        return lambda mb, k: k % p
    where = {(op.microbatch, op.chunk): r for r, ops in enumerate(compute_ops) for op in ops}
    return lambda mb, k: where[(mb, k)]


def _exchange(prev: tuple[Op, ...], nxt: tuple[Op, ...], r: int, chunks: int,
              rank_of) -> tuple[list[Op], list[Op]]:
    """Sends owed by the outputs of the ops in `prev` and receives needed by the inputs of the
    ops in `nxt` on rank r (one op each, or DualPipe's overlapped F&B pair)."""
    sends: list[Op] = []
    recvs: list[Op] = []
    for op in prev:
        k = op.chunk
        if op.kind == "F" and k + 1 < chunks and rank_of(op.microbatch, k + 1) != r:
            sends.append(Op("SEND_F", op.microbatch, k, rank_of(op.microbatch, k + 1)))
        elif op.kind in ("B", "BW") and k > 0 and rank_of(op.microbatch, k - 1) != r:
            sends.append(Op("SEND_B", op.microbatch, k, rank_of(op.microbatch, k - 1)))
    for op in nxt:
        k = op.chunk
        if op.kind == "F" and k > 0 and rank_of(op.microbatch, k - 1) != r:
            recvs.append(Op("RECV_F", op.microbatch, k - 1, rank_of(op.microbatch, k - 1)))
        elif op.kind in ("B", "BW") and k + 1 < chunks and rank_of(op.microbatch, k + 1) != r:
            recvs.append(Op("RECV_B", op.microbatch, k + 1, rank_of(op.microbatch, k + 1)))
    return sends, recvs


def _units(ops: tuple[Op, ...]) -> list[tuple[Op, ...]]:
    """A rank's ops as the units it runs: one op, or an F with the paired BW after it."""
    units: list[tuple[Op, ...]] = []
    for op in ops:
        if op.paired and units:
            units[-1] = units[-1] + (op,)
        else:
            units.append((op,))
    return units


def _programs(compute_ops: tuple[tuple[Op, ...], ...]) -> list[list[Op | list[Op]]]:
    """Each rank's compute ops with, between consecutive units, the exchange (list of p2p ops).

    An exchange holds the sends of what the previous unit produced and the receives of what the
    next unit needs, listed in Megatron's parity order: even ranks send first, odd ranks
    receive first. An overlapped F&B pair is one unit: both inputs arrive before it and both
    outputs leave after it (deepseek-ai/DualPipe's _forward_backward_chunk).
    """
    chunks = 1 + max((op.chunk for ops in compute_ops for op in ops), default=-1)
    rank_of = _placement(compute_ops)
    programs = []
    for r, ops in enumerate(compute_ops):
        items: list[Op | list[Op]] = []
        prev: tuple[Op, ...] = ()
        for unit in _units(ops) + [()]:
            sends, recvs = _exchange(prev, unit, r, chunks, rank_of)
            if sends or recvs:
                items.append(recvs + sends if r % 2 else sends + recvs)
            items.extend(unit)
            prev = unit
        programs.append(items)
    return programs


def _safe_order(programs: list[list[Op | list[Op]]]) -> tuple[tuple[Op, ...], ...]:
    """Place every p2p op by running the programs once with non-blocking sends.

    The run treats a SEND as posted when its rank reaches it (like Megatron's isend) and blocks a
    rank only on a RECV whose SEND is not posted yet.  A pair is recorded, in both ranks' lists,
    at the moment it matches; within an exchange, even ranks post sends before taking receives
    and odd ranks the reverse.  The record is one global sequential execution in which each SEND
    met its RECV, so replaying the recorded lists with blocking rendezvous p2p cannot deadlock.
    """
    p = len(programs)
    ptr = [0] * p
    entered = [False] * p
    waiting: list[dict] = [{} for _ in range(p)]  # rank -> {(kind, mb, chunk, peer) of RECV: op}
    posted: dict = {}  # key of the matching RECV on the receiver -> (sender, SEND op)
    out: list[list[Op]] = [[] for _ in range(p)]
    work = deque(range(p))  # round-robin, one compute op per turn: sends land near their producer

    def take_posted(r: int) -> None:
        for key, op in list(waiting[r].items()):
            hit = posted.pop((r,) + key, None)
            if hit is not None:
                out[hit[0]].append(hit[1])
                out[r].append(op)
                del waiting[r][key]

    def post(r: int, sends: list[Op]) -> None:
        for op in sends:
            key = ("RECV" + op.kind[4:], op.microbatch, op.chunk, r)
            q = op.peer
            if key in waiting[q]:
                out[r].append(op)
                out[q].append(waiting[q].pop(key))
                if not waiting[q]:
                    work.append(q)
            else:
                posted[(q,) + key] = (r, op)

    while work:
        r = work.popleft()
        while ptr[r] < len(programs[r]):
            item = programs[r][ptr[r]]
            if isinstance(item, list) and not entered[r]:
                entered[r] = True
                sends = [o for o in item if o.kind.startswith("SEND")]
                waiting[r] = {(o.kind, o.microbatch, o.chunk, o.peer): o for o in item if o.kind.startswith("RECV")}
                if r % 2:
                    take_posted(r)
                    post(r, sends)
                else:
                    post(r, sends)
                    take_posted(r)
            if isinstance(item, list) and waiting[r]:
                break
            entered[r] = False
            ptr[r] += 1
            if not isinstance(item, list):
                out[r].append(item)
                work.append(r)
                break
    stuck = [r for r in range(p) if ptr[r] < len(programs[r])]
    if stuck or posted:
        raise ScheduleError(f"no deadlock-free p2p order exists for this op order (ranks {stuck} stuck)")
    return tuple(tuple(ops) for ops in out)


def with_communication(
    compute_ops: tuple[tuple[Op, ...], ...], *, order: str = "safe"
) -> tuple[tuple[Op, ...], ...]:
    """Insert SEND/RECV ops for activations (forward) and gradients (backward).

    Between two consecutive compute ops of a rank sits one *exchange*: the send of what the first
    produced and the receive of what the second needs.  Orders within an exchange:
    - "even-odd": Megatron's parity rule taken literally, even ranks send then receive, odd ranks
      receive then send.  It breaks the symmetric swap deadlock but not a receive that causally
      needs the send beside it (an odd rank turning from its last F to its first B waits for the
      gradient of the very activation it has not sent yet), so with blocking p2p it can deadlock;
      Megatron runs such pairs as batched non-blocking isend/irecv.
    - "safe" (default): the order of one run with non-blocking sends (see `_safe_order`), parity
      rule as the tie-break; a SEND may land later than right after its producer, where the
      receiver is ready for it.  Blocking rendezvous p2p replays it without deadlock; raises
      ScheduleError if the compute order itself cannot finish.
    - "naive": every rank sends first, the textbook deadlock, kept to test `find_deadlock`.
    p is len(compute_ops); the chunk count is one more than the largest chunk index.
    """
    if order not in ("safe", "even-odd", "naive"):
        raise ScheduleError(f"unknown communication order {order!r}; choose safe, even-odd or naive")
    programs = _programs(compute_ops)
    if order == "safe":
        return _safe_order(programs)
    out = []
    for r, items in enumerate(programs):
        flat: list[Op] = []
        for item in items:
            if not isinstance(item, list):
                flat.append(item)
            elif order == "naive":
                flat += [o for o in item if o.kind.startswith("SEND")] + [o for o in item if o.kind.startswith("RECV")]
            else:
                flat += item
        out.append(tuple(flat))
    return tuple(out)


@dataclass(frozen=True)
class Deadlock:
    """Ranks stuck under rendezvous semantics: `waiting` holds (rank, op index, op) per stuck rank."""

    waiting: tuple[tuple[int, int, Op], ...]
    finished: tuple[int, ...]

    def __str__(self) -> str:
        parts = [f"rank {r} waits at op #{i} {op}" for r, i, op in self.waiting]
        text = "deadlock: " + "; ".join(parts)
        if self.finished:
            text += f" (finished: ranks {', '.join(map(str, self.finished))})"
        return text


_PARTNER = {"SEND_F": "RECV_F", "RECV_F": "SEND_F", "SEND_B": "RECV_B", "RECV_B": "SEND_B"}


def find_deadlock(op_lists: tuple[tuple[Op, ...], ...]) -> Deadlock | None:
    """Run op lists with blocking rendezvous p2p; None if every rank finishes, else the Deadlock.

    Compute ops always complete; a SEND and its matching RECV (same direction, microbatch and
    chunk, peers pointing at each other) complete together only when both ranks stand at them.
    Worklist of ranks to advance, so the run is linear in the number of ops.
    """
    p = len(op_lists)
    ptr = [0] * p
    work = list(range(p))
    while work:
        r = work.pop()
        ops = op_lists[r]
        while ptr[r] < len(ops):
            op = ops[ptr[r]]
            if op.peer is None:
                ptr[r] += 1
                continue
            q = op.peer
            if not 0 <= q < p or ptr[q] >= len(op_lists[q]):
                break
            other = op_lists[q][ptr[q]]
            if (other.kind == _PARTNER[op.kind] and other.peer == r
                    and other.microbatch == op.microbatch and other.chunk == op.chunk):
                ptr[r] += 1
                ptr[q] += 1
                work.append(q)
                continue
            break
    stuck = tuple((r, ptr[r], op_lists[r][ptr[r]]) for r in range(p) if ptr[r] < len(op_lists[r]))
    if not stuck:
        return None
    return Deadlock(stuck, tuple(r for r in range(p) if ptr[r] >= len(op_lists[r])))

