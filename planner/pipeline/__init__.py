"""Floor 2 - pipeline schedules (which op each rank runs, in which order) and their op-by-op
timing simulation. Imports only planner.core."""
