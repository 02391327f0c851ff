"""Units and the one place the bundled data lives, so no module keeps its own copy."""

from __future__ import annotations

from pathlib import Path

GIB = 1024**3  # bytes in a gibibyte; GPU memory sizes are quoted in GiB

# profiles/ (hardware, stacks, validation data) sits beside planner/, in the repo and when installed.
DATA_DIR = Path(__file__).resolve().parents[2] / "profiles"
