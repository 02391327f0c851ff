"""A lower bound on the simulated pipeline time of an interleaved configuration, from a relaxation
of its chunks: what `bound.py`'s closed forms cannot see (each rank's own memory, whole layers,
the schedule's fill and drain) for chunks the partitioner may size unevenly.

The relaxation.  Chunk k (on rank k mod p) holds n[τ, μ, k] >= 0 layers of type τ in mode μ
(layers with equal costs share a type; the first layer sits in chunk 0 and the last in chunk
K - 1, as in every contiguous split; each chunk holds at least one layer).  Its forward and
backward times f_k, b_k are the sums over its layers.  Every split the partitioner may return
is a point of this set: its chunks' layer counts, each in one mode, with every rank within the
capacity of the modes it uses (`planner/partitioning/problem.py`), and so within the largest:

    sum_{k on r} sum_{τ, μ} n[τ, μ, k] (state_τ + inflight_k · act_τμ) + extra_r <= capacity.

What the schedule forces.  In Megatron's interleaved order (planner/pipeline/schedule.py) rank r
starts with the forwards of microbatches 0..p-1 through its local chunk 0, then local chunk 1,
and so on, and ends with the backwards of the last p microbatches through its local chunks v-1
down to 0.  So for local chunks j and j' (global chunks jp + r and j'p + r):
- the first forward of chunk jp + r starts after microbatch 0's forwards through every earlier
  chunk and the transfers between them (H_j), and after rank r's own first op (at S_r = H_0)
  and its p forwards of each earlier local chunk (p·F_<j);
- from there rank r runs everything else up to its last backward of chunk j'p + r:
  m·T_r - p·F_<j - p·B_<j' of work, one op at a time;
- after that, microbatch m-1's backwards run back through every earlier chunk (Tail_j') and
  rank r runs its p backwards of each earlier local chunk (p·B_<j').
So the pipeline takes at least max(H_j, S_r + p·F_<j) + m·T_r - p·F_<j - p·B_<j'
+ max(Tail_j', p·B_<j') for every r, j, j': four linear inequalities each.  1F1B (v = 1) is
the case j = j' = 0: rank r's first op is F(0, r) and its last B(m-1, r) (not so for GPipe,
whose last backward is microbatch 0's, nor ZB-H1, which ends with W ops).  The least such time
over the set is a mixed-integer program (layer counts integer), solved by HiGHS; its dual bound
is a lower bound on the pipeline time of every split the refinement may choose (with the
per-action overheads, >= 0, left out).  `tests/test_chunk_bound.py` checks it against refined
plans and against brute force over every split of small cases.
"""

from __future__ import annotations

import numpy as np

from planner.partitioning.problem import TIE_RTOL

# HiGHS reports an optimum to a relative gap of ~1e-6 and feasibility to 1e-7 of the values; the
# bound keeps this much below what it reports (its dual bound) so that rounding cannot lift it
# above a true step.
SAFETY = 1e-5
MIP_GAP = 1e-6  # HiGHS's default 1e-4 would leave its dual bound up to that far below the optimum
# Branch-and-bound nodes of the mixed-integer program, in place of a time limit (0.1 s before
# issue #32: where it stopped depended on the machine): past it the dual bound found so far is
# still a bound, and the same on any machine.  Measured on the first 60 interleaved
# configurations of bench_regret.py's megatron-1.7b and llama3-8b on 8 A100s, llama3-8b on 64
# (40 GB) and llama2-13b on 128: every program closed within 206 nodes and 0.1 s of CPU.
NODE_LIMIT = 500


def layer_types(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(type of each layer, first layer of each type): layers with identical cost rows."""
    _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    return inverse.reshape(-1), first


def family_rows(p: int, v: int, m: int, comm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The schedule's inequalities (module docstring) as rows over (f_0..f_K-1, b_0..b_K-1):
    pipeline >= row·(f, b) + constant.  Heads: S_r, or H_j - p·F_<j for local chunks j in
    ``JS``; tails: nothing, or Tail_j' - p·B_<j' (added to m·T_r - p·B_<j' + p·B_<j')."""
    K = p * v
    reach = np.concatenate(([0.0], np.cumsum(comm)))  # transfers before chunk q: reach[q]
    js = sorted({j for j in (1, 2, v - 1) if 1 <= j < v})
    rows, consts = [], []
    for r in range(p):
        own = np.zeros(K)
        own[r::p] = 1.0
        heads = [((np.arange(K) < r).astype(float), reach[r])]
        tails = [(np.zeros(K), 0.0)]
        for j in js:
            ahead = (np.arange(K) < j * p + r).astype(float)
            ahead[[i * p + r for i in range(j)]] -= p
            heads.append((ahead, reach[j * p + r]))
        for j in [0] + js:
            behind = (np.arange(K) < j * p + r).astype(float)
            behind[[i * p + r for i in range(j)]] -= p
            tails.append((behind, reach[j * p + r]))
        for head, hc in heads:
            for tail, tc in tails:
                rows.append(np.concatenate((m * own + head, m * own + tail)))
                consts.append(hc + tc)
    return np.array(rows), np.array(consts)


def interleaved_bound(p: int, v: int, m: int, fwd: np.ndarray, bwd: np.ndarray, act: np.ndarray,
                      state: np.ndarray, inflight: np.ndarray, capacity: float,
                      extra: np.ndarray | None, comm: np.ndarray,
                      node_limit: int = NODE_LIMIT, integer: bool = True,
                      cutoff: float = float("inf")) -> float:
    """A lower bound on the least pipeline time of the relaxation (module docstring): fwd, bwd,
    act (layers, modes), state (layers,), inflight (chunks,), extra (ranks,) or None, comm
    (chunks - 1,) seconds per transfer; ``integer`` False solves its linear relaxation instead
    (faster, weaker, still a bound).  inf when no point fits the memory.  A finite ``cutoff``
    (integer only) prunes every node whose bound is above it: when that leaves nothing the
    answer is just above ``cutoff``, which is all the search needs to know."""
    import highspy

    from planner.partitioning.lexicographic import quiet_stdout

    L, R = fwd.shape
    K = p * v
    # items: the first layer (chunk 0 only), the last (chunk K - 1 only), then the free types
    items = [(0, 1, np.arange(1))] + ([(L - 1, 1, np.array([K - 1]))] if L > 1 else [])
    if L > 2:
        kind, _ = layer_types(np.column_stack([fwd, bwd, act, state])[1:-1])
        for t in range(int(kind.max()) + 1):
            members = np.flatnonzero(kind == t) + 1
            items.append((int(members[0]), len(members), np.arange(K)))
    # count variables n[item, mode, chunk]
    col_item = np.concatenate([np.full(R * len(ch), i) for i, (_, _, ch) in enumerate(items)])
    col_mode = np.concatenate([np.repeat(np.arange(R), len(ch)) for _, _, ch in items])
    col_chunk = np.concatenate([np.tile(ch, R) for _, _, ch in items])
    col_layer = np.array([items[i][0] for i in col_item])
    n = len(col_item)
    total = n + 2 * K + 1  # counts, f_k, b_k, the bound z
    dense = []  # (row over all columns, lower, upper)

    def row() -> np.ndarray:
        return np.zeros(total)

    for i, (_, count, _) in enumerate(items):  # every layer placed once
        x = row()
        x[:n] = col_item == i
        dense.append((x, count, count))
    for k in range(K):  # chunk times, and at least one layer per chunk
        here = col_chunk == k
        for offset, times in ((n, fwd), (n + K, bwd)):
            x = row()
            x[:n] = np.where(here, times[col_layer, col_mode], 0.0)
            x[offset + k] = -1.0
            dense.append((x, 0.0, 0.0))
        x = row()
        x[:n] = here
        dense.append((x, 1.0, np.inf))
    for r in range(p):  # each rank within the capacity (in capacities: well scaled)
        x = row()
        x[:n] = np.where(col_chunk % p == r, state[col_layer]
                         + inflight[col_chunk] * act[col_layer, col_mode], 0.0) / capacity
        dense.append((x, -np.inf, 1.0 - (0.0 if extra is None else float(extra[r])) / capacity))
    fam, consts = family_rows(p, v, m, comm)  # z - row·(f, b) >= constant
    block = np.zeros((len(fam), total))
    block[:, n:n + 2 * K] = -fam
    block[:, -1] = 1.0
    matrix = np.vstack([x for x, _, _ in dense] + [block])
    lower = np.concatenate(([lo for _, lo, _ in dense], consts))
    upper = np.concatenate(([hi for _, _, hi in dense], np.full(len(fam), np.inf)))

    with quiet_stdout():  # HiGHS prints a banner at its first construction
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    # one thread, as the partitioner runs HiGHS (partitioning/lexicographic.py): HiGHS's task
    # scheduler is one per process, sized by the first run, and a later run asking for another
    # size fails (the partitioner's MILPs then found no split at all)
    h.setOptionValue("threads", 1)
    h.setOptionValue("mip_max_nodes", int(node_limit))
    h.setOptionValue("mip_rel_gap", MIP_GAP)
    cut = integer and np.isfinite(cutoff)
    if cut:  # prune every node whose bound is past the cutoff (with room for the safety)
        h.setOptionValue("objective_bound", float(cutoff) / (1 - 2 * SAFETY))
    inf = highspy.kHighsInf
    col_upper = np.concatenate((np.array([items[i][1] for i in col_item], dtype=float),
                                np.full(2 * K + 1, inf)))
    h.addVars(total, np.zeros(total), col_upper)
    if integer:
        h.changeColsIntegrality(n, np.arange(n, dtype=np.int32),
                                np.full(n, highspy.HighsVarType.kInteger))
    cost = np.zeros(total)
    cost[-1] = 1.0
    h.changeColsCost(total, np.arange(total, dtype=np.int32), cost)
    nz_rows, nz_cols = np.nonzero(matrix)
    starts = np.searchsorted(nz_rows, np.arange(len(matrix))).astype(np.int32)
    h.addRows(len(matrix), np.where(np.isfinite(lower), lower, -inf),
              np.where(np.isfinite(upper), upper, inf), len(nz_cols), starts,
              nz_cols.astype(np.int32), matrix[nz_rows, nz_cols])
    h.run()
    status = h.getModelStatus()
    if cut and status in (highspy.HighsModelStatus.kInfeasible,
                          highspy.HighsModelStatus.kObjectiveBound):
        return float(cutoff) / (1 - 2 * SAFETY) * (1 - SAFETY)  # nothing below the pruning bound
    if status == highspy.HighsModelStatus.kInfeasible:
        return float("inf")
    info = h.getInfo()
    if not integer:  # an LP is solved to optimality or not at all
        value = (info.objective_function_value if status == highspy.HighsModelStatus.kOptimal
                 else 0.0)
    elif status == highspy.HighsModelStatus.kOptimal:
        value = min(info.mip_dual_bound, info.objective_function_value)
    else:
        value = info.mip_dual_bound
    if not np.isfinite(value):
        return 0.0
    return max(0.0, float(value)) * (1 - SAFETY)


def chunk_bound(par, problem, tables: dict, integer: bool = True,
                cutoff: float = float("inf")) -> float:
    """`interleaved_bound` of a configuration from its partition problem and the cost tables of
    the modes it allows (in the problem's mode order)."""
    modes = problem.modes
    fwd = np.array([[c.fwd_s for c in tables[mu].costs] for mu in modes]).T
    bwd = np.array([[c.bwd_input_s + c.recompute_s + c.bwd_weight_s for c in tables[mu].costs]
                    for mu in modes]).T
    comm = np.asarray(problem.boundary_s, dtype=float) / 2 * np.ones(par.num_chunks - 1)
    capacity = float(np.max(problem.capacity_bytes)) * (1 + TIE_RTOL)
    return interleaved_bound(par.pp, par.virtual_stages, par.num_microbatches, fwd, bwd,
                             np.asarray(problem.act_bytes), np.asarray(problem.state_bytes),
                             np.asarray(problem.inflight), capacity, problem.extra_bytes, comm,
                             integer=integer, cutoff=cutoff)
