"""One stage split: the layers each chunk runs (Megatron's even split by default), the blocks its
recompute covers (Megatron's block method), and the split as arrays over its chunks: per-layer
costs summed into per-chunk time, parameters, activations and FLOPs (what the memory formula and
the step prediction read)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from planner.cost.layer import LayerCost
from planner.model.spec import ModelSpec


# the per-layer quantities a chunk sums over its layers
_SUMMED = ("fwd_s", "bwd_input_s", "bwd_weight_s", "params", "act_bytes", "model_flops",
           "hardware_flops", "expert_params", "a2a_s", "cache_bytes")


@dataclass(frozen=True, eq=False)
class ChunkArrays:
    """One split of the model: per-chunk totals for one microbatch, as arrays over the chunks
    (chunk k runs on pipeline rank k mod pp)."""

    first: np.ndarray
    last: np.ndarray
    recompute: tuple[str, ...]
    fwd_s: np.ndarray
    bwd_input_s: np.ndarray  # recompute included
    bwd_weight_s: np.ndarray
    params: np.ndarray
    act_bytes: np.ndarray  # per in-flight microbatch
    work_bytes: np.ndarray  # largest transient of the chunk's layers
    model_flops: np.ndarray
    hardware_flops: np.ndarray
    # of params: routed-expert weights (sharded by ep x etp, their optimizer over expert DP)
    expert_params: np.ndarray
    a2a_s: np.ndarray  # of the times: MoE all-to-all (cost/moe.py), forward + backward
    # FP8 weight copies kept across the step (cost/precision.py); None: none
    cache_bytes: np.ndarray | None = None

    @property
    def cached_bytes(self) -> np.ndarray:
        return np.zeros(len(self.first)) if self.cache_bytes is None else self.cache_bytes

    @property
    def bwd_s(self) -> np.ndarray:
        return self.bwd_input_s + self.bwd_weight_s

    @property
    def time_s(self) -> np.ndarray:
        return self.fwd_s + self.bwd_s

    def by_rank(self, values: np.ndarray, pp: int) -> np.ndarray:
        """Sum a per-chunk array over the chunks of each rank."""
        if len(values) == pp and values.dtype == np.float64:  # one chunk a rank: nothing to sum
            return values.copy()
        return values.reshape(-1, pp).sum(axis=0)

    def rank_max(self, values: np.ndarray, pp: int) -> np.ndarray:
        return values.reshape(-1, pp).max(axis=0)


@dataclass(frozen=True, eq=False)
class MirroredChunks(ChunkArrays):
    """DualPipe's split (pipeline/dualpipe.py): one chunk per stage, rank r holding chunk r and
    a copy of chunk p - 1 - r, so every per-rank sum or maximum takes both."""

    def by_rank(self, values: np.ndarray, pp: int) -> np.ndarray:
        return values + values[::-1]

    def rank_max(self, values: np.ndarray, pp: int) -> np.ndarray:
        return np.maximum(values, values[::-1])


def mirrored(stages: ChunkArrays) -> MirroredChunks:
    """The same split as DualPipe places it."""
    return MirroredChunks(**{f.name: getattr(stages, f.name) for f in fields(ChunkArrays)})


class CostTable:
    """Prefix sums over a model's layer costs under one recompute mode, so any split's per-chunk
    totals are read with one vectorised difference."""

    def __init__(self, costs: list[LayerCost]):
        self.costs = costs
        self.work_bytes = np.array([c.work_bytes for c in costs])
        rows = {
            "fwd_s": [c.fwd_s for c in costs],
            "bwd_input_s": [c.bwd_input_s + c.recompute_s for c in costs],
            "bwd_weight_s": [c.bwd_weight_s for c in costs],
            "params": [c.params for c in costs],
            "act_bytes": [c.act_bytes for c in costs],
            "model_flops": [c.model_flops for c in costs],
            "hardware_flops": [c.hardware_flops for c in costs],
            "expert_params": [c.expert_params for c in costs],
            "a2a_s": [c.a2a_s for c in costs],
            "cache_bytes": [c.cache_bytes for c in costs],
        }
        self.prefix = {k: np.concatenate(([0.0], np.cumsum(v))) for k, v in rows.items()}


def even_block_bounds(model: ModelSpec, num_chunks: int) -> list[tuple[int, int]]:
    """Megatron's default split: the blocks evenly (counts differing by at most one, larger ones
    first), the embedding joining the first chunk and the head the last. A model without that
    shape is split evenly over all its layers."""
    layers = model.layers
    standard = (len(layers) >= 3 and layers[0].kind == "embedding" and layers[-1].kind == "head"
                and all(layer.kind == "block" for layer in layers[1:-1])
                and len(layers) - 2 >= num_chunks)
    n, offset = (len(layers) - 2, 1) if standard else (len(layers), 0)
    base, extra = divmod(n, num_chunks)
    bounds, start = [], offset
    for k in range(num_chunks):
        size = base + (1 if k < extra else 0)
        bounds.append((start, start + size))
        start += size
    if standard:
        bounds[0] = (0, bounds[0][1])
        bounds[-1] = (bounds[-1][0], len(layers))
    return bounds


def block_counts_of(model: ModelSpec, bounds, modes,
                    recompute_layers) -> tuple[list[str], list[int | None]]:
    """Per chunk, its mode and the N of Megatron's block method, or None where the mode covers
    the whole chunk: a count is kept only for a "full" chunk with 1 <= N < its blocks (N = 0 is
    no recompute, N = all is full recompute; the plan's stage then says so plainly)."""
    modes = list(modes)
    if recompute_layers is None:
        return modes, [None] * len(modes)
    out_modes, out = [], []
    for (a, b), mode, n in zip(bounds, modes, recompute_layers):
        blocks = sum(1 for layer in model.layers[a:b] if layer.kind == "block")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise ValueError(f"recompute_layers must be None or a count >= 0, got {n!r}")
        out_modes.append("none" if mode == "full" and n == 0 else mode)
        out.append(n if mode == "full" and n is not None and 0 < n < blocks else None)
    return out_modes, out


def partial_segments(blocks, a: int, b: int, mode: str,
                     layers: int | None) -> list[tuple[str, int, int]]:
    """The (mode, first, last) layer ranges of chunk [a, b) under ``mode``: the whole chunk, or
    with ``layers`` = N Megatron's block method, its first N transformer blocks in ``mode`` and
    everything else without recompute. Megatron-LM, megatron/core/transformer/
    transformer_block.py, _checkpointed_forward: "block: Checkpoint the input activation of only
    a set number of individual Transformer layers and skip the rest. A method fully use the
    device memory removing redundant re-computation." (``for l in range(self.
    num_layers_per_pipeline_rank): if l < self.config.recompute_num_layers:`` checkpoint layer l
    alone, else run it plainly; the chunk's layers are those of one pipeline stage or virtual
    chunk). ``blocks``: per model layer, whether it is a transformer block (the embedding and
    the head are not: never recomputed)."""
    if layers is None or mode == "none":
        return [(mode, a, b)]
    blocks = [i for i in range(a, b) if blocks[i]]
    if layers >= len(blocks):
        return [(mode, a, b)]
    if layers <= 0:
        return [("none", a, b)]
    cut = blocks[layers - 1] + 1  # after the N-th block: layers before it are blocks or edges
    return [(mode, a, cut), ("none", cut, b)]


def split_stages(tables: dict[str, CostTable], bounds, modes, counts=None,
                 blocks=None) -> ChunkArrays:
    """Per-chunk totals of a split, each chunk under its own recompute mode (``counts``: per
    chunk None, or the N of Megatron's block method, :func:`partial_segments` over the layers
    ``blocks`` marks as transformer blocks, whose other layers then run without recompute and
    need the "none" table): compute only (the pipeline engine's per-action costs are charged
    per action by the prediction)."""
    first = np.array([a for a, _ in bounds])
    last = np.array([b for _, b in bounds])
    if ((counts is None or all(n is None for n in counts)) and len(set(modes)) == 1
            and (last > first).all()):
        # every chunk whole, not empty and in one mode (the screen's even splits): one
        # difference of prefix sums per quantity, the same numbers as the general loop below
        table = tables[modes[0]]
        sums = {name: table.prefix[name][last] - table.prefix[name][first] for name in _SUMMED}
        work = np.array([table.work_bytes[i:j].max() for i, j in bounds])
        return ChunkArrays(first=first, last=last, recompute=tuple(modes), work_bytes=work, **sums)
    counts = list(counts) if counts is not None else [None] * len(modes)
    segs = [partial_segments(blocks, a, b, m, n) if n is not None else [(m, a, b)]
            for (a, b), m, n in zip(bounds, modes, counts)]
    sums = {}
    for name in _SUMMED:
        sums[name] = np.array([sum(tables[m].prefix[name][j] - tables[m].prefix[name][i]
                                   for m, i, j in seg) for seg in segs])
    work = np.array([max(tables[m].work_bytes[i:j].max() for m, i, j in seg if j > i)
                     for seg in segs])
    return ChunkArrays(first=first, last=last, recompute=tuple(modes), work_bytes=work, **sums)
