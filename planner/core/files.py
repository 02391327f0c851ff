"""Writing files the user asked for: atomically, and never over theirs without --force."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from planner.core.errors import PlanInputError


def refuse_overwrite(paths, force: bool) -> None:
    if force:
        return
    for path in paths:
        if Path(path).exists():
            raise PlanInputError(f"{path} exists; pass --force to overwrite")


def write_text(path: str | Path, text: str, force: bool = False,
               executable: bool = False) -> Path:
    """Write to a temporary file beside ``path`` and rename it over: readers never see half."""
    path = Path(path)
    refuse_overwrite([path], force)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.chmod(tmp, 0o755 if executable else 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_json(path: str | Path, what: str, missing_hint: str = ""):
    """Parse a JSON file, or one clear PlanInputError line saying what is wrong and what to do."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        hint = f"; {missing_hint}" if missing_hint else ""
        raise PlanInputError(f"{what} {path} not found{hint}")
    except json.JSONDecodeError as e:
        raise PlanInputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); fix the file")
    except (OSError, UnicodeDecodeError) as e:
        raise PlanInputError(f"{path}: cannot read the {what} ({e})")
