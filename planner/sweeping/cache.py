"""The resume cache: a directory holding one small JSON file per finished point, named by the
point's input digest (digest.py). Each file is written to a temporary name beside it and renamed
into place, so a sweep killed at any moment leaves whole files only; a point whose file exists is
never solved again. Several specs may share one directory: a file is the answer to its inputs,
whichever spec asked."""

from __future__ import annotations

import json
from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.files import write_text

SCHEMA = "plan3d/sweep-point/v1"


class PointCache:
    """Finished points by digest; ``None`` as the directory is a cache that keeps nothing."""

    def __init__(self, directory: str | Path | None):
        self.directory = None if directory is None else Path(directory)
        if self.directory is not None:
            if self.directory.exists() and not self.directory.is_dir():
                raise PlanInputError(f"{self.directory}: the sweep cache must be a directory")
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise PlanInputError(f"cannot create the sweep cache {self.directory}: "
                                     f"{e.strerror or e}") from None

    def _path(self, digest: str) -> Path:
        return self.directory / f"{digest}.json"

    def get(self, digest: str) -> dict | None:
        """The outcome of a finished point, or None (not finished, or a file that is not one of
        ours: it is solved again and replaced)."""
        if self.directory is None:
            return None
        try:
            doc = json.loads(self._path(digest).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("digest") != digest:
            return None
        outcome = doc.get("outcome")
        return outcome if isinstance(outcome, dict) else None

    def put(self, digest: str, kwargs: dict, outcome: dict) -> None:
        if self.directory is None:
            return
        doc = {"schema": SCHEMA, "digest": digest, "solve": kwargs, "outcome": outcome}
        write_text(self._path(digest), json.dumps(doc, sort_keys=True), force=True)  # atomic

    def __len__(self) -> int:
        return 0 if self.directory is None else sum(1 for _ in self.directory.glob("*.json"))
