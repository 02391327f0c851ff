"""Writing files the user asked for: atomically, and never over theirs without --force."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.fileset import OutputError, output_error
from planner.core.jsonfile import read_json_file


def refuse_overwrite(paths, force: bool) -> None:
    if force:
        return
    for path in paths:
        if Path(path).exists():
            raise PlanInputError(f"{path} exists; pass --force to overwrite")


def write_text(path: str | Path, text: str, force: bool = False,
               executable: bool = False) -> Path:
    """``text`` written atomically (:func:`write_file`)."""
    def fill(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)

    return write_file(path, fill, force, executable)


def write_file(path: str | Path, fill, force: bool = False, executable: bool = False) -> Path:
    """``fill(tmp)`` writes a temporary file beside ``path``, renamed over it when done: readers
    never see half. Any OS error (permission, disk full, a directory in the way) is one
    OutputError line."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{path} is a directory; give a file name")
    refuse_overwrite([path], force)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        fill(tmp)
        os.chmod(tmp, 0o755 if executable else 0o644)
        os.replace(tmp, path)
    except OSError as e:
        raise output_error(e, path) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return path


def read_json(path: str | Path, what: str, missing_hint: str = ""):
    """Parse a JSON input file, or one clear PlanInputError line saying what is wrong and what
    to do (regular files of at most 16 MiB, finite numbers, bounded nesting: core/jsonfile.py)."""
    return read_json_file(path, what, missing_hint)


@contextmanager
def scratch_dir(prefix: str = "plan3d-"):
    """A private temporary directory, removed with everything in it when the block ends, also on
    Ctrl-C (a solver's temporary model and solution files go there)."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
