"""User text (names from files, file paths, values in messages) as data, never as code or markup.

Two independent defences: names are checked when they are loaded (:func:`check_name`: printable,
no control characters, at most MAX_NAME characters), and every place that shows text escapes it
anyway -- :func:`visible` turns each non-printable character into a ``\\uXXXX`` escape (no newline,
carriage return, U+2028 or ANSI escape sequence survives it) and :func:`for_rich` also escapes
rich console markup so that a name like ``[/bold]x`` is printed, not interpreted.
"""

from __future__ import annotations

import re

from rich.markup import escape as _rich_escape

from planner.core.limits import MAX_NAME
from planner.core.errors import PlanInputError

# CSI and OSC sequences (colour, cursor movement, window title), removed whole so that no
# parameter bytes are left behind
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: str) -> str:
    """``text`` on one line with ANSI escape sequences removed and every other non-printable
    character (newline, CR, NUL, U+2028, ...) written as a backslash escape."""
    text = _ANSI.sub("", str(text))
    return "".join(ch if ch.isprintable() else _escape_char(ch) for ch in text)


def for_rich(text: str) -> str:
    """:func:`visible`, with rich markup escaped: safe inside a string rich renders as markup."""
    return _rich_escape(visible(text))


def name_problem(value) -> str | None:
    """Why ``value`` cannot be a name (None when it can)."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value.strip():
        return "must not be empty"
    if len(value) > MAX_NAME:
        return f"is {len(value)} characters long; at most {MAX_NAME}"
    bad = next((ch for ch in value if not ch.isprintable()), None)
    if bad is not None:
        return (f"contains the control or invisible character {_escape_char(bad)}; use printable "
                "characters only")
    return None


def check_name(value, where: str) -> str:
    """``value`` when it is a clean name, else one PlanInputError line saying where and why."""
    problem = name_problem(value)
    if problem:
        raise PlanInputError(f"{where} {problem}")
    return value
