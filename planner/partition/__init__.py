"""Floor 2 - splitting a layer sequence into pipeline stages: the problem (problem.py), the exact
DP reference (dp.py), the MILP (milp.py) and the entry point that picks a solver (solve.py).
Imports only planner.core."""
