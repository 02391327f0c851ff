"""A sweep spec: for each solve input a value, a list of values or an integer range; the points are
their product. Validated when built (a frozen dataclass), so a bad spec is one line before any
solve: an unknown key (with a did-you-mean), a value of the wrong type, an empty list or range, or
more points than ``max_points``.

    model: llama3-70b                       # one value
    gpu: [h100-sxm-80gb, a100-80gb]         # a list
    gpus: {from: 512, to: 4096, times: 2}   # a range: 512, 1024, 2048, 4096 (inclusive)
    seq_len: {from: 4096, to: 8192, step: 4096}
    train_tokens: 15e12                     # time to train = train_tokens / tokens per second
    gpu_hour_price: {h100-sxm-80gb: 2.5, a100-80gb: 1.3}   # or one price for every GPU

Keys are planner.solve's keyword arguments (dashes read as underscores), plus ``gpus_per_node``
(the nodes are gpus / gpus_per_node; default: the GPU's own node size), ``global_batch_tokens``
(the global batch in tokens, a multiple of the sequence length) and the two economics scalars.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

from planner.core.errors import PlanInputError
from planner.core.limits import DEFAULT_MAX_POINTS

INT, TEXT, FLAG, NUMBER, REFINE = "an integer", "a string", "true or false", "a number", \
    "auto or an integer"

# Every input a spec may sweep, in the order the points vary (the last key varies fastest), with
# the type of its values. The names are planner.solve's keyword arguments, but for gpus_per_node
# and global_batch_tokens, which the expansion turns into nodes and global_batch.
AXES = {
    "model": TEXT, "gpu": TEXT, "gpus": INT, "nodes": INT, "gpus_per_node": INT,
    "seq_len": INT, "global_batch": INT, "global_batch_tokens": INT,
    "stack": TEXT, "launcher": TEXT, "precision": TEXT, "grad_dtype": TEXT,
    "flash": FLAG, "overlap": FLAG, "tp_overlap": FLAG,
    "tp": INT, "cp": INT, "pp": INT, "dp": INT, "ep": INT, "etp": INT, "micro_batch": INT,
    "schedule": TEXT, "virtual_stages": INT, "recompute": TEXT, "zero": INT,
    "sequence_parallel": FLAG, "max_bubble": NUMBER, "refine": REFINE, "partition": TEXT,
}
SCALARS = ("train_tokens", "gpu_hour_price")  # economics: one value each, never swept
RANGE_KEYS = ("from", "to", "step", "times")
EXCLUSIVE = (("nodes", "gpus_per_node"), ("global_batch", "global_batch_tokens"))


def _suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(choices)}"


def _check_value(key: str, value, kind: str):
    if kind == NUMBER and isinstance(value, str):  # YAML 1.1 reads 15e12 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    ok = {INT: isinstance(value, int) and not isinstance(value, bool),
          TEXT: isinstance(value, str) and value.strip() != "",
          FLAG: isinstance(value, bool),
          NUMBER: isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value),
          REFINE: value == "auto" or isinstance(value, int) and not isinstance(value, bool)}[kind]
    if not ok:
        raise PlanInputError(f"spec: {key} takes {kind}, got {value!r}")
    return value


def _range(key: str, spec: dict) -> tuple[int, ...]:
    """{from: A, to: B, step: S} (A, A+S, ... <= B) or {from: A, to: B, times: F} (A, A*F, ...)."""
    for name in spec:
        if name not in RANGE_KEYS:
            raise PlanInputError(f"spec: {key}: unknown range key {name!r}"
                                 + _suggest(str(name), RANGE_KEYS))
    if "from" not in spec or "to" not in spec:
        raise PlanInputError(f"spec: {key}: a range needs from and to, got {spec!r}")
    if "step" in spec and "times" in spec:
        raise PlanInputError(f"spec: {key}: give a range step or times, not both")
    low, high = (_check_value(f"{key}.{k}", spec[k], INT) for k in ("from", "to"))
    if "times" in spec:
        factor = _check_value(f"{key}.times", spec["times"], INT)
        if factor < 2 or low < 1:
            raise PlanInputError(f"spec: {key}: times needs a factor >= 2 and from >= 1")
        values, v = [], low
        while v <= high:
            values.append(v)
            v *= factor
    else:
        step = _check_value(f"{key}.step", spec.get("step", 1), INT)
        if step < 1:
            raise PlanInputError(f"spec: {key}: step must be positive, got {step}")
        if (high - low) // step >= DEFAULT_MAX_POINTS * 100:
            raise PlanInputError(f"spec: {key}: the range {low}..{high} step {step} is too long")
        values = list(range(low, high + 1, step))
    if not values:
        raise PlanInputError(f"spec: {key}: the range from {low} to {high} is empty")
    return tuple(values)


def axis_values(key: str, raw) -> tuple:
    """The values a spec entry stands for: a scalar, a list, or (integer keys) a range."""
    kind = AXES[key]
    if isinstance(raw, dict):
        if kind != INT:
            raise PlanInputError(f"spec: {key}: a range ({{from, to, step|times}}) needs an "
                                 f"integer key, and {key} takes {kind}")
        return _range(key, raw)
    values = raw if isinstance(raw, (list, tuple)) else [raw]
    if not values:
        raise PlanInputError(f"spec: {key}: the list is empty")
    if len(set(map(repr, values))) != len(values):
        raise PlanInputError(f"spec: {key}: the list {list(values)!r} repeats a value")
    return tuple(_check_value(key, v, kind) for v in values)


def _price(raw):
    if isinstance(raw, dict):
        if not raw:
            raise PlanInputError("spec: gpu_hour_price: the mapping is empty")
        return tuple(sorted((str(_check_value("gpu_hour_price key", k, TEXT)),
                             float(_check_value(f"gpu_hour_price.{k}", v, NUMBER)))
                            for k, v in raw.items()))
    return float(_check_value("gpu_hour_price", raw, NUMBER))


@dataclass(frozen=True)
class SweepSpec:
    """The inputs of a sweep: ``axes`` (key, values) in AXES order, only the keys given; the
    economics; and the most points the product may have."""

    axes: tuple[tuple[str, tuple], ...]
    train_tokens: float | None = None
    gpu_hour_price: float | tuple[tuple[str, float], ...] | None = None
    max_points: int = DEFAULT_MAX_POINTS

    def __post_init__(self) -> None:
        keys = [k for k, _ in self.axes]
        if keys != [k for k in AXES if k in keys]:
            raise PlanInputError(f"spec: axes out of order or unknown: {keys}")
        for key, values in self.axes:
            if not values:
                raise PlanInputError(f"spec: {key}: no values")
            for v in values:
                _check_value(key, v, AXES[key])
        if "gpus" not in keys:
            raise PlanInputError("spec: gpus is required (a number, a list or a range)")
        for a, b in EXCLUSIVE:
            if a in keys and b in keys:
                raise PlanInputError(f"spec: give {a} or {b}, not both")
        if self.train_tokens is not None and not self.train_tokens > 0:
            raise PlanInputError(f"spec: train_tokens must be positive, got {self.train_tokens}")
        prices = (self.gpu_hour_price if isinstance(self.gpu_hour_price, tuple)
                  else [("", self.gpu_hour_price)] if self.gpu_hour_price is not None else [])
        if any(p < 0 for _, p in prices):
            raise PlanInputError("spec: gpu_hour_price must not be negative")
        if self.gpu_hour_price is not None and self.train_tokens is None:
            raise PlanInputError("spec: gpu_hour_price needs train_tokens (the cost is of "
                                 "training that many tokens)")
        if self.size > self.max_points:
            shape = " x ".join(f"{len(v)} {k}" for k, v in self.axes if len(v) > 1)
            raise PlanInputError(f"spec: {self.size:,} points ({shape}) is over the limit of "
                                 f"{self.max_points:,}; narrow the spec or raise --max-points")

    @property
    def size(self) -> int:
        """The number of points: the product of the value counts (without expanding it)."""
        return math.prod(len(v) for _, v in self.axes)

    def values(self, key: str) -> tuple:
        return dict(self.axes).get(key, ())

    @property
    def varied(self) -> tuple[str, ...]:
        """The keys with more than one value, in AXES order."""
        return tuple(k for k, v in self.axes if len(v) > 1)

    @classmethod
    def from_dict(cls, data, max_points: int = DEFAULT_MAX_POINTS) -> "SweepSpec":
        if not isinstance(data, dict):
            raise PlanInputError(f"spec: a mapping of inputs to values, got "
                                 f"{type(data).__name__}")
        given = {}
        for raw_key, raw in data.items():
            key = str(raw_key).replace("-", "_")
            if key not in AXES and key not in SCALARS:
                raise PlanInputError(f"spec: unknown key {raw_key!r}"
                                     + _suggest(key, [*AXES, *SCALARS]))
            if key in given:
                raise PlanInputError(f"spec: {key} is given twice")
            given[key] = raw
        tokens = given.pop("train_tokens", None)
        if tokens is not None:
            tokens = float(_check_value("train_tokens", tokens, NUMBER))
        price = given.pop("gpu_hour_price", None)
        axes = tuple((k, axis_values(k, given[k])) for k in AXES if k in given)
        if not isinstance(max_points, int) or max_points < 1:
            raise PlanInputError(f"--max-points must be a positive integer, got {max_points!r}")
        return cls(axes=axes, train_tokens=tokens,
                   gpu_hour_price=None if price is None else _price(price), max_points=max_points)
