"""Floor 6 - how close predictions come to published training runs. Imports floors 0-5."""
