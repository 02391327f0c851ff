"""DualPipe: DeepSeek's bidirectional pipeline schedule, its op order and its F&B pair time.

The schedule (DeepSeek-V3 Technical Report, arXiv:2412.19437, sec. 3.2.1, and the reference
implementation deepseek-ai/DualPipe, dualpipe/dualpipe.py ``DualPipe.step``): "It employs a
bidirectional pipeline scheduling, which feeds micro-batches from both ends of the pipeline
simultaneously". The model is cut into p stages; rank r holds stage r of the forward-direction
pipeline and stage p - 1 - r of the reverse one, so every stage's weights live on two ranks
("Parameter 2x" in the report's Table 2). Half the microbatches enter at rank 0, half at rank
p - 1. Here microbatch m runs in direction m % 2 (0: rank 0 first), the j-th of its direction
being m = 2j + direction; an op's ``chunk`` is the model stage it runs, so stage k of direction
0 is on rank k and stage k of direction 1 on rank p - 1 - k (`rank_of`).

Seen from a rank, "phase 0" is the direction in which it runs the earlier stage h = min(r,
p - 1 - r) and "phase 1" the direction in which it runs stage p - 1 - h (ranks r and p - 1 - r
run mirror-image programs). With n = p / 2 and H = M / 2 microbatches per direction, rank r
runs, in this order (the eight steps of ``DualPipe.step``, in our words):
  1. 2(n - h - 1) forwards of phase 0;
  2. h + 1 times: a forward of phase 0, then one of phase 1;
  3. n - h - 1 times: a phase-1 input-gradient backward (B), its weight gradient (W) at once,
     a phase-1 forward;
  4. H - p + h + 1 times: the pairs F0&B1 then F1&B0, each an F of one phase overlapped with
     a full backward of the other (on the two middle ranks the first F0&B1 runs as F0 then B1,
     not overlapped: the reference's "We don't overlap these two chunks to further reduce
     bubble size");
  5. n - h - 1 times: a full backward of phase 1, then F1&B0;
  6. h + 1 times: a backward of phase 1 then of phase 0, the first half full and, from the
     middle one on (from its phase-1 backward when h is odd, its phase-0 one when h is even),
     input gradient only, the weight gradient deferred;
  7. n - h - 1 times: the oldest deferred W, then a phase-0 B (W deferred);
  8. the h + 1 W left, oldest first.
Every microbatch's F, B and W then run once on each stage (tests/test_dualpipe.py).

Rules: "DualPipe only requires that the pipeline stages and micro-batches be divisible by 2"
(report sec. 3.2.1); the reference also asserts ``num_chunks >= num_ranks * 2`` (at least p
microbatches in each direction, so step 4 runs at least once on rank 0). core/parallel.py's
schedule_problem states them.

The F&B pair (report sec. 3.2.1): "for a pair of forward and backward chunks, we rearrange these
components and manually adjust the ratio of GPU SMs dedicated to communication versus
computation. In this overlapping strategy, we can ensure that both all-to-all and PP
communication can be fully hidden during execution." So a pair's compute (both chunks, the MoE
all-to-all taken out) runs back to back, and the all-to-all of both runs beside it on SMs taken
from the compute: the pair costs its compute, plus whatever all-to-all does not fit under it,
plus ``interference`` x the hidden part (the SMs the communication holds: sec. 3.2.2 "we
employ the warp specialization technique ... and partition 20 SMs into 10 communication
channels"; "only 20 SMs are sufficient to fully utilize the bandwidths of IB and NVLink"),
the same rule as the planner's other overlapped transfers (predict/data_parallel.py
overlapped_cost_s).
PP transfers stay latency on the dependency (pipeline/op_by_op.py), which every schedule
already takes off the compute stream.
"""

from __future__ import annotations

from functools import lru_cache

from planner.pipeline.ops import Op

NAME = "dualpipe"
# SMs DeepSeek's all-to-all kernels hold while they overlap compute (report sec. 3.2.2: "we
# employ the warp specialization technique (Bauer et al., 2014) and partition 20 SMs into 10
# communication channels")
COMM_SMS = 20


def direction(microbatch: int) -> int:
    """0: the microbatch enters at rank 0; 1: at rank p - 1."""
    return microbatch % 2


def rank_of(p: int, microbatch: int, stage: int) -> int:
    """The rank that runs ``stage`` of ``microbatch``."""
    return stage if microbatch % 2 == 0 else p - 1 - stage


def rank_order(p: int, m: int, r: int) -> list[Op]:
    """Rank r's program (module docstring): F, B (input gradient), W (weight gradient), BW (full
    backward) ops; a BW with ``paired`` runs overlapped with the F just before it."""
    n, half = p // 2, m // 2
    h = min(r, p - 1 - r)
    # the direction of each phase on this rank, and the stage it runs there
    dirs = (0, 1) if r < n else (1, 0)
    stage = (h, p - 1 - h)
    nxt = {"F": [0, 0], "B": [0, 0]}  # next microbatch (within its direction) per kind, phase
    pending: list[Op] = []  # B ops whose W is deferred, oldest first
    ops: list[Op] = []

    def take(kind: str, phase: int) -> tuple[int, int]:
        j = nxt[kind][phase]
        nxt[kind][phase] += 1
        return 2 * j + dirs[phase], stage[phase]

    def forward(phase: int) -> None:
        ops.append(Op("F", *take("F", phase)))

    def backward(phase: int, split: bool = False, paired: bool = False) -> None:
        mb, k = take("B", phase)
        if split:
            ops.append(Op("B", mb, k))
            pending.append(Op("W", mb, k))
        else:
            ops.append(Op("BW", mb, k, paired=paired))

    def weight() -> None:
        ops.append(pending.pop(0))

    def pair(f_phase: int) -> None:
        forward(f_phase)
        backward(1 - f_phase, paired=True)

    for _ in range(2 * (n - h - 1)):  # 1
        forward(0)
    for _ in range(h + 1):  # 2
        forward(0)
        forward(1)
    for _ in range(n - h - 1):  # 3
        backward(1, split=True)
        weight()
        forward(1)
    for i in range(half - p + h + 1):  # 4
        if i == 0 and h == n - 1:  # the middle ranks do not overlap their first pair
            forward(0)
            backward(1)
        else:
            pair(0)
        pair(1)
    for _ in range(n - h - 1):  # 5
        backward(1)
        pair(1)
    split = False
    for i in range(h + 1):  # 6
        if i == (h + 1) // 2 and h % 2 == 1:
            split = True
        backward(1, split=split)
        if i == (h + 1) // 2 and h % 2 == 0:
            split = True
        backward(0, split=split)
    for _ in range(n - h - 1):  # 7
        weight()
        backward(0, split=True)
    while pending:  # 8
        weight()
    return ops


def pair_s(fwd_s: float, fwd_comm_s: float, bwd_s: float, bwd_comm_s: float,
           interference: float) -> float:
    """One F&B pair (module docstring): a forward of ``fwd_s`` (of it ``fwd_comm_s`` all-to-all)
    overlapped with a full backward of ``bwd_s`` (``bwd_comm_s``): the compute of both, the
    all-to-all that does not fit under it, and ``interference`` x the part that does."""
    compute = (fwd_s - fwd_comm_s) + (bwd_s - bwd_comm_s)
    comm = fwd_comm_s + bwd_comm_s
    exposed = max(0.0, comm - compute)
    return compute + exposed + interference * (comm - exposed)


def interference(sm_count: int | None, default: float) -> float:
    """Share of the compute the pair's all-to-all takes: COMM_SMS of the GPU's SMs, or
    ``default`` (the planner's measured mean, cost/constants.py) without an SM count."""
    return min(1.0, COMM_SMS / sm_count) if sm_count else default


def bubble_formula(p: int, fb_s: float, b_s: float, w_s: float) -> float:
    """The report's Table 2 (also the reference README's "Pipeline Bubbles and Memory Usage
    Comparison"): DualPipe's bubble "(PP/2-1)(F&B+B-3W)", with "F&B denotes the execution time
    of two mutually overlapped forward and backward chunks", B "a full backward chunk", W "a
    'backward for weights' chunk" (each rank's idle time, uniform stages)."""
    return (p / 2 - 1) * (fb_s + b_s - 3 * w_s)


@lru_cache(maxsize=64)
def held_at_peak(p: int, m: int) -> tuple[int, ...]:
    """Per stage k: the microbatches whose activations of stage k a rank holds when it holds the
    most (F to W or BW; Table 2: PP + 1 in all). Ranks r and p - 1 - r run mirror programs, so
    stage k's count is the same on both ranks that hold it: the memory formula's closed form
    (predict/pipeline_schedule.py), exact for equal stages; the simulator counts bytes for any."""
    out = [0] * p
    for r in range(p // 2):
        held: dict[int, int] = {}
        best, at = -1, {}
        for op in rank_order(p, m, r):
            if op.kind == "F":
                held[op.chunk] = held.get(op.chunk, 0) + 1
            elif op.kind in ("W", "BW"):
                held[op.chunk] -= 1
            if sum(held.values()) > best:
                best, at = sum(held.values()), dict(held)
        out[r], out[p - 1 - r] = at.get(r, 0), at.get(p - 1 - r, 0)
    return tuple(out)
