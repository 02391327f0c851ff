"""A true lower bound on a configuration's refined step time, for the search's stop rule.

The screen (closed forms on Megatron's even split) orders the configurations but is not a bound:
the refinement may balance the stages better, recompute less where memory allows, and the
simulated schedule may beat the closed form (tests/test_bound.py finds such cases).  This bound
holds for every split the refinement can choose (tests/test_bound.py checks it against refined
plans of random cases):

Pipeline.  Let t_k be chunk k's time for one microbatch (F + B + W) and f_k its forward time.
Rank r runs m microbatches of its chunk after the first microbatch's forwards through chunks
0..r-1, and (GPipe, 1F1B) its last backward is followed by the backwards of chunks r-1..0, so
    step >= sum_{k<r} t_k + m·t_r   for every rank r    (ZB-H1, ZB-2p: sum_{k<r} f_k + m·t_r,
plus its backward chain, `families_of`).  Whole layers make the chunks: `split_fits` decides,
greedily, whether any contiguous split keeps every such term under a value, each layer at its
fastest allowed recompute mode.  Memory narrows the modes: each rank's capacity, relaxed with a
Lagrange multiplier (`memory_families`), and all ranks' capacity summed (`memory_bound_total`).
A cheaper relaxation comes first: over real-valued splits with sum t_k = T, the smallest max over
r is reached when every rank's term is equal (if all were below that value, the partial sums
would stay below the equal split's and could not reach T): C = a·T / (1 - (1 - a/m)^p), a = 1,
or for ZB-H1 and ZB-2p the smallest forward share f/t of any layer.  Interleaved ranks hold several
chunks, which the partitioner may size unevenly, so there only what holds for any split is used:
the busiest rank runs m microbatches of at least T / p, microbatch 0's chain of forwards and
input-gradient backwards runs through every layer, and each rank's fill plus its m microbatches
holds with whole layers on every rank (`whole_layer_bound`).  (What the search's cap leaves of
them is bounded again by a relaxation of their chunks, planner/search/chunk_bound.py: each
rank's own memory, whole layers and the interleaved schedule's fill and drain, at the cost of a
linear and a mixed-integer program.)

Data-parallel sync and optimizer.  The rank with the most parameters holds at least total / p of
them; its sync costs at least the interference share of the collective even with all of it hidden
(all of it without overlap), and its optimizer step that share's time (the formulas of
planner/predict/data_parallel.py and step.py).  Per-action overheads and transfers of v = 1 splits are left out (>= 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.core.parallel import Parallel
from planner.cost import constants
from planner.partitioning.problem import TIE_RTOL
from planner.core.schedules import schedule_traits
from planner.predict.data_parallel import dp_exposed_s
from planner.predict.step import OPTIMIZER_BYTES_PER_PARAM
from planner.predict.chunks import CostTable, ChunkArrays


def split_fits(c: float, families: list[tuple[np.ndarray, np.ndarray]]) -> bool:
    """Whether some contiguous split of the layers (empty stages allowed) keeps, for every rank
    r and family (g, u[, offset]), sum_{layers before rank r} g + sum_{layers of rank r} u[r]
    + offset[r] <= c.  Found greedily, each rank given as many layers as fit: optimal when
    g <= u layer by layer (moving a layer to an earlier rank then changes the later rank's term
    by g - u <= 0 and no other).  g: per layer; u: (ranks, layers); offset: per rank."""
    return prefixes_fit(c, prefix_sums(families))


def prefix_sums(families: list) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The families of `split_fits` as prefix sums (g, u per rank, offset per rank), built once
    for the many values `Bound.exceeds` tries."""
    out = []
    for g, u, *rest in families:
        p = len(u)
        out.append((np.concatenate(([0.0], np.cumsum(g))),
                    np.concatenate((np.zeros((p, 1)), np.cumsum(u, axis=1)), axis=1),
                    rest[0] if rest else np.zeros(p)))
    return out


def prefixes_fit(c: float, prefixes: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> bool:
    """`split_fits` on the families' `prefix_sums`."""
    n = len(prefixes[0][0]) - 1
    p = len(prefixes[0][1])
    start = 0
    for r in range(p):
        reach = n
        for g, u, offset in prefixes:
            room = c - g[start] - offset[r]
            if room < 0:
                return False
            row = u[r]
            reach = min(reach, int(row.searchsorted(row[start] + room, "right")) - 1)
        start = max(start, reach)
        if start >= n:
            return True
    return False


def split_bound(families: list[tuple[np.ndarray, np.ndarray]], rel_tol: float = 1e-6) -> float:
    """min over contiguous layer splits of max over ranks and families of the terms of
    `split_fits`, from below (bisection on the value, to ``rel_tol``)."""
    lo = 0.0
    hi = max(float(np.sum(g)) + float(np.sum(u[0])) + float(np.max(rest[0]) if rest else 0.0)
             for g, u, *rest in families)
    prefixes = prefix_sums(families)
    while hi - lo > rel_tol * hi:
        mid = (lo + hi) / 2
        if prefixes_fit(mid, prefixes):
            hi = mid
        else:
            lo = mid
    return lo


def families_of(schedule: str, p: int, m: int, layers: "LayerTimes") -> list:
    """The per-rank inequalities of a schedule as (g, u) pairs for `split_fits` (module
    docstring): every schedule has (forward, m·time) [GPipe and 1F1B (time, m·time): their
    last backward is followed by the backwards of the earlier chunks]; ZB-H1 adds its backward
    chain: rank r's last B comes after all its F and B and m - r - 1 of its W, and is followed by
    the B of chunks r-1..0: (F + B, m·(F + B) + max(0, m - r - 1)·W); ZB-2p the same chain
    without counting any W (its W ops fall anywhere)."""
    t, f, fb, w = layers.time_s, layers.fwd_s, layers.fb_s, layers.w_s
    traits = schedule_traits(schedule)
    if not traits.split_backward:
        return [(t, np.tile(m * t, (p, 1)))]
    # zb-2p: rank r's last B still follows all its F and B; count none of its W before it
    lag = np.maximum(0, m - np.arange(p) - 1)[:, None] if traits.defers_w_by_rank else \
        np.zeros((p, 1))
    return [(f, np.tile(m * t, (p, 1))), (fb, m * fb[None, :] + lag * w[None, :])]


def relaxed_bound(a: float, p: int, m: int, total_s: float) -> float:
    """The continuous relaxation of `split_bound`: a·T / (1 - (1 - a/m)^p) (module docstring)."""
    if a <= 0.0:
        return m * total_s / p
    return a * total_s / (1.0 - (1.0 - a / m) ** p)


def whole_layer_bound(p: int, v: int, m: int, time_s: np.ndarray, total_s: float = 0.0,
                      comm_s: np.ndarray | None = None) -> float:
    """A lower bound on the interleaved pipeline time of every split into p·v non-empty chunks
    of whole layers (chunk k on rank k mod p), at least ``total_s`` of work in all (what memory
    forces), from the family j = j' = 0 of planner/search/chunk_bound.py: rank r's first op
    waits for microbatch 0's forwards through chunks 0..r-1 and its last (the backward of
    microbatch m-1 through chunk r) is followed by the backwards through chunks r-1..0, so
        pipeline >= a_r + m·T_r,   a_r = sum_{k<r} t_k + 2·sum_{k<r} comm_k,
    with T_r rank r's work per microbatch.  Whatever the split, chunk 0 holds layer 0 and
    chunks 1..r-1 at least one other layer each, so a_r >= t_0 + (the r - 1 smallest times of
    the middle layers) + the transfers: a floor that holds for every split.  What is left is
    to place whole layers on ranks (layer 0 on rank 0, the last on rank p - 1, at least v
    layers a rank).  A split within C must pass three tests, each monotone in C:
    - every rank holds its v layers: C >= a_r + m·(its pinned layers + its smallest middle
      ones);
    - the ranks' room, sum_r (C - a_r)/m, holds all the work;
    - the ranks hold the N middle layers: rank r holds at most c of them within C only if
      C >= a_r + m·(pinned + the c smallest), so at least N of these thresholds, over all r
      and c >= 1, are <= C: C >= the N-th smallest of them.
    The least C that passes all three (the largest of the three least values) is the bound.
    It is the whole layers that matter: a rank cannot shed a fraction of a layer to make up for
    its fill, which the linear relaxation of planner/search/chunk_bound.py allows (measured:
    gpt3-175b, tp 8, pp 16, v 6 on 1,024 GPUs: 16.22 s from the linear relaxation, 16.98 s from
    this, 17.22 s simulated)."""
    t = np.asarray(time_s, dtype=float)
    n, K = len(t), p * v
    if n < 2 or K > n:
        return 0.0
    middle = np.sort(t[1:-1])
    smallest = np.concatenate(([0.0], np.cumsum(middle)))  # sum of the c smallest middle layers
    comm = np.zeros(K - 1) if comm_s is None else np.broadcast_to(
        np.asarray(comm_s, dtype=float), (K - 1,))
    ranks = np.arange(p)
    reach = np.concatenate(([0.0], np.cumsum(comm)))[:p]  # transfers before chunk r
    fill = np.where(ranks > 0, t[0] + smallest[np.clip(ranks - 1, 0, len(middle))], 0.0) \
        + 2 * reach
    pinned = np.zeros(p)
    pinned[0] += t[0]
    pinned[p - 1] += t[-1]
    needed = np.full(p, v)  # middle layers each rank must hold: its chunks less its pinned ones
    needed[0] -= 1
    needed[p - 1] -= 1
    needed = np.maximum(needed, 0)
    holds = float((fill + m * (pinned + smallest[needed])).max())
    rest = max(float(smallest[-1]), max(float(t.sum()), total_s) - float(pinned.sum()))
    room = (m * (rest + float(pinned.sum())) + float(fill.sum())) / p
    count = 0.0
    if len(middle):
        thresholds = (fill + m * pinned)[:, None] + m * smallest[None, 1:]
        count = float(np.partition(thresholds.ravel(), len(middle) - 1)[len(middle) - 1])
    return max(holds, room, count)


# whole_layer_bound sums the layer times in another order than the refined chunks do: kept this
# far below its value so that float rounding never lifts it above the step of a split with no
# bubble beyond the bound's (a configuration would then be skipped for its own step)
WHOLE_LAYER_SAFETY = 1e-9


@dataclass(frozen=True)
class LayerTimes:
    """Per layer, the fastest allowed mode's time for one microbatch; the smallest forward share
    f/t of any layer and mode; the model's dense (non-expert) parameters, per GPU (for the DP
    and optimizer terms)."""

    time_s: np.ndarray
    fwd_s: np.ndarray
    fb_s: np.ndarray  # forward + input-gradient backward (recompute included)
    w_s: np.ndarray  # weight-gradient backward
    forward_share: float
    params: float


def layer_times(tables: dict[str, CostTable]) -> LayerTimes:
    times = np.array([[c.fwd_s + c.bwd_input_s + c.recompute_s + c.bwd_weight_s
                       for c in table.costs] for table in tables.values()])
    forwards = np.array([[c.fwd_s for c in table.costs] for table in tables.values()])
    inputs = np.array([[c.bwd_input_s + c.recompute_s for c in table.costs]
                       for table in tables.values()])
    share = float((forwards / np.where(times > 0, times, np.inf)).min())
    # Dense (non-expert) parameters only: they sync over the DP group and step over dp shards;
    # routed experts sync over the expert-DP group, possibly of one member (no sync at all), so
    # leaving them out keeps the DP and optimizer terms lower bounds for MoE models.
    params = float(sum(c.params - c.expert_params for c in next(iter(tables.values())).costs))
    return LayerTimes(times.min(axis=0), forwards.min(axis=0), (forwards + inputs).min(axis=0),
                      np.maximum(times - forwards - inputs, 0.0).min(axis=0), share, params)


def _largest_capacity(problem) -> float:
    """The problem's capacity (the largest of its per-mode capacities: a chunk in any mode fits
    within it), with the partitioner's tie tolerance."""
    return float(np.max(problem.capacity_bytes)) * (1 + TIE_RTOL)


def memory_bound_total(problem, ranks: int) -> float:
    """Least total per-microbatch time of the layers over the recompute modes any split that
    fits can use (inf when none fits).  Every split the partitioner may return keeps each rank
    within capacity; summed over the ranks, with every chunk holding at least the fewest
    in-flight microbatches of any chunk,
        sum_l act_l(mode_l) <= A = (ranks·capacity - extra - sum_l state_l) / min inflight.
    The least sum_l t_l(mode_l) under that one constraint is bounded below by its Lagrangian
    dual, max over lambda >= 0 of sum_l min_mode (t_l + lambda·act_l) - lambda·A, whose maximum
    lies at lambda = 0 or where some layer's best mode changes (taken exactly, all candidates)."""
    t, act = np.asarray(problem.time_s), np.asarray(problem.act_bytes)
    extra = 0.0 if problem.extra_bytes is None else float(np.sum(problem.extra_bytes))
    room = ranks * _largest_capacity(problem) - extra - float(np.sum(problem.state_bytes))
    budget = room / float(np.min(problem.inflight))
    if budget < float(act.min(axis=1).sum()):
        return float("inf")  # no mode choice fits: the refinement finds no split
    dt = t[:, :, None] - t[:, None, :]  # saving of mode j over mode i in time ...
    da = act[:, None, :] - act[:, :, None]  # ... paid in activations
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where((dt > 0) & (da > 0), dt / da, np.nan)
    lambdas = np.concatenate(([0.0], np.unique(ratios[np.isfinite(ratios)])))
    dual = (t[None, :, :] + lambdas[:, None, None] * act[None, :, :]).min(axis=2).sum(axis=1) \
        - lambdas * budget
    return float(dual.max())


def memory_families(problem, m: int, before: np.ndarray,
                    quantiles=(0.25, 0.5, 0.75)) -> list:
    """Per-rank inequalities from each rank's own memory: for any lambda >= 0, rank r's time
    over its layers under modes that fit is at least
        sum_l [min_mode (t_l + lambda·inflight_r·act_l) + lambda·state_l] - lambda·capacity
    (weak duality: the added term is <= 0 for modes that fit).  Times m, as the m·t_r term of
    the inequality every schedule keeps, with ``before`` (per layer: the fastest time, or the
    forward for ZB-H1) summed over the layers before the rank.  One family per lambda:
    lambda·inflight_r at the given quantiles of the layers' time-per-byte of recomputing."""
    t, act = np.asarray(problem.time_s), np.asarray(problem.act_bytes)
    states = np.asarray(problem.state_bytes)
    inflight = np.asarray(problem.inflight)
    cap = _largest_capacity(problem)
    dt = t[:, :, None] - t[:, None, :]
    da = act[:, None, :] - act[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where((dt > 0) & (da > 0), dt / da, np.nan)
    ratios = ratios[np.isfinite(ratios)]
    if not len(ratios):
        return []
    out = []
    for q in quantiles:
        price = float(np.quantile(ratios, q))  # seconds per byte held once
        lam = price / inflight  # per rank
        u = (t[None, :, :] + (lam * inflight)[:, None, None] * act[None, :, :]).min(axis=2) \
            + lam[:, None] * states[None, :]
        out.append((before, m * u, -m * lam * cap))
    return out


def dp_bound(par: Parallel, cluster, opts, params: float) -> float:
    """The data-parallel sync's lower bound: the rank with the most parameters (at least
    params / pp) with an unbounded window to hide behind, which still pays the interference
    share of the hidden time (or all of it without overlap)."""
    n = par.num_chunks
    zeros, unbounded = np.zeros(n), np.full(n, np.inf)
    ideal = ChunkArrays(first=zeros, last=zeros, recompute=("none",) * n, fwd_s=unbounded,
                   bwd_input_s=unbounded, bwd_weight_s=zeros, params=np.full(n, params / n),
                   act_bytes=zeros, work_bytes=zeros, model_flops=zeros, hardware_flops=zeros,
                   expert_params=zeros, a2a_s=zeros)
    return float(dp_exposed_s(par, cluster, opts, ideal).max())


@dataclass(frozen=True)
class Bound:
    """A configuration's lower bound in parts: ``cheap`` (closed forms, the total time memory
    forces included) and, for v = 1, the per-rank inequalities ``families`` that `exceeds`
    checks against a given value, layer by layer."""

    cheap_s: float
    rest_s: float  # data-parallel sync and optimizer parts of cheap_s
    families: list | None
    _prefixes: list = field(default_factory=list, compare=False, repr=False)  # built on first use

    def exceeds(self, value: float) -> bool:
        """True if the step of every split the refinement may choose is above ``value``."""
        if self.cheap_s > value:
            return True
        if self.families is None:
            return False
        if not self._prefixes:
            self._prefixes.extend(prefix_sums(self.families))
        return not prefixes_fit(value - self.rest_s, self._prefixes)

    def value(self) -> float:
        """The bound itself (bisection over the split inequalities; tests and benchmarks)."""
        if self.families is None or not np.isfinite(self.cheap_s):
            return self.cheap_s
        return max(self.cheap_s, split_bound(self.families) + self.rest_s)


def step_bound(par: Parallel, cluster, opts, layers: LayerTimes, problem=None) -> Bound:
    """Lower bound on the refined step time of ``par``, whose stages may use the layer times
    ``layers``.  ``problem`` (the configuration's partition problem) adds what memory forces
    (`memory_bound_total`, and for v = 1 `memory_families`)."""
    m, p = par.num_microbatches, par.pp
    total = float(layers.time_s.sum())
    if problem is not None:  # the modes memory leaves open
        total = max(total, memory_bound_total(problem, p))
    # any split: the busiest rank runs m microbatches of at least a p-th of the work and of
    # the slowest layer; microbatch 0's forwards and input-gradient backwards form one chain
    pipeline = max(m * total / p, m * float(layers.time_s.max()), float(layers.fb_s.sum()))
    families = None
    # with optimizer post-validation a step costs the longest rank span, which need not hold
    # the forwards before a rank starts: only the rank-local terms above stay true
    if par.virtual_stages == 1 and not opts.optimizer_post_validation:
        split = par.schedule_traits.split_backward
        a = layers.forward_share if split else 1.0
        pipeline = max(pipeline, relaxed_bound(a, p, m, total))
        families = families_of(par.schedule, p, m, layers)
        if problem is not None:
            families += memory_families(problem, m, layers.fwd_s if split else layers.time_s)
    elif par.schedule_traits.takes_virtual_stages and not opts.optimizer_post_validation:
        comm = None if problem is None else np.asarray(problem.boundary_s, dtype=float) / 2
        pipeline = max(pipeline, whole_layer_bound(p, par.virtual_stages, m, layers.time_s,
                                                   total, comm) * (1 - WHOLE_LAYER_SAFETY))
    hw = cluster.hardware
    owned = layers.params / p / (par.dp * par.cp if par.zero >= 1 else 1)
    optimizer = owned * OPTIMIZER_BYTES_PER_PARAM / (
        hw.memory_bandwidth_gbps * 1e9 * (hw.memory_efficiency or constants.MEMORY_EFFICIENCY))
    rest = dp_bound(par, cluster, opts, layers.params) + optimizer
    return Bound(pipeline + rest, rest, families)
