"""Floor 0 - the shared vocabulary: error types, units, safe file I/O and the plan types
(Parallel, Stage, Metrics, Plan). Imports nothing else from planner."""
