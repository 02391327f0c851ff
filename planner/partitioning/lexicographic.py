"""Solving the partition MILP: the tie-break rule of :mod:`planner.partitioning.problem` proven
by the solver alone, and the solver interface (PuLP; HiGHS or CBC).

Interleaved (K > p) first: the least largest chunk C* (exact by bisection for the block-count
model, :mod:`planner.partitioning.largest_chunk`; a variable C >= every chunk's time in the
boundary model, minimised by the solver), then every step below under C <= C*.
Minimise the bottleneck B; then, with B <= B*, the total compute time T; then, with T <= T* too,
the chunk keys ``R * layers_k + mode_k`` in chunk order (with the earlier chunks fixed, a
shorter chunk is an earlier end), several chunks per solve (a mixed-radix weighted sum over their
key ranges is minimal exactly at the lexicographic minimum).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Sequence

from planner.core.files import scratch_dir
from planner.partitioning.milp import MAX_BINARIES, BoundaryModel, NoChunkFits, MilpModel, uniform_blocks, windows
from planner.partitioning.largest_chunk import least_largest_chunk
from planner.partitioning.options import OptionModel, RankModel
from planner.partitioning.prepared import Prepared, simple_lower_bound
from planner.partitioning.problem import TIE_RTOL, PartitionError
from planner.partitioning.split import score_split, total_compute_s

LEX_RADIX_LIMIT = 1 << 20
"""Largest objective range of one tie-break solve: keeps the weighted keys exact integers well
inside the solvers' tolerances (double precision, absolute gap below one unit)."""

CAP_SLACK = 1e-7
# HiGHS can call the cap B <= B*(1 + CAP_SLACK) infeasible although step 1 found B* (a case in
# tests/test_partition.py): the step is retried once with this slack, still far below any
# difference in step time, and the split is re-checked exactly as always.
HIGHS_MIP_FEASIBILITY_TOLERANCE = 1e-9
# HiGHS 1.16's default (1e-6) lies above CAP_SLACK, and with it HiGHS proved a tie-break step
# "optimal" at objective 144 where 129 is feasible (the interleaved case in tests/test_partition.py;
# with presolve off, or this tolerance at 1e-8 or below, it finds 129). Kept below CAP_SLACK.
NODE_LIMIT = 50
"""Branch-and-bound nodes one solve may explore (HiGHS mip_max_nodes, CBC maxNodes), the
solver's work limit in place of a time limit, so a split never depends on the machine or its
load (issue #32).  Measured with benchmarks/bench_partition.py and benchmarks/bench_solve.py:
every solve of their cases ends at the root node, bar DualPipe over DeepSeek-V3's dense and MoE
blocks (2,048 H800s on megatron-core listing DualPipe), whose solves close within 15 nodes but
for three that did not close in 200; those spend most of their time at the root (the hardest:
9.6 s of CPU to 50 nodes, 9.9 s to 200), which no HiGHS limit but time bounds, so that search
takes 27 s of CPU where the 2 s time limit cut it to 14 s (docs/speed.md)."""
RETRY_SLACK = 1e-5
"""Relative slack on the B and T caps handed to the solver (its feasibility tolerance is ~1e-6 on
O(1) rows); every split it returns is re-checked exactly with ``TIE_RTOL``."""


def build(prep: Prepared, ub: float | None, chunk_cap: float | None = None,
          known_chunk: float | None = None) -> MilpModel | None:
    """The formulation for this instance, or None when no split can fit (a chunk has no option
    that fits its mode's capacity). Raises PartitionError when the boundary model would be too
    large to solve within the node limit.

    Interleaved (K > p): ``ub`` must bound the bottleneck of the splits whose largest chunk is
    ``chunk_cap`` (step 0 of the tie-break rule). The block-count model gets its least largest
    chunk here (:func:`least_largest_chunk`, exact; ``known_chunk``: that of a split known to
    fit) and keeps only the options within it; the boundary model carries a variable C for it
    (:func:`solve_lexicographic` minimises it first) or, given ``chunk_cap``, its cap."""
    try:
        if uniform_blocks(prep):
            if prep.K > prep.p and chunk_cap is None:
                chunk_cap = least_largest_chunk(prep, known_chunk)
                if chunk_cap is None:
                    return None
            model = OptionModel(prep, ub, chunk_cap)
            model.chunk_cap_s = chunk_cap
            return model
    except NoChunkFits:
        return None
    cap = chunk_cap if chunk_cap is not None else known_chunk if prep.K > prep.p else None
    lo, hi = windows(prep, ub, cap)
    if prep.problem.partial is not None:
        raise PartitionError("partial recompute is solved by the option MILP only "
                             "(embedding, identical blocks, head)")
    n_binaries = sum(h - l for l, h in zip(lo, hi)) + prep.K * prep.R
    if n_binaries > MAX_BINARIES:
        raise PartitionError(f"MILP too large ({n_binaries} binaries > {MAX_BINARIES})")
    return BoundaryModel(prep, ub, chunk_cap, known_chunk)


# ---------------------------------------------------------------- solving


class Work:
    """What the solves of one partition may spend and have spent: ``node_limit`` nodes a solve
    (:data:`NODE_LIMIT`), and the simplex iterations HiGHS reports (``iterations``, the measure
    of work the search's budget counts: planner/search/refinement.py; CBC reports none)."""

    def __init__(self, node_limit: int = NODE_LIMIT):
        if isinstance(node_limit, bool) or not isinstance(node_limit, int) or node_limit < 1:
            raise ValueError(f"node_limit must be a positive integer, got {node_limit!r}")
        self.node_limit = node_limit
        self.iterations = 0


@dataclass(frozen=True)
class Outcome:
    """What :func:`solve_lexicographic` reached.

    ``status``: 'optimal' (all three tie-break steps proven), 'feasible' (a split, B not proven
    optimal: ``bound_s`` is the solver's lower bound), 'infeasible', or 'none' (no split within
    the node limit). ``note`` says which tie-break step, if any, ran out of nodes."""

    status: str
    ends: tuple[int, ...] = ()
    modes: tuple[int, ...] = ()
    bound_s: float = 0.0
    note: str = ""
    kept: bool = False


def solve_lexicographic(model: MilpModel, name: str, work: Work,
                        keep: tuple[Sequence[int], Sequence[int], float] | None = None,
                        steps: int = 3) -> Outcome:
    """The steps of the tie-break rule, each proven by the solver (see module docstring).

    ``keep`` = (ends, modes, bottleneck, largest chunk) of a fitting split the caller prefers on
    a tie: when steps 0 and 1 prove no split has a smaller largest chunk (interleaved) or
    bottleneck, it is returned (``kept``) instead of running steps 2 and 3. ``steps`` < 3 stops after that step (said in ``note``)."""
    import pulp

    prep = model.prep
    c_star = getattr(model, "chunk_cap_s", None)  # the block-count model found it exactly
    if model.C is not None and model.C.upBound is None:
        # step 0 (interleaved, boundary model): the least largest chunk, then capped
        model.prob.setObjective(model.C)
        status, _ = run_milp(model, name, work)
        if status != "optimal":
            return Outcome("none" if status == "feasible" else status)
        ends, modes = model.solution()
        c_star = max(c.time_s for c in score_split(prep, ends, modes, method="ilp").chunks)
        model.C.upBound = c_star * (1 + CAP_SLACK) / model.tscale
        model.prob.setObjective(model.B)
    if isinstance(model, OptionModel) and prep.K > prep.p:
        if keep is not None and _keep_proven(model, keep):
            return Outcome("optimal", tuple(keep[0]), tuple(keep[1]), model.rank_bound_s,
                           kept=True)
        try:  # interleaved: steps 1 and 2 on the per-rank master (same optimum, exact)
            model = RankModel(model)
        except NoChunkFits:
            return Outcome("infeasible")
    status, bound = run_milp(model, name, work)
    if status == "infeasible" and c_star is not None and model.C is not None:
        model.C.upBound = c_star * (1 + RETRY_SLACK) / model.tscale  # C* cut off by tolerance
        status, bound = run_milp(model, name, work)
    if status in ("infeasible", "none"):
        return Outcome(status)
    ends, modes = model.solution()
    b_star = score_split(prep, ends, modes, method="ilp").bottleneck_s
    if status == "feasible":
        lb = max(simple_lower_bound(prep), (bound or 0.0) * model.tscale,
                 getattr(model, "rank_bound_s", 0.0))
        return Outcome("feasible", tuple(ends), tuple(modes), min(lb, b_star))
    if keep is not None and keep[2] <= b_star * (1 + TIE_RTOL) and (
            c_star is None or keep[3] <= c_star * (1 + TIE_RTOL)):
        return Outcome("optimal", tuple(keep[0]), tuple(keep[1]), b_star, kept=True)
    if steps <= 1:
        return Outcome("optimal", tuple(ends), tuple(modes), b_star, "ties not broken")
    # step 2 (least compute time; with one mode T is a constant) on the master for v > 1, on
    # the model rebuilt with B* as its bound (far fewer options / a narrower window) otherwise;
    # step 3 on that rebuilt model
    master = model if isinstance(model, RankModel) else None
    fallback_model = model.om if master is not None else model
    if master is None:
        model = build(prep, b_star, c_star) or model
    t_star = None
    step2 = master or model
    step2.B.upBound = b_star * (1 + CAP_SLACK) / step2.tscale
    if prep.n_options > 1:
        step2.warm_start(ends, modes)
        step2.prob.setObjective(step2.compute_time())
        status, _ = run_milp(step2, name, work)
        if status == "infeasible":  # B* itself cut off by the solver's tolerance: loosen once
            step2.B.upBound = b_star * (1 + RETRY_SLACK) / step2.tscale
            status, _ = run_milp(step2, name, work)
        if status != "optimal":
            why = "ran out of nodes" if status in ("feasible", "none") else f"was {status}"
            return Outcome("optimal", tuple(ends), tuple(modes), b_star,
                           f"least-recompute step {why}; ties may differ from the DP")
        ends, modes = step2.solution()
        t_star = total_compute_s(prep, ends, modes)
    if steps == 2:
        return Outcome("optimal", tuple(ends), tuple(modes), b_star,
                       "ties broken by least recompute only" if prep.n_options > 1
                       else "ties not broken")
    if master is not None:
        model = build(prep, b_star, c_star) or fallback_model
        model.B.upBound = b_star * (1 + CAP_SLACK) / model.tscale
    if t_star is not None:
        model.prob += model.compute_time() <= (t_star * (1 + CAP_SLACK) + 1e-300) / model.tscale
    if prep.K == prep.p and prep.n_options == 1:
        # One chunk per rank, one mode: a chunk inside a feasible chunk is feasible, so the
        # chunk-wise smallest ends of two feasible splits are feasible, and the least element
        # (the lexicographic minimum) is the one unique minimiser of the sum of the ends.
        if prep.K > 1:
            model.warm_start(ends, modes)
            model.prob.setObjective(pulp.lpSum(model.end(k) for k in range(prep.K - 1)))
            status, _ = run_milp(model, name, work)
            if status != "optimal":
                return Outcome("optimal", tuple(ends), tuple(modes), b_star,
                               "tie-break step ran out of nodes; ties may differ from the DP")
            ends, modes = model.solution()
        return Outcome("optimal", tuple(ends), tuple(modes), b_star)
    return _lexicographic_keys(model, name, work, ends, modes, b_star)


def _keep_proven(model: OptionModel, keep) -> bool:
    """Whether the split ``keep`` = (ends, modes, bottleneck, largest chunk) is proven a tie for
    steps 0 and 1 without a solve: its largest chunk within the least one (C*, exact by
    bisection) and its bottleneck within the rank decomposition's lower bound on every
    bottleneck under C* (OptionModel._rank_bound, the master's own lower bound on B).  The
    master's optimum B* is at least that bound, so :func:`solve_lexicographic` would keep it
    too (``keep[2] <= B*·(1 + TIE_RTOL)``); only the solve is saved (most interleaved
    refinements keep Megatron's even split: 39 of 48 on gpt3-175b on 1,024 GPUs)."""
    c_star = model.chunk_cap_s
    return (c_star is not None and keep[3] <= c_star * (1 + TIE_RTOL)
            and keep[2] <= model.rank_bound_s * (1 + TIE_RTOL))


def _lexicographic_keys(model: MilpModel, name: str, work: Work, ends: list[int],
                        modes: list[int], b_star: float) -> Outcome:
    """Step 3: fix the chunk keys in order, each window of chunks by one solve of a mixed-radix
    objective; a chunk whose key in the incumbent is already the smallest possible after the
    fixed prefix is fixed without a solve."""
    prep = model.prep
    K, R = prep.K, prep.n_options

    def key(ends, modes, j):  # R * layers + mode, as model.key(j)
        return R * (ends[j] - (ends[j - 1] if j else 0)) + modes[j]

    k = 0
    while k < K:
        floor, top = model.key_range(k)
        if key(ends, modes, k) == floor or top == floor:
            model.prob += model.key(k) == key(ends, modes, k)
            k += 1
            continue
        window, radix = [k], top - floor + 1
        while window[-1] + 1 < K:
            lo, hi = model.key_range(window[-1] + 1)
            if radix * (hi - lo + 1) > LEX_RADIX_LIMIT:
                break
            window.append(window[-1] + 1)
            radix *= hi - lo + 1
        weights, w = [], 1
        for j in reversed(window):
            weights.append(w)
            lo, hi = model.key_range(j)
            w *= hi - lo + 1
        weights.reverse()
        model.warm_start(ends, modes)
        model.prob.setObjective(sum((wt * model.key(j) for wt, j in zip(weights, window)), 0))
        status, _ = run_milp(model, name, work)
        if status != "optimal":
            return Outcome("optimal", tuple(ends), tuple(modes), b_star,
                           f"tie-break stopped at chunk {k} (node limit); ties may differ from the DP")
        ends, modes = model.solution()
        for j in window:
            model.prob += model.key(j) == key(ends, modes, j)
        k = window[-1] + 1
    return Outcome("optimal", tuple(ends), tuple(modes), b_star)


@contextlib.contextmanager
def quiet_stdout():
    """Silence C-level stdout (solver banners) for the duration of the block."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # captured / not a real file
        yield
        return
    sys.stdout.flush()
    saved = os.dup(fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


def _make_solver(name: str, node_limit: int):
    """The solver with a node limit and no time limit, one thread: the same model gives the same
    answer on any machine at any load (HiGHS's and CBC's branch and bound are deterministic on
    one thread; a time limit would stop them at a point that depends on the machine)."""
    import pulp

    if name == "highs":
        return _node_limited_highs()(msg=False, gapRel=0.0, gapAbs=1e-9, threads=1,
                                     mip_max_nodes=int(node_limit),
                                     mip_feasibility_tolerance=HIGHS_MIP_FEASIBILITY_TOLERANCE)
    with warnings.catch_warnings():  # bundled CBC: deprecated name, still the one that ships
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(msg=False, gapRel=0.0, gapAbs=1e-9, threads=1, warmStart=True,
                                 maxNodes=int(node_limit))


@functools.cache
def _node_limited_highs():
    """pulp's HiGHS interface, reading a solve the node limit stopped: HiGHS reports it as
    kSolutionLimit, which pulp 3.3.2 maps to no status (a KeyError once the values are read);
    it is read as pulp reads a time limit: the incumbent where HiGHS has one, else none."""
    import highspy
    import pulp

    class NodeLimitedHiGHS(pulp.HiGHS):
        def findSolutionValues(self, lp):
            try:
                return super().findSolutionValues(lp)
            except KeyError:
                if lp.solverModel.getModelStatus() != highspy.HighsModelStatus.kSolutionLimit:
                    raise
                info = lp.solverModel.getInfo()
                feasible = int(highspy.SolutionStatus.kSolutionStatusFeasible)
                if int(info.primal_solution_status) == feasible:
                    return pulp.LpStatusOptimal, pulp.LpSolutionIntegerFeasible
                return pulp.LpStatusNotSolved, pulp.LpSolutionNoSolutionFound

    return NodeLimitedHiGHS


def run_milp(model, name: str, work: Work) -> tuple[str, float | None]:
    """Run the solver within ``work``'s node limit, adding HiGHS's simplex iterations to it;
    returns ('optimal'|'feasible'|'infeasible'|'none', dual bound in scaled units)."""
    import pulp

    solver = _make_solver(name, work.node_limit)
    # CBC's model and solution files go to a scratch directory, removed even on Ctrl-C;
    # HiGHS runs in process and writes none (the directory cost ~2.5 ms a solve under the
    # profiler: 0.15 s of gpt3-175b's search on 1,024 GPUs, 60 solves)
    scratch = scratch_dir() if name != "highs" else contextlib.nullcontext(None)
    with scratch as tmp, quiet_stdout():  # HiGHS prints a banner before msg=False
        if tmp is not None:
            solver.tmpDir = tmp
        model.prob.solve(solver)
    bound = None
    if name == "highs":
        try:
            info = model.prob.solverModel.getInfo()
            work.iterations += max(int(info.simplex_iteration_count), 0)
            bound = float(info.mip_dual_bound)
        except Exception:  # noqa: BLE001 - the bound is informative only
            bound = None
        if bound is not None and not math.isfinite(bound):
            bound = None
    if model.prob.status == pulp.LpStatusInfeasible:
        return "infeasible", bound
    if model.prob.sol_status == pulp.LpSolutionOptimal and model.prob.status == pulp.LpStatusOptimal:
        return "optimal", bound
    if model.prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return "feasible", bound
    return "none", bound
