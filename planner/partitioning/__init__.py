"""Floor 2 - splitting a layer sequence into pipeline stages: the problem (problem.py), the
solvers' shared view of it (prepared.py), a split and its scoring (split.py), the baseline and
heuristic splits (baselines.py), the exact DP reference (dp.py), the MILP formulations (milp.py:
shared parts and any layer sequence; options.py: embedding + identical blocks + head, and the
per-rank decomposition for interleaved chunks), their lexicographic solve (lexicographic.py) and
the entry point that picks a solver and labels what produced the split (solve.py). Imports only
planner.core."""
