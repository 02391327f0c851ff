"""Units and the one place the bundled data lives, so no module keeps its own copy."""

from __future__ import annotations

from pathlib import Path

GIB = 1024**3  # bytes in a gibibyte; GPU memory sizes are quoted in GiB

# The bundled data (hardware, stacks, validation runs): profiles/ beside planner/ in the repository
# (and an editable install), planner/profiles/ in an installed wheel, which ships it inside the
# one package it installs (pyproject.toml, [tool.setuptools.package-dir]).
_HERE = Path(__file__).resolve()
DATA_DIR = next((d for d in (_HERE.parents[1] / "profiles", _HERE.parents[2] / "profiles")
                 if d.is_dir()), _HERE.parents[2] / "profiles")
# the published runs and the validation record (planner/fidelity/): here, so a solve's error band
# reads its record without importing the runs' loaders
VALIDATION_DIR = DATA_DIR / "validation"
