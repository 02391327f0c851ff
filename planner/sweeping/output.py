"""Writing a sweep's files: the rows as CSV or Parquet, the plots as SVG or HTML. Each is checked
before the sweep runs (a suffix we write, no file of the user's in the way without --force) and
written atomically after it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.files import refuse_overwrite, write_file, write_text

TABLE_SUFFIXES = (".csv", ".parquet")
PLOT_SUFFIXES = (".svg", ".html")


def check_output(path, suffixes, flag: str, force: bool) -> Path | None:
    """``path`` if it is one we can write (its suffix known, nothing in the way), else one line."""
    if path is None:
        return None
    path = Path(path)
    if path.suffix.lower() not in suffixes:
        raise PlanInputError(f"{flag} {path}: give a {' or '.join(suffixes)} file")
    if path.is_dir():
        raise PlanInputError(f"{flag} {path} is a directory; give a file name")
    if path.suffix.lower() == ".parquet" and importlib.util.find_spec("pyarrow") is None:
        raise PlanInputError(f"{flag} {path}: writing Parquet needs pyarrow (pip install "
                             "pyarrow); or give a .csv file")
    refuse_overwrite([path], force)
    return path


def write_frame(frame, path, force: bool = False) -> Path:
    """The rows as CSV (no index: the ``point`` column is the order) or Parquet (pyarrow)."""
    path = check_output(path, TABLE_SUFFIXES, "--out", force)
    if path.suffix.lower() == ".csv":
        return write_text(path, frame.to_csv(index=False, lineterminator="\n"), force=force)
    return write_file(path, lambda tmp: frame.to_parquet(tmp, index=False, engine="pyarrow"),
                      force)
