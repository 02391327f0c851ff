"""Writing a set of files (one export: plan.json, launch.sh, ...) all-or-nothing and one writer
at a time, so that nobody runs ``launch.sh`` of one plan with ``megatron_args.sh`` of another.

How: writers to one directory take an exclusive ``flock`` on the directory itself (readers through
:func:`read_set` a shared one): no lock file is left behind, and none can be a symlink that sends
the write elsewhere or a FIFO that blocks the open. Anything at an output name that is not a
regular file or a symlink (a directory, a FIFO, a device) is refused before anything is written.
Inside the lock every new file is first written completely beside its target (a temporary
``*.plan3d.tmp``, fsync'ed); then the journal ``.plan3d-swapping`` (fsync'ed: what the swap will
do, core/swap_recovery.py); only then is the old manifest moved aside, every file the set
replaces or drops moved aside to a ``.NAME.plan3d-old`` backup, the new files renamed into place
and the new manifest ``plan3d-manifest.json`` -- the SHA-256 of every file in the set -- renamed in
last: that rename is the commit point. Any error before it (disk full, permission) restores the
backups and the old manifest: the directory is as it was. A writer killed anywhere in the swap
leaves its journal, and the next writer or reader recovers first, under the exclusive lock: back
to the old complete set when the new manifest is not in place, forward to the new one when it is
(core/swap_recovery.py; tests/test_fileset_kill.py kills a writer at every rename and unlink).
Readers (:func:`read_set`, :func:`verify_set`, :func:`verified_set`: ``plan simulate --plan``)
refuse a set whose files do not match its manifest, and so does the exported launch.sh
(launchers/torchrun.py). Files of the previous set that the new one does not contain are removed
with it (a stale ``megatron_args.sh`` would otherwise be sourced by a new ``launch.sh``).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from planner.core import swap_recovery as rec
from planner.core.errors import PlanInputError
from planner.core.swap_recovery import BACKUP, MANIFEST, SWAPPING, TEMP, fsync_dir, unlink

LOCK = ".plan3d.lock"  # the lock file of earlier releases: removed by the next writer
SCHEMA = "plan3d/export-set/v1"
__all__ = ["LOCK", "MANIFEST", "SCHEMA", "SWAPPING", "OutFile", "OutputError", "output_error",
           "read_set", "verified_set", "verify_set", "write_set"]


class OutputError(PlanInputError):
    """A file could not be written (permission, disk full, a directory in the way): one line."""


def output_error(e: OSError, path=None, changed: bool = False) -> OutputError:
    where = path or e.filename or "output"
    reason = e.strerror or str(e)
    tail = "" if changed else "; nothing was changed"
    return OutputError(f"cannot write {where}: {reason}{tail}")


@dataclass(frozen=True)
class OutFile:
    name: str  # a plain file name inside the directory
    text: str
    executable: bool = False


@contextmanager
def _locked(out_dir: Path, exclusive: bool):
    """``flock`` on the directory (Linux and macOS lock a directory's descriptor as a file's).
    A reader of a directory that does not exist takes no lock: no writer has been there."""
    try:
        fd = os.open(out_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as e:
        if exclusive:
            raise output_error(e, out_dir) from None
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _prepare_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputError(f"{out_dir} is a file, not a directory; give --out a directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(e, out_dir) from None


def _write_temp(out_dir: Path, f: OutFile) -> tuple[Path, str]:
    """The file's text in a temporary file beside its target; (temp path, sha256)."""
    data = f.text.encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{f.name}.", suffix=TEMP)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o755 if f.executable else 0o644)
    except BaseException:
        unlink(Path(tmp))
        raise
    return Path(tmp), rec.sha256(data)


_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}


def _refuse_non_files(out_dir: Path, names: list[str]) -> None:
    """A directory, FIFO, socket or device at an output name: refused before anything is written
    (a regular file or a symlink is replaced by the rename, never followed)."""
    for name in names:
        try:
            mode = os.lstat(out_dir / name).st_mode
        except FileNotFoundError:
            continue
        except OSError as e:
            raise output_error(e, out_dir / name) from None
        kind = _KINDS.get(stat.S_IFMT(mode))
        if kind:
            raise OutputError(f"cannot write {out_dir / name}: {kind} is in the way; remove it "
                              "or choose another --out; nothing was changed")


def _clear_leftovers(out_dir: Path, names: list[str]) -> None:
    """What killed writers left, once no writer is alive (the caller holds the exclusive lock):
    a journaled swap is rolled back or forward (core/swap_recovery.py); an earlier release's
    marker, backups, temporaries and lock file go. A name is unlinked, never followed."""
    try:
        if rec.recover(out_dir):
            legacy = []
        else:  # an earlier release's marker: it journaled nothing; its backups are moot
            legacy = [*out_dir.glob(f".*{BACKUP}"), out_dir / SWAPPING]
        # earlier releases' temporaries were ``.NAME.XXXXXXXX.tmp`` (tempfile.mkstemp)
        legacy += [p for n in names for p in out_dir.glob(f".{n}.????????.tmp")]
        for stale in [*legacy, out_dir / LOCK]:
            if stale.is_symlink() or stale.exists() and not stale.is_dir():
                unlink(stale)
    except OSError as e:
        raise output_error(e, out_dir) from None


def write_set(out_dir: str | Path, files: list[OutFile], force: bool = False,
              tag: str = "") -> list[Path]:
    """Replace the file set in ``out_dir`` by ``files`` all at once; their paths in order.

    Refuses (PlanInputError) when a file exists and ``force`` is off; OutputError with one line on
    any OS error, with the directory left as it was."""
    out_dir = Path(out_dir)
    names = [f.name for f in files]
    if len(set(names)) != len(names) or MANIFEST in names or any(
            not rec.plain_name(n) or n.startswith(".") for n in names):
        raise ValueError(f"bad file names for a set: {names}")
    _prepare_dir(out_dir)
    with _locked(out_dir, exclusive=True):
        old = rec.read_manifest(out_dir)
        _clear_leftovers(out_dir, [*names, *(old or {}).get("files", {}), MANIFEST])
        old = rec.read_manifest(out_dir)  # the set recovery left
        stale_names = [n for n in (old or {}).get("files", {}) if n not in names]
        _refuse_non_files(out_dir, [*names, MANIFEST])
        if not force:
            for name in names:
                if os.path.lexists(out_dir / name):
                    raise PlanInputError(f"{out_dir / name} exists; pass --force to overwrite")
            present = [n for n in stale_names if (out_dir / n).exists()]
            if present:
                raise PlanInputError(f"{out_dir} holds {present[0]} of an earlier export, which "
                                     "this one replaces; pass --force to replace the set")
        temps: dict[str, Path] = {}
        digests: dict[str, str] = {}
        try:
            for f in files:
                temps[f.name], digests[f.name] = _write_temp(out_dir, f)
        except OSError as e:
            for tmp in temps.values():
                unlink(tmp)
            raise output_error(e, out_dir / f.name) from None
        except BaseException:
            for tmp in temps.values():
                unlink(tmp)
            raise
        manifest = {"schema": SCHEMA, "tag": tag, "files": digests}
        _swap(out_dir, names, temps, stale_names, old, manifest)
    return [out_dir / name for name in names]


def _swap(out_dir: Path, names: list[str], temps: dict[str, Path], stale_names: list[str],
          old: dict | None, manifest: dict) -> None:
    """Journal in; old manifest, replaced and dropped files aside; new files in; new manifest in
    (the commit point); backups and journal out. Rolled back on any error before the commit."""
    # what the swap moves aside: the old set's regular files it drops, and every file it replaces
    moved = [n for n in stale_names if (out_dir / n).is_file() and not (out_dir / n).is_symlink()]
    moved += [n for n in names if os.path.lexists(out_dir / n)]
    created = [n for n in names if n not in moved]
    journal = rec.journal_text(old, manifest, moved, created)
    manifest_path = out_dir / MANIFEST
    current = manifest_path  # what an error message names
    journaled = False
    try:
        tmp, _ = _write_temp(out_dir, OutFile(SWAPPING, journal))
        os.replace(tmp, out_dir / SWAPPING)
        journaled = True
        fsync_dir(out_dir)  # the journal is on disk before the first file moves
        if os.path.lexists(manifest_path):
            os.replace(manifest_path, rec.backup_of(out_dir, MANIFEST))
        for name in moved:
            current = out_dir / name
            if current.is_dir() and not current.is_symlink():  # made since the check
                raise IsADirectoryError(errno.EISDIR, "a directory is in the way", str(current))
            os.replace(current, rec.backup_of(out_dir, name))
        for name in names:
            current = out_dir / name
            os.replace(temps[name], current)
            del temps[name]
        fsync_dir(out_dir)  # the files are in before the manifest says so
        current = manifest_path
        text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
        tmp, _ = _write_temp(out_dir, OutFile(MANIFEST, text))
        os.replace(tmp, manifest_path)  # the commit point
    except BaseException as e:
        for tmp in temps.values():
            unlink(tmp)
        try:
            if journaled:
                rec.roll_back(out_dir, {"moved": moved, "created": created, "new": manifest})
            rec.remove_temps(out_dir)
            unlink(out_dir / SWAPPING)
        except OSError:
            pass  # what is left, the next writer or reader rolls back from the journal
        fsync_dir(out_dir)
        if isinstance(e, OSError):
            raise output_error(e, current) from None
        raise
    try:
        fsync_dir(out_dir)
        rec.roll_forward(out_dir, {"moved": moved})
        unlink(out_dir / SWAPPING)
        fsync_dir(out_dir)
    except OSError:
        pass  # committed: the next writer or reader clears the backups from the journal


@contextmanager
def verified_set(out_dir: str | Path):
    """Hold the set in ``out_dir`` still (the shared lock: no writer swaps files in) once its
    files are checked against its manifest, and yield the manifest (None when the directory
    holds no plan3d set); PlanInputError when it is incomplete or modified. A killed writer's
    swap is recovered first (core/swap_recovery.py), where the directory can be written."""
    out_dir = Path(out_dir)
    if rec.leftovers(out_dir):
        try:
            with _locked(out_dir, exclusive=True):
                rec.recover(out_dir)
        except (OSError, PlanInputError):
            pass  # a directory this reader may not change: the set is reported incomplete below
    with _locked(out_dir, exclusive=False):
        problem = _problem(out_dir)
        if problem:
            raise PlanInputError(problem)
        yield rec.read_manifest(out_dir)


def verify_set(out_dir: str | Path) -> str | None:
    """Why the set in ``out_dir`` is not one complete export (None when it is, or when the
    directory holds no plan3d set at all); a killed writer's swap is recovered first."""
    try:
        with verified_set(out_dir):
            return None
    except PlanInputError as e:
        return str(e)


def _problem(out_dir: Path) -> str | None:
    manifest = rec.read_manifest(out_dir)
    if manifest is None:
        if os.path.lexists(out_dir / MANIFEST) or os.path.lexists(out_dir / SWAPPING):
            return (f"{out_dir} holds an incomplete export (no valid {MANIFEST}: an export was "
                    "interrupted); export again with --force")
        return None
    for name, digest in manifest["files"].items():
        try:
            data = rec.read_regular(out_dir / name)
        except OSError as e:
            return f"{out_dir / name} of the export set cannot be read ({e.strerror}); export again"
        if rec.sha256(data) != digest:
            return (f"{out_dir / name} does not match {MANIFEST} (edited, or from another "
                    "export); export again with --force")
    return None


def read_set(out_dir: str | Path) -> dict[str, str]:
    """The texts of the complete, verified set in ``out_dir`` ({name: text}), read under the
    shared lock so that no writer can swap files in between; PlanInputError when incomplete."""
    out_dir = Path(out_dir)
    with verified_set(out_dir) as manifest:
        if manifest is None:
            raise PlanInputError(f"{out_dir} holds no plan3d export set ({MANIFEST} missing)")
        return {name: rec.read_regular(out_dir / name).decode("utf-8")
                for name in manifest["files"]}
