"""A point's input digest: what its solve depends on, hashed. The cache (cache.py) is keyed by it,
so a point is reused exactly when its answer cannot have changed:

* the solve's keyword arguments (a model or stack given as a file counts by its content, not its
  path), and
* the planner itself: its source and bundled data (a new cost model is a new answer).
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from planner.core.units import DATA_DIR

FILE_VALUED = ("model", "stack")  # solve inputs that may name a file


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@lru_cache(maxsize=1)
def code_digest() -> str:
    """The planner's source (planner/**/*.py) and bundled data (profiles/), hashed once."""
    package = Path(__file__).resolve().parents[1]
    files = [(p.relative_to(package), p) for p in sorted(package.rglob("*.py"))]
    files += [(Path("profiles") / p.relative_to(DATA_DIR), p)
              for p in sorted(DATA_DIR.rglob("*")) if p.is_file()]
    h = hashlib.sha256()
    for name, path in files:
        h.update(f"{name.as_posix()}\0{_sha256(path.read_bytes())}\n".encode())
    return h.hexdigest()


def file_digest(path: str) -> str:
    """A file's SHA-256, read again whenever its size or modification time changes."""
    info = Path(path).stat()
    return _file_digest(path, info.st_size, info.st_mtime_ns)


@lru_cache(maxsize=256)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    return _sha256(Path(path).read_bytes())


def point_digest(kwargs: dict) -> str:
    """The digest of one point: its solve arguments, file contents and the planner's code."""
    doc = {}
    for key, value in sorted(kwargs.items()):
        if key in FILE_VALUED and isinstance(value, str) and Path(value).is_file():
            value = {"file sha256": file_digest(value)}
        doc[key] = value
    text = json.dumps({"solve": doc, "planner": code_digest()}, sort_keys=True)
    return _sha256(text.encode())[:32]
