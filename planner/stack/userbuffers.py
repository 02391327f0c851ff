"""Transformer Engine's userbuffer settings for TP communication overlap, per GEMM.

A stack that overlaps its tensor-parallel collectives with Transformer Engine's userbuffers
(Megatron-LM --tp-comm-overlap, NeMo ub_tp_comm_overlap) names, for each GEMM of a block, how
the collective beside it runs: Transformer Engine's ``initialize_ub(shape, tp_size, use_fp8,
dtype, ub_cfgs)`` builds one communicator per GEMM name from ``ub_cfgs`` (a YAML file:
Megatron-LM --tp-comm-overlap-cfg, NeMo's ``tp_overlap`` configs) and its own defaults for what
the file leaves out. Megatron-LM passes an empty dict without a file (megatron/training/
initialize.py, NVIDIA/Megatron-LM commit 2fd6e2b7, _initialize_tp_communicators: "if
args.tp_comm_overlap_cfg is not None: ... ub_cfgs = yaml.safe_load(stream) else: ub_cfgs = {}").

The defaults below are Transformer Engine's (transformer_engine/pytorch/module/base.py,
NVIDIA/TransformerEngine commit fecb10bdf13c26a213807bc310b0ec438462614e, initialize_ub):

    methods = {
        "ring_exchange": ["qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad"],
        "pipeline": ["proj_fprop", "fc2_fprop"],
        "bulk": ["qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad"],
    }
    layers_reduce_scatter_overlap = ["proj_fprop", "fc2_fprop", "qkv_wgrad", "fc1_wgrad"]

and, for a GEMM named in ub_cfgs, 'num_sm = ub_cfg.get("num_sm", 1 if method ==
"ring_exchange" else 16)', 'num_splits = ub_cfg.get("num_splits", 4 if method == "pipeline"
else 0)', 'set_sm_margin = ub_cfg.get("set_sm_margin", 0)'; one left out gets 'add_ub(name,
method=method, ..., num_splits=4 if method == "pipeline" else 0, ...)' with add_ub's own
defaults 'num_sm: int = 16', 'set_sm_margin: int = 0'. A ring exchange runs on the copy
engines ('use_ce = ub_cfg.get("use_ce", True)'), so its num_sm is not read (cost/tp_overlap.py).

qkv_dgrad and fc1_dgrad carry the all-gather of the saved sequence-parallel input for the
weight gradient, which the planner does not price with or without overlap; they are accepted
in a config and not read.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.core.errors import PlanInputError

METHODS = ("ring_exchange", "pipeline", "bulk")
# every GEMM name initialize_ub knows, with its default method
DEFAULT_METHOD = {
    "qkv_fprop": "ring_exchange", "fc1_fprop": "ring_exchange",
    "proj_dgrad": "ring_exchange", "fc2_dgrad": "ring_exchange",
    "proj_fprop": "pipeline", "fc2_fprop": "pipeline",
    "qkv_dgrad": "bulk", "qkv_wgrad": "bulk", "fc1_dgrad": "bulk", "fc1_wgrad": "bulk",
}
# the collectives each GEMM carries: reduce-scatters (the rest all-gather)
REDUCE_SCATTER = ("proj_fprop", "fc2_fprop", "qkv_wgrad", "fc1_wgrad")
_KEYS = ("method", "num_splits", "num_sm", "set_sm_margin")
# ub_cfgs keys that do not change what is priced: CGA cluster size, FP8 buffers (the planner
# prices TP collectives at 16-bit), 2x aggregated ring chunks, atomic GEMMs, copy engines
# (the default, True, is what is priced), stream priorities
_IGNORED = ("cga_size", "fp8_buf", "aggregate", "atomic_gemm", "use_ce", "comm_priority",
            "gemm_priority", "pipeline_rs_overlap_first_gemm", "is_reduce_scatter")


@dataclass(frozen=True)
class Overlap:
    """How the collective beside one GEMM runs (one ub_cfgs entry, defaults filled)."""

    method: str
    num_splits: int
    num_sm: int
    set_sm_margin: bool


def default(name: str) -> Overlap:
    """Transformer Engine's communicator for ``name`` when ub_cfgs leaves it out."""
    method = DEFAULT_METHOD[name]
    return Overlap(method, 4 if method == "pipeline" else 0, 16, False)


def parse(value, where: str) -> tuple[tuple[str, str, int, int, bool], ...] | None:
    """A stack's ``tp_overlap_ub``: null (the stack prices overlap by its tp_overlap_hidden
    share) or an object of GEMM name: {method, num_splits, num_sm, set_sm_margin} (any subset,
    as in a ub_cfgs YAML; other ub_cfgs keys are accepted and not read). Returns every GEMM
    name with Transformer Engine's defaults filled in, as sorted tuples (hashable, frozen)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):  # the resolved form a plan.json records
        try:
            value = {row[0]: dict(zip(_KEYS, row[1:])) for row in value}
        except (TypeError, IndexError) as err:
            raise PlanInputError(f"{where} must be null or an object of GEMM name: settings, "
                                 f"got {value!r}") from err
    if not isinstance(value, dict):
        raise PlanInputError(f"{where} must be null or an object of GEMM name: settings "
                             f"(Transformer Engine ub_cfgs), got {value!r}")
    out = []
    for name in sorted(DEFAULT_METHOD):
        cfg = value.get(name)
        d = default(name) if cfg is None else _entry(name, cfg, where)
        out.append((name, d.method, d.num_splits, d.num_sm, d.set_sm_margin))
    unknown = [k for k in value if k not in DEFAULT_METHOD]
    if unknown:
        raise PlanInputError(f"{where}: unknown GEMM '{unknown[0]}'; Transformer Engine's are "
                             f"{', '.join(sorted(DEFAULT_METHOD))}")
    return tuple(out)


def _entry(name: str, cfg, where: str) -> Overlap:
    """One ub_cfgs entry, Transformer Engine's defaults filled in (module docstring)."""
    if not isinstance(cfg, dict):
        raise PlanInputError(f"{where}: '{name}' must be an object, got {cfg!r}")
    bad = [k for k in cfg if k not in _KEYS + _IGNORED]
    if bad:
        raise PlanInputError(f"{where}: '{name}' has unknown key '{bad[0]}'; "
                             f"known: {', '.join(_KEYS + _IGNORED)}")
    method = cfg.get("method", DEFAULT_METHOD[name])
    if method not in METHODS:
        raise PlanInputError(f"{where}: '{name}' method must be one of "
                             f"{', '.join(METHODS)}, got {method!r}")
    if method == "pipeline" and name not in REDUCE_SCATTER:
        raise PlanInputError(f"{where}: '{name}' carries an all-gather; Transformer "
                             "Engine refuses 'pipeline' for an all-gather")
    splits = _whole(cfg.get("num_splits", 4 if method == "pipeline" else 0),
                    f"{where}: '{name}' num_splits", 0)
    if method == "pipeline" and splits < 1:
        raise PlanInputError(f"{where}: '{name}' pipeline needs num_splits >= 1")
    sms = _whole(cfg.get("num_sm", 1 if method == "ring_exchange" else 16),
                 f"{where}: '{name}' num_sm", 1)
    margin = cfg.get("set_sm_margin", 0)  # YAML writes it as 0/1 or false/true
    margin = margin if isinstance(margin, bool) else bool(
        _whole(margin, f"{where}: '{name}' set_sm_margin", 0))
    return Overlap(method, splits, sms, margin)


def _whole(v, where: str, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v).is_integer() \
            or v < low or v > 1024:
        raise PlanInputError(f"{where} must be a whole number in [{low}, 1024], got {v!r}")
    return int(v)


def lookup(resolved, name: str) -> Overlap:
    """The settings of GEMM ``name`` in a parsed ``tp_overlap_ub``."""
    for row in resolved:
        if row[0] == name:
            return Overlap(*row[1:])
    return default(name)


def as_dict(resolved) -> dict | None:
    """The JSON form (plan.json, --explain) of a parsed ``tp_overlap_ub``."""
    if resolved is None:
        return None
    return {row[0]: dict(zip(_KEYS, row[1:])) for row in resolved}


def summary(resolved) -> str:
    """Short text of a parsed ``tp_overlap_ub`` for labels: the GEMMs set apart from Transformer
    Engine's defaults, e.g. "proj_fprop pipeline/4 24sm margin"."""
    if resolved is None:
        return "none"
    parts = []
    for row in resolved:
        ov = Overlap(*row[1:])
        if row[0] in ("qkv_dgrad", "fc1_dgrad"):  # not priced (module docstring)
            continue
        if _priced(ov) != _priced(default(row[0])):
            text = f"{row[0]} {ov.method}"
            text += f"/{ov.num_splits}" if ov.method == "pipeline" else ""
            text += f" {ov.num_sm}sm" if ov.method != "ring_exchange" else ""
            text += " margin" if ov.set_sm_margin else ""
            parts.append(text)
    return ", ".join(parts) or "TE defaults"


def _priced(ov: Overlap) -> Overlap:
    """The settings cost/tp_overlap.py reads: a ring exchange's SM count only under a margin,
    splits only for a pipeline."""
    ring = ov.method == "ring_exchange"
    return Overlap(ov.method, ov.num_splits if ov.method == "pipeline" else 0,
                   0 if ring and not ov.set_sm_margin else ov.num_sm, ov.set_sm_margin)
