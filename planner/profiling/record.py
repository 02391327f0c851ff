"""A profile: measured seconds and FLOPs per distinct layer of a model on one device, and its
JSON file (`plan profile --out`, read back by `plan solve --profile`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from planner.core.arguments import number
from planner.core.errors import PlanInputError
from planner.core.files import read_json, write_text
from planner.core.limits import MAX_PASS_FLOPS, MAX_PASS_S, MIN_PASS_RATE
from planner.profiling.schema import check_profile_document


# Above this spread between repeats (or drift of the matmul rate over the profile) the profile
# warns that the machine is noisy. A judgement, not fitted: on an idle machine the repeats of one
# kernel agree within a few percent; the shared 2-core machine of issue #19 varied ~30% (16-22 s).
NOISY_SPREAD = 0.2
SCHEMA = "plan3d/profile/v1"


@dataclass(frozen=True)
class LayerTiming:
    """Measured seconds of one layer's three passes on one TP rank, with the FLOPs and bytes of the
    full shape. ``attention_*`` are the attention core's share (inside fwd / bwd_input) of a block.
    Spread is min/max over the timed repeats."""

    kind: str
    fwd_s: float
    bwd_input_s: float
    bwd_weight_s: float
    fwd_flops: float
    bwd_input_flops: float
    bwd_weight_flops: float
    fwd_bytes: float = 0.0
    bwd_input_bytes: float = 0.0
    bwd_weight_bytes: float = 0.0
    fwd_min_s: float = 0.0
    fwd_max_s: float = 0.0
    bwd_input_min_s: float = 0.0
    bwd_input_max_s: float = 0.0
    bwd_weight_min_s: float = 0.0
    bwd_weight_max_s: float = 0.0
    attention_fwd_s: float = 0.0
    attention_bwd_input_s: float = 0.0
    attention_fwd_flops: float = 0.0
    attention_bwd_input_flops: float = 0.0
    scaled: float = 1.0
    measured_at: str = ""
    shape: str = ""

    @property
    def total_s(self) -> float:
        return self.fwd_s + self.bwd_input_s + self.bwd_weight_s

    @property
    def total_flops(self) -> float:
        return self.fwd_flops + self.bwd_input_flops + self.bwd_weight_flops

    @property
    def spread(self) -> float | None:
        """(slowest - fastest) / median of the three passes' total over the timed repeats: how
        much the same measurement varied. None for profiles written without min/max."""
        low = self.fwd_min_s + self.bwd_input_min_s + self.bwd_weight_min_s
        high = self.fwd_max_s + self.bwd_input_max_s + self.bwd_weight_max_s
        if high <= 0 or self.total_s <= 0:
            return None
        return (high - low) / self.total_s

    def flops_per_s(self, phase: str) -> float:
        """Achieved rate of a phase ('fwd', 'bwd_input', 'bwd_weight'): the cost model predicts
        another shape's time as its FLOPs / this rate. 0 for a phase with no work (no time)."""
        seconds = getattr(self, f"{phase}_s")
        flops = getattr(self, f"{phase}_flops")
        return flops / seconds if seconds > 0 and flops > 0 else 0.0


@dataclass(frozen=True)
class Profile:
    """Per-layer timings of a model at one (tp, micro_batch, seq_len) on one device.

    ``layers`` is aligned with ``spec.layers``; identical layers share one LayerTiming object.
    """

    model_name: str
    device: str
    device_name: str
    dtype: str
    tp: int
    micro_batch: int
    seq_len: int
    layers: tuple[LayerTiming, ...]
    environment: dict

    @property
    def peak_flops(self) -> float | None:
        """The best matmul rate measured on the profiled device (FLOP/s), the peak its MFU is
        computed against; None for profiles written before it was recorded."""
        tflops = self.environment.get("peak", {}).get("matmul_tflops")
        return tflops * 1e12 if tflops else None

    @property
    def spread(self) -> float:
        """The largest spread of any distinct layer (0 when none was recorded)."""
        return max((t.spread or 0.0 for t in self.layers), default=0.0)

    @property
    def noisy(self) -> bool:
        """The repeats varied more than NOISY_SPREAD, or the device's matmul rate drifted more
        than that between the start and the end of the profile."""
        drift = self.environment.get("peak", {}).get("drift", 0.0)
        return self.spread > NOISY_SPREAD or abs(drift) > NOISY_SPREAD

    def to_dict(self) -> dict:
        """JSON form: distinct timings once, and one index per model layer."""
        distinct: list[LayerTiming] = []
        index: dict[int, int] = {}
        order = []
        for timing in self.layers:
            if id(timing) not in index:
                index[id(timing)] = len(distinct)
                distinct.append(timing)
            order.append(index[id(timing)])
        return {"schema": SCHEMA, "model_name": self.model_name, "device": self.device,
                "device_name": self.device_name, "dtype": self.dtype, "tp": self.tp,
                "micro_batch": self.micro_batch, "seq_len": self.seq_len,
                "timings": [asdict(t) for t in distinct], "layer_timing": order,
                "environment": self.environment}

    @classmethod
    def from_dict(cls, d: dict, origin: str = "profile") -> Profile:
        """Validate a profile JSON object; PlanInputError with one line on anything wrong."""
        if not isinstance(d, dict):
            raise PlanInputError(f"{origin}: expected a JSON object (a plan3d profile)")
        if d.get("schema") != SCHEMA:
            raise PlanInputError(f"{origin}: schema is {d.get('schema')!r}, expected '{SCHEMA}'; "
                                 "re-create it with `plan profile`")
        for key, kind in (("model_name", str), ("device", str), ("device_name", str),
                          ("dtype", str), ("tp", int), ("micro_batch", int), ("seq_len", int),
                          ("timings", list), ("layer_timing", list), ("environment", dict)):
            if key not in d:
                raise PlanInputError(f"{origin}: missing '{key}'; re-create it with `plan profile`")
            if not isinstance(d[key], kind) or isinstance(d[key], bool):
                raise PlanInputError(f"{origin}: '{key}' must be {kind.__name__}, got {d[key]!r}")
        timings = tuple(_timing_from_dict(t, f"{origin}: timings[{i}]")
                        for i, t in enumerate(d["timings"]))
        layers = []
        for i, n in enumerate(d["layer_timing"]):
            if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < len(timings):
                raise PlanInputError(f"{origin}: layer_timing[{i}] = {n!r} is not an index into "
                                     f"the {len(timings)} timings")
            layers.append(timings[n])
        if not layers:
            raise PlanInputError(f"{origin}: the profile has no layers")
        return cls(model_name=d["model_name"], device=d["device"], device_name=d["device_name"],
                   dtype=d["dtype"], tp=d["tp"], micro_batch=d["micro_batch"],
                   seq_len=d["seq_len"], layers=tuple(layers), environment=d["environment"])


def _timing_from_dict(t, where: str) -> LayerTiming:
    if not isinstance(t, dict):
        raise PlanInputError(f"{where}: expected an object")
    known = {f.name: f for f in fields(LayerTiming)}
    unknown = sorted(set(t) - set(known))
    if unknown:
        raise PlanInputError(f"{where}: unknown field '{unknown[0]}'")
    for name in ("kind", "fwd_s", "bwd_input_s", "bwd_weight_s", "fwd_flops", "bwd_input_flops",
                 "bwd_weight_flops"):
        if name not in t:
            raise PlanInputError(f"{where}: missing '{name}'")
    for name, value in t.items():
        if name in ("kind", "measured_at", "shape"):
            if not isinstance(value, str):
                raise PlanInputError(f"{where}: '{name}' must be a string")
        else:  # capped so every sum over layers and microbatches stays finite (core/limits.py)
            number(f"{where}: '{name}'", value, low=0, high=_timing_cap(name), optional=False)
    for phase in ("fwd", "bwd_input", "bwd_weight", "attention_fwd", "attention_bwd_input"):
        _check_rate(t.get(f"{phase}_flops", 0.0), t.get(f"{phase}_s", 0.0), phase, where)
    return LayerTiming(**t)


def _check_rate(flops: float, seconds: float, phase: str, where: str) -> None:
    """A pass with work and time runs at MIN_PASS_RATE or faster (core/limits.py)."""
    if flops > 0 and seconds > 0 and flops / seconds < MIN_PASS_RATE:
        raise PlanInputError(f"{where}: '{phase}_flops' / '{phase}_s' is {flops / seconds:.3g} "
                             f"FLOP/s, below any device ({MIN_PASS_RATE:g}); re-create the "
                             "profile with `plan profile`")


def _timing_cap(name: str) -> float:
    """The most a timing field may hold: seconds of one pass, FLOPs or bytes of one pass, or the
    FLOP ratio a reduced shape was scaled by (at most the pass's FLOPs over one)."""
    return MAX_PASS_S if name.endswith("_s") else MAX_PASS_FLOPS


def save_profile(profile: Profile, path: str | Path, force: bool = False) -> Path:
    """Write the profile JSON atomically; never over an existing file unless ``force``."""
    return write_text(path, json.dumps(profile.to_dict(), indent=1, sort_keys=True) + "\n",
                      force=force)


def load_profile(path: str | Path) -> Profile:
    data = read_json(path, "profile", f"create one with `plan profile MODEL --out {path}`")
    check_profile_document(data, str(path))  # top-level keys, types, ranges: profile/schema.py
    return Profile.from_dict(data, str(path))


# How far a profile's measured matmul peak may sit from the cluster GPU's peak and still be that
# GPU. Below a quarter: another, slower device (a GPU's large fp16 matmuls reach 0.7-0.9 of its
# datasheet peak; a CPU profile applied to A100s is 100x off and printed an MFU over 200%). Above
# 1.5x: another, faster device (each GPU generation is 2-3x its predecessor: A100 312, H100 989
# TFLOP/s); the margin over 1 is for a hardware file of `plan profile --calibrate`, an achieved
# peak that a later profile on a shared machine may beat by ~30% (issue #19's spread). Both bounds
# are judgements, not fitted.
SAME_DEVICE_PEAK_RANGE = (0.25, 1.5)


def device_mismatch(profile: Profile | None, hardware) -> str | None:
    """Why ``profile`` cannot stand for ``hardware``'s GPUs (one line), or None (also when there
    is no profile). Told by the
    measured matmul peak against the hardware's peak: a profile's compute times are its device's,
    so planned on another GPU they would price a cluster that is not the one asked for. A profile
    with no measured peak (written before it was recorded) cannot be told and is let through."""
    peak = profile.peak_flops if profile is not None else None
    if peak is None:
        return None
    low, high = SAME_DEVICE_PEAK_RANGE
    share = peak / hardware.peak_flops
    if low <= share <= high:
        return None
    return (f"the profile was measured on {profile.device_name} (matmul peak {peak / 1e12:.3g} "
            f"TFLOP/s), not on {hardware.name} ({hardware.peak_tflops:g} TFLOP/s): its layer "
            f"times would price another device; profile on a {hardware.name}, or plan that "
            "device with --hardware FILE from `plan profile --calibrate` run on it")
