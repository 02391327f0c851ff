"""The points of a spec: the product of its values, in a fixed order, each turned into planner.solve's
keyword arguments and the inputs its row shows.

Values that are wrong on their own (a model, GPU or stack that does not load, a sequence length
out of range, an unknown schedule, a GPU count that is no whole number of nodes) are refused here,
before any solve, with the planner's own message and the first point that has them. What only a
combination rules out (FP8 on an A100, tp x pp x dp that is not the GPU count) is the solve's
to say: that point's row carries the reason.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.parallel import SCHEDULES
from planner.hardware.profiles import load_hardware
from planner.model.load import load_model
from planner.search.request import RECOMPUTE_PINS, default_global_batch
from planner.stack import resolve_stack
from planner.sweeping.digest import FILE_VALUED, point_digest
from planner.sweeping.spec import SweepSpec

# Spec keys the row shows under another name: a pin beside the plan's own degree of that name.
PINNED = ("tp", "cp", "pp", "dp", "ep", "etp", "micro_batch", "schedule", "virtual_stages",
          "recompute", "zero", "sequence_parallel")
STACK_KEYS = ("stack", "launcher", "flash", "overlap", "tp_overlap", "grad_dtype", "precision")
# The input columns every row has, resolved (the model's name, the stack's precision, ...).
INPUT_COLUMNS = ("point", "model", "gpu", "gpus", "nodes", "seq_len", "global_batch",
                 "batch_tokens", "stack", "precision")
DERIVED = ("gpus_per_node", "global_batch_tokens")  # spec keys that become nodes / global_batch


@dataclass(frozen=True)
class Point:
    """One solve of the sweep: ``kwargs`` for planner.solve, ``inputs`` for its row."""

    index: int
    kwargs: tuple[tuple[str, object], ...]
    inputs: tuple[tuple[str, object], ...]
    digest: str

    def solve_kwargs(self) -> dict:
        return dict(self.kwargs)


def input_column(key: str) -> str:
    return f"pin_{key}" if key in PINNED else key


def extra_columns(spec: SweepSpec) -> tuple[str, ...]:
    """The input columns a spec adds to INPUT_COLUMNS: its pins and options, as given."""
    shown = {"model", "gpu", "gpus", "nodes", "seq_len", "global_batch", "stack", "precision",
             *DERIVED}
    return tuple(input_column(k) for k, _ in spec.axes if k not in shown)


@lru_cache(maxsize=64)
def _model(model, seq_len):
    return load_model(model).with_seq_length(seq_len)


@lru_cache(maxsize=64)
def _stack(*args):
    return resolve_stack(*args)


def _label(values: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items())


def _absolute(key: str, value):
    """A file-valued input as an absolute path, so every worker (a Ray worker runs elsewhere)
    reads the same file; a preset name stays as it is."""
    if key in FILE_VALUED and isinstance(value, str) and Path(value).is_file():
        return str(Path(value).resolve())
    return value


def _resolve(v: dict) -> tuple[dict, dict]:
    """One point's solve arguments and row inputs from its spec values (raises PlanInputError)."""
    spec = _model(v.get("model"), v.get("seq_len"))
    hw = load_hardware(v.get("gpu"))
    stack = _stack(*(v.get(k) for k in STACK_KEYS))
    gpus = v["gpus"]
    if "nodes" in v:
        nodes = v["nodes"]
    else:
        per_node = v.get("gpus_per_node", hw.gpus_per_node)
        if per_node < 1:
            raise PlanInputError(f"gpus_per_node must be positive, got {per_node}")
        if gpus > per_node and gpus % per_node:
            raise PlanInputError(f"gpus {gpus} is not a whole number of {per_node}-GPU nodes "
                                 f"({hw.name}); give nodes or gpus_per_node")
        nodes = max(1, gpus // per_node)
    batch = v.get("global_batch")
    if "global_batch_tokens" in v:
        tokens = v["global_batch_tokens"]
        if tokens < 1 or tokens % spec.seq_length:
            raise PlanInputError(f"global_batch_tokens {tokens} is not a positive multiple of "
                                 f"the sequence length {spec.seq_length}")
        batch = tokens // spec.seq_length
    if v.get("schedule") is not None and v["schedule"] not in SCHEDULES:
        raise PlanInputError(f"--schedule must be one of {', '.join(SCHEDULES)}, "
                             f"got {v['schedule']!r}")
    if v.get("recompute") is not None and v["recompute"] not in RECOMPUTE_PINS:
        raise PlanInputError(f"--recompute must be one of {', '.join(RECOMPUTE_PINS)}, "
                             f"got {v['recompute']!r}")
    if v.get("zero") is not None and v["zero"] not in (0, 1, 2, 3):
        raise PlanInputError(f"--zero must be 0, 1, 2 or 3, got {v['zero']}")
    kwargs = {k: _absolute(k, x) for k, x in v.items() if k not in DERIVED}
    kwargs.update(nodes=nodes, **({} if batch is None else {"global_batch": batch}))
    shown_batch = batch if batch is not None else default_global_batch(spec.seq_length)
    inputs = {"model": spec.name, "gpu": hw.name, "gpus": gpus, "nodes": nodes,
              "seq_len": spec.seq_length, "global_batch": shown_batch,
              "batch_tokens": shown_batch * spec.seq_length, "stack": stack.name,
              "precision": stack.precision}
    inputs.update({input_column(k): x for k, x in v.items()
                   if k not in inputs and k not in DERIVED})
    return kwargs, inputs


def expand(spec: SweepSpec) -> list[Point]:
    """Every point of the spec, in order: the product of the values, the last key fastest."""
    keys = [k for k, _ in spec.axes]
    points = []
    for index, combo in enumerate(itertools.product(*(vals for _, vals in spec.axes))):
        values = dict(zip(keys, combo))
        try:
            kwargs, inputs = _resolve(values)
        except PlanInputError as e:
            raise PlanInputError(f"spec: point {index} ({_label(values)}): {e}") from None
        points.append(Point(index=index, kwargs=tuple(kwargs.items()),
                            inputs=(("point", index), *inputs.items()),
                            digest=point_digest(kwargs)))
    return points
