"""What the CLI prints when something goes wrong, and JSON that is always valid JSON.

An error is one line on stderr: its text passes through core.text.for_rich, so a name holding
rich markup (``[/bold]x``) or an ANSI escape from a file is shown, never interpreted. With
``--json`` the same error is also a JSON document on stdout, so scripts always get something to
parse: ``{"plans": [], "error": {"kind", "message", "exit_code"}, "rejected": {...}}``.
JSON never carries NaN or Infinity (not JSON, and a sign of a bug): they become null.
"""

from __future__ import annotations

import json
import math

from planner.core.text import for_rich, visible

INPUT_ERROR = 2  # bad input (a file, a flag, an output path): say what to change
NOTHING_FITS = 1  # the search found no plan that fits


def error_markup(label: str, message: str) -> str:
    """``label: message`` as rich markup, the message escaped and on one line."""
    return f"[bold red]{label}:[/bold red] {for_rich(message)}"


def error_document(kind: str, message: str, exit_code: int,
                   rejected: dict[str, int] | None = None) -> dict:
    """The --json answer to a failed command."""
    return {"plans": [], "error": {"kind": kind, "message": visible(message),
                                   "exit_code": exit_code},
            "rejected": dict(rejected or {})}


def finite(doc):
    """``doc`` with every non-finite float replaced by None (JSON has no NaN/Infinity)."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [finite(v) for v in doc]
    return doc


def json_text(doc) -> str:
    """Indented JSON text of ``doc``, non-finite numbers as null (walked only when present)."""
    try:
        return json.dumps(doc, indent=2, allow_nan=False) + "\n"
    except ValueError:
        return json.dumps(finite(doc), indent=2, allow_nan=False) + "\n"
