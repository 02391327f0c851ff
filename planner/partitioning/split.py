"""A split of the layers into chunks: each chunk's layers, option, time and memory (`Chunk`),
each rank's cost (`Partition`), built from chunk ends and options by `score_split`; whether it
fits (`fits`) and its total compute (step 2 of the tie-break rule in
:mod:`planner.partitioning.problem`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from planner.core.units import GIB
from planner.partitioning.prepared import Prepared
from planner.partitioning.problem import PartitionError, PartitionProblem, le_tol


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
    # the simplex iterations the MILP spent on it (HiGHS's count; 0 for the DP, CBC or a given
    # split): the work the search's budget counts (planner/search/refinement.py), not the split
    work: int = field(default=0, compare=False)

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
