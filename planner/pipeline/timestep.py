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
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from functools import lru_cache

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


def interleaved_slots(p: int, m: int, v: int) -> int:
    """The slots (actions and idle steps, all ranks) of :func:`interleaved_steps`'s table,
    counted in O(p) before it is built: its rank r holds r pre-padding slots, its warm-up's
    forwards and the idle slots after them, and two slots for each of the m·v steps after. The
    table is walked slot by slot (:func:`makespan_s`) with no steady state skipped, so its work
    grows with m; a caller's work budget counts these (planner/fidelity/work.py)."""
    per_round, total = _rounds(p, m), m * v
    slots = 0
    for r in range(p):
        warmup = min((v - 1) * per_round + 2 * (p - 1 - r), total)
        post_warmup = (v * p + 2 * (p - 1 - r)) - (warmup + r)
        padding = max(0, post_warmup) if warmup else 0  # added after the last warm-up step
        slots += r + warmup + padding + 2 * total
    return slots


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
    if len(bwd_s) != chunks:
        raise ValueError(f"{len(bwd_s)} backward times for {chunks} chunks")
    comm = [float(comm_s)] * max(0, chunks - 1) if isinstance(comm_s, (int, float)) \
        else [float(x) for x in comm_s]
    if len(comm) != max(0, chunks - 1):
        raise ValueError(f"{len(comm)} transfer times for {chunks} chunks; need {chunks - 1}")
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


def interleaved_makespan_s(p: int, m: int, v: int, fwd_s: Sequence[float],
                           bwd_s: Sequence[float], comm_s: float | Sequence[float] = 0.0,
                           action_s: float = 0.0) -> float:
    """:func:`makespan_s` of torch 2.6's interleaved 1F1B table (:func:`interleaved_steps`)."""
    if len(fwd_s) != p * v:
        raise ValueError(f"{len(fwd_s)} forward times; need p * v = {p * v} (one per chunk)")
    return makespan_s(interleaved_steps(p, m, v), fwd_s, bwd_s, comm_s, action_s)
