"""Keyword arguments of the Python API checked by kind before any work: one PlanInputError line
naming the argument, never a TypeError, an AttributeError or a silently wrong plan.

Python's own coercions are what these refuse: ``True`` is an int (``gpus=True`` planned 1 GPU), a
non-empty string is truthy (``flash='no'`` planned flash attention), ``'16' <= 0`` is a
TypeError, and an empty dict is falsy (``validate(file={})`` validated the bundled runs). The CLI
parses its flags into these kinds already; the API gets the same guarantee here.

Each checker returns the value unchanged (None passes when ``optional``).
"""

from __future__ import annotations

import math
from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.schema import MAX_INT
from planner.core.text import visible


def _shown(value) -> str:
    text = visible(repr(value))
    return text if len(text) <= 60 else text[:57] + "..."


def _missing(name: str, value, optional: bool) -> bool:
    if value is None and not optional:
        raise PlanInputError(f"{name} is required")
    return value is None


def whole(name: str, value, low: int = 1, optional: bool = True):
    """An int (not a bool) of at least ``low``."""
    if _missing(name, value, optional):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanInputError(f"{name} must be a whole number, got {_shown(value)}")
    if value < low:
        bound = "positive" if low == 1 else f"at least {low}"
        raise PlanInputError(f"{name} must be {bound}, got {value}")
    if value > MAX_INT:
        raise PlanInputError(f"{name} = {value} is far too large (at most {MAX_INT})")
    return value


def number(name: str, value, low: float | None = None, low_open: bool = False,
           high: float | None = None, optional: bool = True):
    """A finite int or float (not a bool) within [low, high] (low excluded when ``low_open``)."""
    if _missing(name, value, optional):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlanInputError(f"{name} must be a number, got {_shown(value)}")
    if not math.isfinite(value):
        raise PlanInputError(f"{name} must be a finite number, got {_shown(value)}")
    if low is not None and (value <= low if low_open else value < low):
        bound = (f"above {low:g}" if low_open else
                 "non-negative" if low == 0 else f"at least {low:g}")
        raise PlanInputError(f"{name} must be {bound}, got {value:g}")
    if high is not None and value > high:
        raise PlanInputError(f"{name} must be at most {high:g}, got {value:g}")
    return value


def finite(name: str, value: float, advice: str) -> float:
    """A computed number about to reach a table, JSON or SVG: itself when finite, else one
    PlanInputError line naming it and ``advice`` (what input to change). The inputs' caps
    (core/limits.py) keep results finite; this is the guard behind them, so inf or NaN is never
    printed as a step time or drawn as a coordinate."""
    if not math.isfinite(value):
        raise PlanInputError(f"{name} came out as {value}, not a finite number; {advice}")
    return value


def flag(name: str, value, optional: bool = True):
    """A real bool: True or False (None: the default)."""
    if _missing(name, value, optional):
        return value
    if not isinstance(value, bool):
        raise PlanInputError(f"{name} must be True or False, got {_shown(value)}")
    return value


def text(name: str, value, optional: bool = True):
    """A string."""
    if _missing(name, value, optional):
        return value
    if not isinstance(value, str):
        raise PlanInputError(f"{name} must be a string, got {_shown(value)}")
    return value


def source(name: str, value, kinds: tuple[type, ...] = (), what: str = "a name or a file path"):
    """None, a str or Path (a name or file), or an instance of one of ``kinds``."""
    if value is None or isinstance(value, (str, Path, *kinds)):
        return value
    also = "".join(f" or a {k.__name__}" for k in kinds)
    raise PlanInputError(f"{name} must be {what}{also}, got {_shown(value)}")


def callback(name: str, value):
    """None or a callable."""
    if value is not None and not callable(value):
        raise PlanInputError(f"{name} must be a function or None, got {_shown(value)}")
    return value


def pair(name: str, value, low: int = 1):
    """None or two whole numbers (a tuple or list), each at least ``low``."""
    if value is None:
        return value
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise PlanInputError(f"{name} must be two whole numbers (MIN, MAX), got {_shown(value)}")
    for item in value:
        whole(name, item, low, optional=False)
    return tuple(value)


__all__ = ["whole", "number", "finite", "flag", "text", "source", "callback", "pair"]
