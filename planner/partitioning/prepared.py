"""The solvers' shared view of a partition problem for K chunks on p ranks (`prepare`):
validated, with prefix sums that price any chunk (layers [i, j) under an option) in O(1), and the
simple lower bound on the bottleneck that a solver's reported gap is measured against."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from planner.partitioning.problem import TIE_RTOL, PartitionError, PartitionProblem


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


# ---------------------------------------------------------------- bounds


def simple_lower_bound(prep: Prepared) -> float:
    """Simple valid lower bound on the bottleneck (for the reported gap)."""
    tmin = prep.problem.time_s.min(axis=1)
    return max((float(tmin.sum()) + float(prep.bnd.sum())) / prep.p, float(tmin.max()))


def relative_gap(value: float, lower: float) -> float:
    return max(0.0, (value - lower) / value) if value > 0 else 0.0
