"""Writing a set of files (one export: plan.json, launch.sh, ...) all-or-nothing and one writer
at a time, so that nobody runs ``launch.sh`` of one plan with ``megatron_args.sh`` of another.

How: writers to one directory take an exclusive ``flock`` on the directory itself (readers through
:func:`read_set` a shared one): no lock file is left behind, and none can be a symlink that sends
the write elsewhere or a FIFO that blocks the open. Inside it every new file is first written completely beside its
target (a temporary file, fsync'ed); only then is the old manifest removed, each file renamed into
place (the one it replaces kept as a backup) and the new manifest ``plan3d-manifest.json`` -- the
SHA-256 of every file in the set -- written last. Any error before the manifest (disk full,
permission, a file in the way) restores the backups and the old manifest: the directory is as it
was. A writer killed between the renames leaves no manifest and its ``.plan3d-swapping`` marker,
which :func:`verify_set` and :func:`read_set` report as an incomplete set instead of handing out a
mix (tests/test_fileset_kill.py kills a writer at every rename); the next writer clears what it
left. Files of the previous set that the new one does
not contain are removed with it (a stale ``megatron_args.sh`` would otherwise be sourced by a new
``launch.sh``).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from planner.core.errors import PlanInputError

MANIFEST = "plan3d-manifest.json"
LOCK = ".plan3d.lock"  # the lock file of earlier releases: removed by the next writer
SCHEMA = "plan3d/export-set/v1"
_BACKUP = ".plan3d-old"
# present only while a writer swaps files in: found with no valid manifest, a writer was killed
SWAPPING = ".plan3d-swapping"


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


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{f.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o755 if f.executable else 0o644)
    except BaseException:
        _unlink(Path(tmp))
        raise
    return Path(tmp), _sha256(data)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _read_manifest(out_dir: Path) -> dict | None:
    try:
        doc = json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict) or not all(isinstance(k, str) and "/" not in k and k not in
                                              ("", ".", "..") for k in files):
        return None
    return doc


def _fsync_dir(out_dir: Path) -> None:
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


def write_set(out_dir: str | Path, files: list[OutFile], force: bool = False,
              tag: str = "") -> list[Path]:
    """Replace the file set in ``out_dir`` by ``files`` all at once; their paths in order.

    Refuses (PlanInputError) when a file exists and ``force`` is off; OutputError with one line on
    any OS error, with the directory left as it was."""
    out_dir = Path(out_dir)
    names = [f.name for f in files]
    if len(set(names)) != len(names) or MANIFEST in names or any(
            "/" in n or n in ("", ".", "..") or n.startswith(".") for n in names):
        raise ValueError(f"bad file names for a set: {names}")
    _prepare_dir(out_dir)
    with _locked(out_dir, exclusive=True):
        old = _read_manifest(out_dir)
        stale_names = [n for n in (old or {}).get("files", {}) if n not in names]
        if not force:
            for name in names:
                if (out_dir / name).exists() or (out_dir / name).is_symlink():
                    raise PlanInputError(f"{out_dir / name} exists; pass --force to overwrite")
            present = [n for n in stale_names if (out_dir / n).exists()]
            if present:
                raise PlanInputError(f"{out_dir} holds {present[0]} of an earlier export, which "
                                     "this one replaces; pass --force to replace the set")
        # left by a writer that was killed (no writer is alive: we hold the lock), and the lock
        # file of earlier releases (a file, a link or a FIFO: the name is unlinked, never followed)
        for stale in [*out_dir.glob(f".*{_BACKUP}"), *out_dir.glob(".*.tmp"), out_dir / LOCK,
                      out_dir / SWAPPING]:
            if stale.is_symlink() or stale.exists() and not stale.is_dir():
                _unlink(stale)
        temps: dict[str, Path] = {}
        digests: dict[str, str] = {}
        try:
            for f in files:
                temps[f.name], digests[f.name] = _write_temp(out_dir, f)
        except OSError as e:
            for tmp in temps.values():
                _unlink(tmp)
            raise output_error(e, out_dir / f.name) from None
        except BaseException:
            for tmp in temps.values():
                _unlink(tmp)
            raise
        manifest = {"schema": SCHEMA, "tag": tag, "files": digests}
        _swap(out_dir, names, temps, stale_names, manifest)
    return [out_dir / name for name in names]


def _swap(out_dir: Path, names: list[str], temps: dict[str, Path], stale_names: list[str],
          manifest: dict) -> None:
    """Old manifest out, files in (old ones kept as backups), new manifest in; undo on error."""
    moved: list[tuple[Path, Path | None]] = []  # (target, its backup or None when it was new)
    manifest_path = out_dir / MANIFEST
    manifest_backup = out_dir / f".{MANIFEST}{_BACKUP}"
    had_manifest = False
    current = manifest_path  # what an error message names
    marker = out_dir / SWAPPING
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644))
        if manifest_path.exists():
            os.replace(manifest_path, manifest_backup)
            had_manifest = True
        for name in stale_names:
            target = out_dir / name
            if target.is_file() and not target.is_symlink():
                backup = out_dir / f".{name}{_BACKUP}"
                os.replace(target, backup)
                moved.append((target, backup))
        for name in names:
            target = current = out_dir / name
            backup = None
            if target.is_dir() and not target.is_symlink():
                raise IsADirectoryError(errno.EISDIR, "a directory is in the way", str(target))
            if target.exists() or target.is_symlink():
                backup = out_dir / f".{name}{_BACKUP}"
                os.replace(target, backup)
            moved.append((target, backup))
            os.replace(temps[name], target)
            del temps[name]
        current = manifest_path
        text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
        tmp, _ = _write_temp(out_dir, OutFile(MANIFEST, text))
        os.replace(tmp, manifest_path)
    except BaseException as e:
        for tmp in temps.values():
            _unlink(tmp)
        for target, backup in reversed(moved):
            try:
                if backup is not None:
                    os.replace(backup, target)
                elif target.exists():
                    _unlink(target)
            except OSError:
                pass
        if had_manifest:
            try:
                os.replace(manifest_backup, manifest_path)
            except OSError:
                pass
        _unlink(marker)
        if isinstance(e, OSError):
            raise output_error(e, current) from None
        raise
    for _, backup in moved:
        if backup is not None:
            _unlink(backup)
    _unlink(manifest_backup)
    _unlink(marker)
    _fsync_dir(out_dir)


def verify_set(out_dir: str | Path) -> str | None:
    """Why the set in ``out_dir`` is not one complete export (None when it is, or when the
    directory holds no plan3d set at all)."""
    out_dir = Path(out_dir)
    with _locked(out_dir, exclusive=False):
        return _problem(out_dir)


def _problem(out_dir: Path) -> str | None:
    manifest = _read_manifest(out_dir)
    if manifest is None:
        killed = (out_dir / SWAPPING).exists() or (out_dir / SWAPPING).is_symlink()
        if (out_dir / MANIFEST).exists() or killed:
            return (f"{out_dir} holds an incomplete export (no valid {MANIFEST}: an export was "
                    "interrupted); export again with --force")
        return None
    for name, digest in manifest["files"].items():
        try:
            data = (out_dir / name).read_bytes()
        except OSError as e:
            return f"{out_dir / name} of the export set cannot be read ({e.strerror}); export again"
        if _sha256(data) != digest:
            return (f"{out_dir / name} does not match {MANIFEST} (edited, or from another "
                    "export); export again with --force")
    return None


def read_set(out_dir: str | Path) -> dict[str, str]:
    """The texts of the complete, verified set in ``out_dir`` ({name: text}), read under the
    shared lock so that no writer can swap files in between; PlanInputError when incomplete."""
    out_dir = Path(out_dir)
    with _locked(out_dir, exclusive=False):
        problem = _problem(out_dir)
        if problem:
            raise PlanInputError(problem)
        manifest = _read_manifest(out_dir)
        if manifest is None:
            raise PlanInputError(f"{out_dir} holds no plan3d export set ({MANIFEST} missing)")
        return {name: (out_dir / name).read_text(encoding="utf-8") for name in manifest["files"]}
