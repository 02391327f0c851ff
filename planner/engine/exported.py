"""What an engine harness reads from an export directory (plan.json, ds_config.json,
torchtitan.toml): only from one complete export set, the check the exported launch.sh makes before
it starts torchrun (launchers/torchrun.py). Every file the set's ``plan3d-manifest.json`` lists
must match its SHA-256, under the directory's shared lock and after recovering a writer killed
in its swap (core/fileset.py read_set), so no harness steps plan.json of one plan with the
ds_config.json of another. No torch here: the check runs, and is tested, without an engine.
"""

from __future__ import annotations

import json
from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.fileset import MANIFEST, read_set

PLAN = "plan.json"


def read_export(directory: str | Path, names: tuple[str, ...] = (PLAN,)) -> dict[str, str]:
    """The texts of ``names`` in the verified export set in ``directory``; PlanInputError (one
    line) when the set is incomplete, edited, mixed, or lacks one of them."""
    directory = Path(directory)
    texts = read_set(directory)
    missing = [name for name in names if name not in texts]
    if missing:
        raise PlanInputError(f"{directory}: the export set ({MANIFEST}) holds no {missing[0]}; "
                             "export the plan with the target that writes it")
    return {name: texts[name] for name in names}


def read_documents(directory: str | Path, names: tuple[str, ...] = (PLAN,)) -> dict[str, dict]:
    """:func:`read_export` of JSON files, each parsed."""
    texts = read_export(directory, names)
    try:
        return {name: json.loads(text) for name, text in texts.items()}
    except ValueError as e:
        raise PlanInputError(f"{directory}: a file of the export set is not JSON ({e})") from None


def plan_document(directory: str | Path) -> dict:
    """The plan.json document of the verified export set in ``directory``."""
    return read_documents(directory)[PLAN]
