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
such, the fallback when a solver fails.  This module holds the problem (`PartitionProblem`,
DualPipe's chunk placement `mirrored_ranks`) and the tie tolerance; the solvers' shared view of
it is :mod:`planner.partitioning.prepared`, a split and its scoring
:mod:`planner.partitioning.split`, and the entry point :mod:`planner.partitioning.solve`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
