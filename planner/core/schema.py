"""One strict schema per input file: declared fields, their types and ranges, nothing else.

A schema is a dict ``{key: Field}``. :func:`check_object` refuses unknown keys (with a difflib
"did you mean" when one is close: ``num_kv_head`` -> ``num_kv_heads``), missing required keys,
booleans where numbers belong, fractions where integers belong (8.0, 1e30), non-finite numbers and
values outside a field's range. Every refusal is one PlanInputError line naming the file and the
field, which the CLI turns into exit code 2.

Field constructors: :func:`Int`, :func:`Num`, :func:`Text`, :func:`Name`, :func:`Bool`,
:func:`OneOf`, :func:`Free` (kept as it is: documentation such as ``sources``).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

from planner.core.text import MAX_NAME, name_problem, visible
from planner.core.errors import PlanInputError

MAX_TEXT = 4096  # free text (notes, sources); names are capped at MAX_NAME
MAX_INT = 2**53  # every integer we read stays exact as a float


@dataclass(frozen=True)
class Field:
    """One key of a JSON object: its kind ("int", "num", "text", "name", "bool", "choice",
    "free"), whether it must be present, whether null means absent, and its range."""

    kind: str
    required: bool = False
    nullable: bool = False
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low < x instead of low <= x
    choices: tuple = ()


def Int(low: int | None = None, high: int | None = MAX_INT, required: bool = False,
        nullable: bool = False) -> Field:
    return Field("int", required, nullable, low, high)


def Num(low: float | None = None, high: float | None = None, low_open: bool = False,
        required: bool = False, nullable: bool = False) -> Field:
    return Field("num", required, nullable, low, high, low_open)


def Text(required: bool = False, nullable: bool = False) -> Field:
    return Field("text", required, nullable)


def Name(required: bool = False, nullable: bool = False) -> Field:
    return Field("name", required, nullable)


def Bool(required: bool = False, nullable: bool = False) -> Field:
    return Field("bool", required, nullable)


def OneOf(*choices, required: bool = False, nullable: bool = False) -> Field:
    return Field("choice", required, nullable, choices=tuple(choices))


def Free(required: bool = False) -> Field:
    return Field("free", required, True)


def suggestion(word: str, options) -> str:
    """' (did you mean 'x'?)' for the closest option, or ''."""
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _shown(value) -> str:
    text = visible(repr(value))
    return text if len(text) <= 60 else text[:57] + "..."


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _range_text(f: Field) -> str:
    positive = (f.kind == "int" and f.low == 1) or (f.low == 0 and f.low_open)
    if positive:
        low = "positive"
    else:
        low = "" if f.low is None else (f"> {_num(f.low)}" if f.low_open else f">= {_num(f.low)}")
    high = "" if f.high is None or f.high == MAX_INT else f"at most {_num(f.high)}"
    return ", ".join(x for x in (low, high) if x)


def check_value(value, f: Field, where: str):
    """``value`` if it fits ``f``, else PlanInputError '<where> must be ...'."""
    if f.kind == "free":
        return value
    if f.kind == "bool":
        if not isinstance(value, bool):
            raise PlanInputError(f"{where} must be true or false, got {_shown(value)}")
        return value
    if f.kind in ("text", "name"):
        if f.kind == "name":
            problem = name_problem(value)
            if problem:
                raise PlanInputError(f"{where} {problem}")
            return value
        if not isinstance(value, str):
            raise PlanInputError(f"{where} must be a string, got {_shown(value)}")
        if len(value) > MAX_TEXT:
            raise PlanInputError(f"{where} is {len(value)} characters long; at most {MAX_TEXT}")
        if any(not ch.isprintable() and ch not in "\n\t" for ch in value):
            raise PlanInputError(f"{where} contains control characters; use printable text")
        return value
    if f.kind == "choice":
        if isinstance(value, bool) or value not in f.choices:
            options = ", ".join(str(c) if c != "" else "'' (none)" for c in f.choices)
            raise PlanInputError(f"{where} must be one of {options}, got {_shown(value)}"
                                 + suggestion(value, f.choices))
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        what = "a whole number" if f.kind == "int" else "a number"
        raise PlanInputError(f"{where} must be {what}, got {_shown(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise PlanInputError(f"{where} must be a finite number, got {_shown(value)}")
    if f.kind == "int" and not isinstance(value, int):
        raise PlanInputError(f"{where} must be a whole number (no decimal point), "
                             f"got {_shown(value)}")
    if isinstance(value, int) and abs(value) > MAX_INT:
        raise PlanInputError(f"{where} = {_shown(value)} is far too large (at most {MAX_INT})")
    too_low = f.low is not None and (value <= f.low if f.low_open else value < f.low)
    too_high = f.high is not None and value > f.high
    if too_low or too_high:
        raise PlanInputError(f"{where} must be {_range_text(f)}, got {_shown(value)}")
    return value


def check_object(data, schema: dict[str, Field], origin: str, what: str = "object",
                 tolerant: bool = False) -> dict:
    """The keys of ``data`` that ``schema`` declares, each checked; nulls of nullable fields are
    dropped. ``tolerant`` ignores undeclared keys (HuggingFace configs carry many we do not use)."""
    if not isinstance(data, dict):
        raise PlanInputError(f"{origin}: expected a JSON object ({what}), got "
                             f"{type(data).__name__}")
    if not tolerant:
        for key in data:
            if key not in schema:
                hint = suggestion(key, schema) or f"; the {what} takes {', '.join(schema)}"
                raise PlanInputError(f"{origin}: unknown field '{visible(key)}'{hint}")
    out = {}
    for key, f in schema.items():
        value = data.get(key)
        if value is None:
            if key in data and not f.nullable:
                raise PlanInputError(f"{origin}: '{key}' must not be null")
            if f.required:
                raise PlanInputError(f"{origin}: missing '{key}'; add it to the {what}")
            continue
        out[key] = check_value(value, f, f"{origin}: '{key}'")
    return out


def check_list(data, origin: str, what: str, max_items: int, non_empty: bool = True) -> list:
    """``data`` as a list of at most ``max_items`` entries."""
    if not isinstance(data, list):
        raise PlanInputError(f"{origin} must be a list of {what}, got {type(data).__name__}")
    if non_empty and not data:
        raise PlanInputError(f"{origin} is empty; it needs at least one {what}")
    if len(data) > max_items:
        raise PlanInputError(f"{origin} has {len(data)} {what}; at most {max_items}")
    return data


__all__ = ["Field", "Int", "Num", "Text", "Name", "Bool", "OneOf", "Free", "MAX_NAME", "MAX_TEXT",
           "check_object", "check_value", "check_list", "suggestion"]
