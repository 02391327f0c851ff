"""Floor 1 - which global rank holds which (tp, pp, dp) coordinate, on which node, and which
groups cross nodes. Imports only planner.core."""
