"""Floor 5 - the search: what the user asked for (request.py), checked (validation.py), the rules
a configuration must pass (rules.py), the space of configurations a request allows (space.py), what
the search knows about each one (costs.py), the screen and ranking (solver.py), refinement by
branch and bound (refinement.py), one pinned configuration explained (explain.py), a search over a
measured profile (profiled.py), and the bounds and advice beside them. Imports floors 0-4."""
