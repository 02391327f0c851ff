"""Floor 5 - the search: the space of configurations a request allows (space.py) and the screen,
refinement and ranking over it (solver.py). Imports floors 0-4."""
