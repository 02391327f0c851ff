"""Recovering an export set from a writer killed inside its swap (core/fileset.py): afterwards
the directory holds exactly the old complete set or exactly the new one, byte for byte.

The journal: before its first rename a writer writes ``.plan3d-swapping`` (fsync'ed, and the
directory with it) naming the old manifest (or none), the new manifest, every name whose file it
will move aside to ``.NAME.plan3d-old`` (the files it replaces and the old set's files the new one
drops) and every name it will create. The rule, with ``plan3d-manifest.json`` as the one commit
point of a swap:

* the new manifest is in place (``plan3d-manifest.json`` equals the journal's new one): the swap
  committed, roll forward: remove the backups;
* otherwise roll back: rename every backup over its name, remove every file the writer created
  (it did not exist before, and holds its new digest now), rename the old manifest's backup back.

Then the writer's temporaries (``*.plan3d.tmp``) and, last, the journal go: a recovery killed in
the middle is finished by the next one. Recovery runs under the directory's exclusive lock, in the
next writer and in any reader (fileset.read_set, verify_set, verified_set and with them
``plan simulate --plan``); a reader that cannot write the directory reports the set incomplete
instead. A file the writer did not create or move aside is never touched. A marker without a
readable journal (an earlier release's empty one) cannot be recovered: readers report it, the
next writer clears it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from pathlib import Path

MANIFEST = "plan3d-manifest.json"
SWAPPING = ".plan3d-swapping"  # the journal; present only while a writer swaps files in
BACKUP = ".plan3d-old"  # suffix of a file moved aside: ``.NAME.plan3d-old``
TEMP = ".plan3d.tmp"  # suffix of every temporary a writer makes
SCHEMA = "plan3d/export-swap/v1"
MAX_JOURNAL_BYTES = 1 << 20  # a journal names a handful of files: 1 MiB is a corrupt one


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def fsync_dir(out_dir: Path) -> None:
    """Make the renames in ``out_dir`` durable (best effort: not every filesystem can)."""
    try:
        fd = os.open(out_dir, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def plain_name(name) -> bool:
    """A file name inside the directory: no path, no parent."""
    return isinstance(name, str) and "/" not in name and "\0" not in name and \
        name not in ("", ".", "..")


def backup_of(out_dir: Path, name: str) -> Path:
    return out_dir / f".{name}{BACKUP}"


def is_manifest(doc) -> bool:
    files = doc.get("files") if isinstance(doc, dict) else None
    return isinstance(files, dict) and all(plain_name(k) and isinstance(v, str)
                                           for k, v in files.items())


def read_manifest(out_dir: Path) -> dict | None:
    try:
        doc = json.loads(read_regular(out_dir / MANIFEST))
    except (OSError, ValueError):
        return None
    return doc if is_manifest(doc) else None


def read_regular(path: Path) -> bytes:
    """The bytes of a regular file; OSError for anything else (a FIFO would block the read, a
    device never end it)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return handle.read()


def holds(path: Path, digest: str | None) -> bool:
    """``path`` is a regular file (not a link) with SHA-256 ``digest``."""
    try:
        if digest is None or not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        return sha256(read_regular(path)) == digest
    except OSError:
        return False


def journal_text(old: dict | None, new: dict, moved: list[str], created: list[str]) -> str:
    doc = {"schema": SCHEMA, "old": old, "new": new, "moved": moved, "created": created}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def read_journal(out_dir: Path) -> dict | None:
    """The journal of a killed writer; None when there is none or it cannot be read (a link, a
    directory, an earlier release's empty marker, a torn one)."""
    try:
        fd = os.open(out_dir / SWAPPING, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            doc = json.loads(handle.read(MAX_JOURNAL_BYTES + 1))
    except (OSError, ValueError):
        return None
    ok = isinstance(doc, dict) and doc.get("schema") == SCHEMA and is_manifest(doc.get("new")) \
        and (doc.get("old") is None or is_manifest(doc["old"])) and all(
            isinstance(doc.get(k), list) and all(plain_name(n) for n in doc[k])
            for k in ("moved", "created"))
    return doc if ok else None


def leftovers(out_dir: Path) -> bool:
    """A killed writer's journal or temporaries are in ``out_dir``."""
    try:
        return os.path.lexists(out_dir / SWAPPING) or any(out_dir.glob(f".*{TEMP}"))
    except OSError:
        return False


def roll_back(out_dir: Path, journal: dict) -> None:
    """Undo a swap that did not commit: the directory as it was before the writer came."""
    for name in journal["moved"]:
        backup = backup_of(out_dir, name)
        if os.path.lexists(backup):
            os.replace(backup, out_dir / name)
    new_files = journal["new"]["files"]
    for name in journal["created"]:
        if holds(out_dir / name, new_files.get(name)):
            unlink(out_dir / name)
    manifest_backup = backup_of(out_dir, MANIFEST)
    if os.path.lexists(manifest_backup):
        os.replace(manifest_backup, out_dir / MANIFEST)
    fsync_dir(out_dir)


def roll_forward(out_dir: Path, journal: dict) -> None:
    """Finish a swap that committed: the files moved aside go."""
    for name in [*journal["moved"], MANIFEST]:
        unlink(backup_of(out_dir, name))


def remove_temps(out_dir: Path) -> None:
    for tmp in out_dir.glob(f".*{TEMP}"):
        if tmp.is_symlink() or tmp.is_file():
            unlink(tmp)


def recover(out_dir: Path) -> bool:
    """Roll a killed writer's swap back or forward (the rule above) and clear what it left; the
    caller holds the exclusive lock. False when a marker is there but no journal can be read
    (left as it is). OSError when the directory cannot be changed."""
    marker = out_dir / SWAPPING
    if os.path.lexists(marker):
        journal = read_journal(out_dir)
        if journal is None:
            return False
        if read_manifest(out_dir) == journal["new"]:
            roll_forward(out_dir, journal)
        else:
            roll_back(out_dir, journal)
    remove_temps(out_dir)
    fsync_dir(out_dir)
    unlink(marker)  # last: until it goes, the next recovery redoes what is left
    fsync_dir(out_dir)
    return True
