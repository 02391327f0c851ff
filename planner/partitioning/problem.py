"""Stage partitioner: split a layer sequence into pipeline chunks.

The model is a sequence of L layers.  It is cut into K = p*v contiguous,
non-empty chunks in order; chunk k runs on rank ``k % p`` (v virtual stages
per rank, v = 1 is the plain pipeline), or on the rank a problem's ``chunk_ranks`` names
(DualPipe's mirrored placement, :func:`mirrored_ranks`).  Every chunk picks one recompute mode
for all its layers, or, when the problem allows it, recomputes only its first c transformer
blocks (Megatron's ``--recompute-method block``: see ``PartitionProblem.partial``).  We minimise the pipeline bottleneck: the largest per-rank
sum of chunk times (plus one boundary transfer for every chunk but the last),
subject to a per-rank memory capacity; with interleaved chunks the largest chunk first (step 0
of the tie-break rule below).  The capacity may depend on the recompute
mode (recomputing rebuilds activations: a larger transient and more allocator
fragmentation): a rank fits when its memory is within the capacity of every mode
its chunks use, i.e. ``min(capacity[r] for r used on the rank)``.

Tie-break rule (identical in the ILP and in the DP, so both return the same
partition, not only the same objective):

0. smallest largest chunk time ``C`` (boundary included). With one chunk per rank (v = 1)
   ``C = B`` and this step changes nothing; with interleaved chunks (v > 1) the step time of
   the interleaved 1F1B order is at most ``(M*v + p - 1) * C`` and exactly that for equal chunks,
   while chunks of very different times on balanced ranks stall its steady state
   (:mod:`planner.partitioning.largest_chunk`: the bounds, their sources and tests);
1. among those, smallest bottleneck ``B``;
2. among those, smallest total compute time ``T`` (= least recompute);
3. among those, the lexicographically smallest sequence
   ``(end_0, mode_0, end_1, mode_1, ...)``: walking the chunks in order, each
   chunk is as short as possible, then uses the lowest-index option (the R modes
   by index, then partial recompute of c blocks as option ``R + c - 1``).

Values within a relative tolerance of ``TIE_RTOL`` count as equal in 0, 1 and 2.

The MILP proves all of them itself (0 exactly by bisection for the block-count model or as a
variable of the boundary model, 1 with ``C <= C*``, 2 with ``B <= B*`` too, 3 with ``T <= T*`` too,
chunk by chunk: :mod:`planner.partitioning.lexicographic`) and never sees the DP's
answer; the DP (:mod:`planner.partitioning.dp`) is the test oracle and, labelled as
such, the fallback when a solver fails.  This module holds the problem, the
result and their scoring; the entry point is :mod:`planner.partitioning.solve`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from planner.core.units import GIB

TIE_RTOL = 1e-9
"""Relative tolerance under which two bottlenecks / total times are a tie."""

class PartitionError(ValueError):
    """An instance that has no valid partition (or is malformed)."""


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=float, copy=True)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class PartitionProblem:
    """Per-layer costs of one model, independent of how it is split.

    Attributes:
        time_s: (L, R) forward+backward seconds per microbatch of layer i
            under mode r (recompute adds forward time).
        state_bytes: (L,) model-state bytes (weights, grads, optimizer).
        act_bytes: (L, R) activation bytes held per in-flight microbatch.
        inflight: (K,) microbatches whose activations chunk k holds at peak.
        capacity_bytes: bytes per GPU for states and activations: one number, or
            one per mode (R,) when recomputing leaves less room.
        modes: names of the R recompute modes, in preference order (index 0
            wins ties after time).
        boundary_s: seconds to ship one microbatch across a chunk boundary;
            a scalar or a (K-1,) array, added to every chunk but the last.
        extra_bytes: optional (p,) constant bytes per rank (buffers, ...).
        partial: optional (base, full) mode indices: a chunk may also recompute only its
            first c blocks under mode ``full`` and run its other layers under ``base``
            (1 <= c < its block count: c = 0 is ``base`` and c = all is ``full``). Megatron-LM's
            --recompute-method block (TransformerConfig.recompute_num_layers: "When
            recompute_method is block, recompute_num_layers is the number of transformer layers
            to recompute within each pipeline stage"). Recomputing a block must cost time and
            save memory (``full`` no faster and no heavier than ``base`` on every block), so the
            least c that fits is a chunk's fastest partial option.
        blocks: (L,) which layers are the transformer blocks the partial option counts (the
            embedding and the head are never recomputed); default every layer.
        chunk_ranks: optional (K,) rank of each chunk; None: chunk k on rank ``k % p`` (the
            interleaved placement). Every rank holds K / p chunks; a rank's time and memory
            sum its chunks wherever they sit (:func:`mirrored_ranks`: DualPipe's).
    """

    time_s: np.ndarray
    state_bytes: np.ndarray
    act_bytes: np.ndarray
    inflight: np.ndarray
    capacity_bytes: float
    modes: tuple[str, ...] = ("none",)
    boundary_s: float | np.ndarray = 0.0
    extra_bytes: np.ndarray | None = None
    partial: tuple[int, int] | None = None
    blocks: np.ndarray | None = None
    chunk_ranks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        t = np.atleast_2d(np.asarray(self.time_s, dtype=float))
        a = np.atleast_2d(np.asarray(self.act_bytes, dtype=float))
        s = np.asarray(self.state_bytes, dtype=float).reshape(-1)
        if t.shape[0] != s.shape[0] and t.shape[1] == s.shape[0]:
            raise PartitionError("time_s must have shape (layers, modes)")
        if t.shape != a.shape:
            raise PartitionError(
                f"time_s {t.shape} and act_bytes {a.shape} must have the same shape (layers, modes)"
            )
        if s.shape[0] != t.shape[0]:
            raise PartitionError(f"state_bytes has {s.shape[0]} layers, time_s has {t.shape[0]}")
        modes = tuple(self.modes)
        if len(modes) != t.shape[1]:
            raise PartitionError(f"{len(modes)} mode names for {t.shape[1]} mode columns")
        for name, arr in (("time_s", t), ("state_bytes", s), ("act_bytes", a)):
            if not np.all(np.isfinite(arr)) or np.any(arr < 0):
                raise PartitionError(f"{name} must be finite and non-negative")
        object.__setattr__(self, "time_s", _readonly(t))
        object.__setattr__(self, "act_bytes", _readonly(a))
        object.__setattr__(self, "state_bytes", _readonly(s))
        object.__setattr__(self, "inflight", _readonly(np.asarray(self.inflight, dtype=float).reshape(-1)))
        object.__setattr__(self, "modes", modes)
        b = np.asarray(self.boundary_s, dtype=float)
        object.__setattr__(self, "boundary_s", float(b) if b.ndim == 0 else _readonly(b.reshape(-1)))
        if self.extra_bytes is not None:
            object.__setattr__(self, "extra_bytes", _readonly(np.asarray(self.extra_bytes).reshape(-1)))
        cap = np.asarray(self.capacity_bytes, dtype=float)
        if cap.ndim == 0:
            object.__setattr__(self, "capacity_bytes", float(cap))
        elif cap.shape != (t.shape[1],) or not np.all(np.isfinite(cap)):
            raise PartitionError(f"capacity_bytes needs one finite number or one per mode ({t.shape[1]})")
        else:
            object.__setattr__(self, "capacity_bytes", _readonly(cap))
        if self.chunk_ranks is not None:
            object.__setattr__(self, "chunk_ranks", tuple(int(r) for r in self.chunk_ranks))
        self._check_partial(t, a)

    def _check_partial(self, t: np.ndarray, a: np.ndarray) -> None:
        blocks = np.ones(t.shape[0], dtype=bool) if self.blocks is None else \
            np.asarray(self.blocks, dtype=bool).reshape(-1)
        if blocks.shape[0] != t.shape[0]:
            raise PartitionError(f"blocks has {blocks.shape[0]} entries, time_s {t.shape[0]} layers")
        blocks = blocks.copy()
        blocks.setflags(write=False)
        object.__setattr__(self, "blocks", blocks)
        if self.partial is None:
            return
        base, full = (int(x) for x in self.partial)
        if not (0 <= base < t.shape[1] and 0 <= full < t.shape[1]) or base == full:
            raise PartitionError(f"partial needs two different mode indices, got {self.partial}")
        object.__setattr__(self, "partial", (base, full))
        if np.any(t[blocks, full] < t[blocks, base]) or np.any(a[blocks, full] > a[blocks, base]):
            raise PartitionError("partial recompute needs the recompute mode no faster and no "
                                 "heavier than the base mode on every block")

    @property
    def num_layers(self) -> int:
        return int(self.time_s.shape[0])

    @property
    def num_modes(self) -> int:
        return int(self.time_s.shape[1])

    @property
    def mode_capacity(self) -> np.ndarray:
        """(R,) capacity when a rank uses mode r."""
        return np.broadcast_to(np.asarray(self.capacity_bytes, dtype=float), (self.num_modes,))


@dataclass(frozen=True)
class Chunk:
    """Layers ``[first, last_exclusive)`` with one recompute mode.

    ``time_s`` includes the boundary transfer when the chunk is not the last;
    ``memory_bytes`` is state plus ``inflight[k]`` times activations (without
    the rank's ``extra_bytes``). ``recompute_layers``: None when ``recompute`` applies to every
    layer; c when only the first c blocks run under ``recompute`` and the rest under the
    problem's partial base mode (Megatron's block method).
    """

    first: int
    last_exclusive: int
    recompute: str
    time_s: float
    memory_bytes: float
    recompute_layers: int | None = None


@dataclass(frozen=True)
class Partition:
    """A split with its per-rank cost and how it was obtained."""

    chunks: tuple[Chunk, ...]
    rank_time_s: tuple[float, ...]
    rank_memory_bytes: tuple[float, ...]
    bottleneck_s: float
    method: str
    optimal: bool
    gap: float = 0.0
    note: str = ""
    rank_capacity_bytes: tuple[float, ...] = ()

    @property
    def label(self) -> str:
        """How the split was found, for output: ``ilp-highs``, ``dp (solver failed: ...)``,
        ``ilp-cbc, not proven optimal: gap 1.2% (...)``."""
        text = self.method
        if not self.optimal:
            text += f", not proven optimal: gap {self.gap:.1%}"
        return f"{text} ({self.note})" if self.note else text

    @property
    def boundaries(self) -> tuple[int, ...]:
        """End (exclusive) of every chunk."""
        return tuple(c.last_exclusive for c in self.chunks)

    @property
    def recompute(self) -> tuple[str, ...]:
        return tuple(c.recompute for c in self.chunks)

    @property
    def recompute_layers(self) -> tuple[int | None, ...]:
        return tuple(c.recompute_layers for c in self.chunks)


# ---------------------------------------------------------------- shared helpers


@dataclass(frozen=True, eq=False)
class Prepared:
    """Validated, normalised view of a problem for a given (K, p).

    Prefix sums make any chunk's time/memory O(1): layers [i, j) under mode r
    cost ``pt[j, r] - pt[i, r]`` seconds.
    """

    problem: PartitionProblem
    K: int
    p: int
    pt: np.ndarray  # (L+1, R) prefix time
    ps: np.ndarray  # (L+1,) prefix state
    pa: np.ndarray  # (L+1, R) prefix activation
    bnd: np.ndarray  # (K,) boundary seconds per chunk (0 for the last)
    inflight: np.ndarray  # (K,)
    extra: np.ndarray  # (p,)
    cap: np.ndarray  # (R,) capacity of a rank that uses mode r
    rank_of: tuple[int, ...] = ()  # (K,) the rank of each chunk
    rank_chunks: tuple[tuple[int, ...], ...] = ()  # (p,) each rank's chunks, in layer order
    nb: np.ndarray | None = None  # (L+1,) blocks before each layer (partial recompute only)
    dt: np.ndarray | None = None  # (blocks+1,) prefix of each block's extra time recomputed
    da: np.ndarray | None = None  # (blocks+1,) prefix of each block's activation change (<= 0)

    def chunks_of(self, rho: int) -> tuple[int, ...]:
        """The chunks on rank ``rho``, in layer order."""
        return self.rank_chunks[rho]

    @property
    def cap_max(self) -> float:
        return float(self.cap.max())

    @property
    def L(self) -> int:
        return self.problem.num_layers

    @cached_property
    def R(self) -> int:
        """The problem's modes (cached: read for every option the partitioner prices)."""
        return self.problem.num_modes

    @property
    def n_options(self) -> int:
        """Option indices a chunk may take: the R modes, then partial recompute of c blocks as
        ``R + c - 1`` (c < the model's block count)."""
        if self.nb is None:
            return self.R
        return self.R + max(int(self.nb[-1]) - 1, 0)

    def partial_count(self, o: int) -> int | None:
        """Blocks recomputed by option ``o``: None for a whole-chunk mode."""
        return None if o < self.R else o - self.R + 1

    def option_mode(self, o: int) -> int:
        """The mode an option's recomputed layers run (its name and capacity)."""
        return o if o < self.R else self.problem.partial[1]

    def option_cap(self, o: int) -> float:
        return float(self.cap[self.option_mode(o)])

    def blocks_in(self, i: int, j: int) -> int:
        return int(self.nb[j] - self.nb[i]) if self.nb is not None else 0

    def partial_options(self, i: int, j: int) -> range:
        """The partial options of a chunk of layers [i, j): c = 1 .. blocks - 1."""
        if self.nb is None:
            return range(0)
        return range(self.R, self.R + max(self.blocks_in(i, j) - 1, 0))

    def chunk_time(self, k: int, i: int, j: int, r: int) -> float:
        """Seconds of chunk k = layers [i, j) under option r, boundary included (inf for a
        partial count the chunk cannot take)."""
        if r < self.R:
            return float(self.pt[j, r] - self.pt[i, r] + self.bnd[k])
        c, b = r - self.R + 1, self.problem.partial[0]
        if not 1 <= c < self.blocks_in(i, j):
            return math.inf
        q = int(self.nb[i])
        return float(self.pt[j, b] - self.pt[i, b] + self.dt[q + c] - self.dt[q] + self.bnd[k])

    def chunk_mem(self, k: int, i: int, j: int, r: int) -> float:
        if r < self.R:
            return float(self.ps[j] - self.ps[i] + self.inflight[k] * (self.pa[j, r] - self.pa[i, r]))
        c, b = r - self.R + 1, self.problem.partial[0]
        if not 1 <= c < self.blocks_in(i, j):
            return math.inf
        q = int(self.nb[i])
        return float(self.ps[j] - self.ps[i] + self.inflight[k] * (
            self.pa[j, b] - self.pa[i, b] + self.da[q + c] - self.da[q]))

    def rank_capacity(self, modes: Sequence[int]) -> float:
        """Capacity of a rank whose chunks use options ``modes``: the smallest of theirs."""
        return float(min(self.option_cap(r) for r in modes)) if len(modes) else self.cap_max

    def least_partial(self, k: int, i, j):
        """Per chunk k = layers [i, j) (arrays of equal shape): the least c (1 <= c < blocks)
        whose partial option fits the recompute mode's capacity beside the rank's extra bytes,
        0 where none does. Recomputing more blocks only costs time (``partial``'s condition),
        so with one chunk per rank this is the chunk's one useful partial option."""
        i, j = np.asarray(i), np.asarray(j)
        if self.nb is None:
            return np.zeros(np.broadcast(i, j).shape, dtype=int)
        b, f = self.problem.partial
        room = self.cap[f] * (1 + TIE_RTOL) + 1e-300 - self.extra[self.rank_of[k]]
        base = self.ps[j] - self.ps[i] + self.inflight[k] * (self.pa[j, b] - self.pa[i, b])
        q = self.nb[i]
        target = self.da[q] + (room - base) / self.inflight[k]  # da[q + c] <= target
        first = np.searchsorted(-self.da, -target, side="left")
        c = np.maximum(first - q, 1)
        ok = (c < self.nb[j] - q) & (first < len(self.da))
        return np.where(ok, c, 0)


def _by_rank(rank_of: tuple[int, ...], p: int) -> tuple[tuple[int, ...], ...]:
    out: list[list[int]] = [[] for _ in range(p)]
    for k, r in enumerate(rank_of):
        out[r].append(k)
    return tuple(tuple(ks) for ks in out)


def prepare(problem: PartitionProblem, num_chunks: int, p: int) -> Prepared:
    """Validate (K, p) against the problem; raise PartitionError on misuse."""
    L = problem.num_layers
    K = int(num_chunks)
    p = int(p)
    if p < 1 or K < 1:
        raise PartitionError(f"need at least one stage (got {K} chunks over {p} ranks)")
    if K % p:
        raise PartitionError(f"{K} chunks cannot be spread evenly over {p} ranks: use a multiple of pp")
    if K > L:
        if K == p:
            raise PartitionError(f"cannot split {L} layers into {K} stages: use pp <= {L}")
        raise PartitionError(
            f"cannot split {L} layers into {K} chunks ({p} stages x {K // p} virtual): use pp*v <= {L}"
        )
    inflight = problem.inflight
    if inflight.shape[0] != K:
        raise PartitionError(f"inflight has {inflight.shape[0]} entries, need one per chunk ({K})")
    b = problem.boundary_s
    if isinstance(b, float):
        bnd = np.full(K, b)
    else:
        if b.shape[0] != K - 1:
            raise PartitionError(f"boundary_s has {b.shape[0]} entries, need {K - 1} (one per boundary)")
        bnd = np.concatenate([b, [0.0]])
    bnd[K - 1] = 0.0
    extra = np.zeros(p) if problem.extra_bytes is None else np.asarray(problem.extra_bytes, dtype=float)
    if extra.shape[0] != p:
        raise PartitionError(f"extra_bytes has {extra.shape[0]} entries, need one per rank ({p})")
    rank_of = tuple(k % p for k in range(K)) if problem.chunk_ranks is None else problem.chunk_ranks
    if problem.chunk_ranks is not None and (len(rank_of) != K or any(
            not 0 <= r < p for r in rank_of) or any(rank_of.count(r) != K // p for r in range(p))):
        raise PartitionError(f"chunk_ranks {rank_of} must place {K // p} of the {K} chunks on "
                             f"each of {p} ranks")
    z = np.zeros((1, problem.num_modes))
    nb = dt = da = None
    if problem.partial is not None:
        b, f = problem.partial
        blocks = problem.blocks
        nb = np.concatenate([[0], np.cumsum(blocks)]).astype(int)
        dt = np.concatenate([[0.0], np.cumsum(problem.time_s[blocks, f] - problem.time_s[blocks, b])])
        da = np.concatenate([[0.0], np.cumsum(problem.act_bytes[blocks, f]
                                              - problem.act_bytes[blocks, b])])
    return Prepared(
        problem=problem,
        K=K,
        p=p,
        pt=np.vstack([z, np.cumsum(problem.time_s, axis=0)]),
        ps=np.concatenate([[0.0], np.cumsum(problem.state_bytes)]),
        pa=np.vstack([z, np.cumsum(problem.act_bytes, axis=0)]),
        bnd=bnd,
        inflight=np.asarray(inflight, dtype=float),
        extra=extra,
        cap=np.array(problem.mode_capacity, dtype=float),
        rank_of=rank_of,
        rank_chunks=_by_rank(rank_of, p),
        nb=nb, dt=dt, da=da,
    )


def mirrored_ranks(num_chunks: int) -> tuple[int, ...]:
    """DualPipe's placement (planner/pipeline/dualpipe.py) as chunks on K / 2 ranks: the model's
    K = pp stages in layer order, stage c on rank c for c < K / 2 and on rank K - 1 - c otherwise,
    so a rank holds a shallow stage and its mirror, the first and last on rank 0 (DeepSeek-V3
    report sec. 3.2.3: "we deploy the shallowest layers (including the embedding layer) and
    deepest layers (including the output head) of the model on the same PP rank"). DualPipe's
    rank r holds stages r and pp - 1 - r and rank pp - 1 - r the same two, with the same
    activations held of each (dualpipe.held_at_peak), so the two are one rank here: its time
    (both stages per microbatch pair) and its memory (both stages' states and activations)."""
    K = int(num_chunks)
    if K < 2 or K % 2:
        raise PartitionError(f"DualPipe's mirrored placement needs an even stage count, got {K}")
    return tuple(c if c < K // 2 else K - 1 - c for c in range(K))


def le_tol(a: float, b: float) -> bool:
    """``a <= b`` up to the tie tolerance."""
    return a <= b + TIE_RTOL * max(abs(b), 1e-300) + 1e-300


def score_split(
    prep: Prepared,
    ends: Sequence[int],
    modes: Sequence[int],
    *,
    method: str,
    optimal: bool = False,
    gap: float = 0.0,
    note: str = "",
    check_memory: bool = False,
) -> Partition:
    """Build a :class:`Partition` from chunk ends and mode indices."""
    p = prep.p
    names = prep.problem.modes
    chunks = []
    rank_t = [0.0] * p
    rank_m = [float(x) for x in prep.extra]
    rank_modes: list[list[int]] = [[] for _ in range(p)]
    start = 0
    for k, (e, r) in enumerate(zip(ends, modes)):
        t = prep.chunk_time(k, start, e, r)
        m = prep.chunk_mem(k, start, e, r)
        chunks.append(Chunk(start, int(e), names[prep.option_mode(int(r))], t, m,
                            prep.partial_count(int(r))))
        rho = prep.rank_of[k]
        rank_t[rho] += t
        rank_m[rho] += m
        rank_modes[rho].append(int(r))
        start = e
    rank_cap = tuple(prep.rank_capacity(ms) for ms in rank_modes)
    if check_memory:
        over = [m - c for m, c in zip(rank_m, rank_cap)]
        worst = int(np.argmax(over))
        if not le_tol(rank_m[worst], rank_cap[worst]):
            raise PartitionError(
                f"this split needs {rank_m[worst] / GIB:.1f} GiB on rank {worst}, "
                f"more than {rank_cap[worst] / GIB:.1f} GiB per GPU"
            )
    return Partition(
        chunks=tuple(chunks),
        rank_time_s=tuple(rank_t),
        rank_memory_bytes=tuple(rank_m),
        bottleneck_s=max(rank_t),
        method=method,
        optimal=optimal,
        gap=gap,
        note=note,
        rank_capacity_bytes=rank_cap,
    )


def option_indices(problem: PartitionProblem, part: Partition) -> list[int]:
    """Each chunk's option index (its mode's, or ``R + c - 1`` for c blocks recomputed)."""
    return [problem.modes.index(c.recompute) if c.recompute_layers is None
            else problem.num_modes + c.recompute_layers - 1 for c in part.chunks]


def fits(part: Partition) -> bool:
    """Every rank within the capacity of the modes it uses (up to the tie tolerance)."""
    return all(le_tol(m, c) for m, c in zip(part.rank_memory_bytes, part.rank_capacity_bytes))


def total_compute_s(prep: Prepared, ends: Sequence[int], modes: Sequence[int]) -> float:
    """Sum of chunk compute time (boundaries excluded: they are a constant)."""
    start, tot = 0, 0.0
    for k, (e, r) in enumerate(zip(ends, modes)):
        tot += prep.chunk_time(k, start, e, int(r)) - float(prep.bnd[k])
        start = e
    return tot


# ---------------------------------------------------------------- bounds


def simple_lower_bound(prep: Prepared) -> float:
    """Simple valid lower bound on the bottleneck (for the reported gap)."""
    tmin = prep.problem.time_s.min(axis=1)
    return max((float(tmin.sum()) + float(prep.bnd.sum())) / prep.p, float(tmin.max()))


def relative_gap(value: float, lower: float) -> float:
    return max(0.0, (value - lower) / value) if value > 0 else 0.0
