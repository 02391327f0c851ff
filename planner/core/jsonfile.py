"""Reading a JSON input file without trusting it: regular files only, a size cap, no NaN/Infinity,
bounded nesting, no key given twice, and one PlanInputError line (the file and what is wrong) instead of a traceback.

Why each guard: ``--model /dev/zero`` or a FIFO would block or read forever (so the file is opened
non-blocking and must be a regular file); a multi-gigabyte file would be read whole (so at most
MAX_BYTES); ``json`` accepts ``NaN``/``Infinity``/``1e400`` (non-finite numbers that then rank
plans as NaN) and 100,000-deep arrays raise RecursionError (so both are refused here).
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

from planner.core.limits import MAX_FILE_BYTES, MAX_JSON_DEPTH
from planner.core.errors import PlanInputError

MAX_BYTES = MAX_FILE_BYTES
MAX_DEPTH = MAX_JSON_DEPTH


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 40:  # far beyond any count we use; int() of 10^6 digits is slow
        raise ValueError(f"an integer with {len(text)} digits is out of range")
    return int(text)


def read_bytes(path: str | Path, what: str, missing_hint: str = "",
               limit: int = MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, or one clear PlanInputError."""
    path = Path(path)
    hint = f"; {missing_hint}" if missing_hint else ""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat below then refuses it.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise PlanInputError(f"{what} {path} not found{hint}") from None
    except IsADirectoryError:
        raise PlanInputError(f"{path}: is a directory, not a {what}; give a JSON file") from None
    except OSError as e:
        raise PlanInputError(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise PlanInputError(f"{path}: is a directory, not a {what}; give a JSON file")
        if not stat.S_ISREG(info.st_mode):
            raise PlanInputError(f"{path}: not a regular file (a device, FIFO or socket); "
                                 f"give the {what} as a JSON file")
        if info.st_size > limit:
            raise PlanInputError(f"{path}: {info.st_size} bytes, more than the {limit // 2**20} "
                                 f"MiB a {what} may have; is it the right file?")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            data = f.read(limit + 1)
    except OSError as e:
        raise PlanInputError(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > limit:  # grew while we read it
        raise PlanInputError(f"{path}: more than the {limit // 2**20} MiB a {what} may have")
    return data


class DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list) -> dict:
    """An object's members, refusing a key given twice (json would keep the last one)."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise DuplicateKey(key)
        seen.add(key)
    return dict(pairs)


def parse_json(data: bytes, origin: str):
    """Decode UTF-8 JSON text: finite numbers only, nesting at most MAX_DEPTH."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise PlanInputError(f"{origin}: not UTF-8 text (byte {e.start}); save it as UTF-8 JSON") \
            from None
    if not text.strip():
        raise PlanInputError(f"{origin}: the file is empty; it should hold JSON")
    try:
        doc = json.loads(text, parse_int=_bounded_int, object_pairs_hook=_unique_keys)
    except DuplicateKey as e:
        raise PlanInputError(f"{origin}: '{e.key}' is given twice in one object (JSON keeps only "
                             "the last silently); keep one") from None
    except json.JSONDecodeError as e:
        raise PlanInputError(f"{origin}: not valid JSON ({e.msg} at line {e.lineno}); fix the file") \
            from None
    except RecursionError:
        raise PlanInputError(f"{origin}: JSON nested too deeply; at most {MAX_DEPTH} levels") \
            from None
    except ValueError as e:  # an integer with thousands of digits
        raise PlanInputError(f"{origin}: {str(e).splitlines()[0]}") from None
    depth = nesting_depth(doc)
    if depth > MAX_DEPTH:
        raise PlanInputError(f"{origin}: JSON nested {depth} levels deep; at most {MAX_DEPTH}")
    where, value = first_non_finite(doc)
    if where is not None:  # NaN, Infinity, or a number like 1e400 that overflows to it
        shown = "NaN" if math.isnan(value) else ("-" if value < 0 else "") + "Infinity"
        raise PlanInputError(f"{origin}: '{where}' is {shown}, not a finite number; write a "
                             "finite number")
    return doc


def first_non_finite(doc) -> tuple[str | None, float]:
    """(path, value) of the first NaN or infinite number in ``doc`` (path like 'layers[2].fwd_s'),
    or (None, 0.0); without recursion."""
    stack = [("", doc)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            return path or "(the document)", node
        if isinstance(node, dict):
            items = [(f"{path}.{k}" if path else str(k), v) for k, v in node.items()]
        elif isinstance(node, list):
            items = [(f"{path}[{i}]", v) for i, v in enumerate(node)]
        else:
            continue
        stack.extend(reversed(items))  # document order
    return None, 0.0


def nesting_depth(doc) -> int:
    """How deeply lists and objects nest (a scalar is 0), without recursion."""
    deepest, stack = 0, [(doc, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            depth += 1
            deepest = max(deepest, depth)
            if depth <= MAX_DEPTH:  # deeper than that is refused anyway
                stack.extend((child, depth) for child in node)
    return deepest


def read_json_file(path: str | Path, what: str, missing_hint: str = ""):
    """Parse a JSON input file, or raise one PlanInputError line naming the file."""
    return parse_json(read_bytes(path, what, missing_hint), str(path))
