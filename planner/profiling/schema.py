"""The schema of a profile JSON (``plan profile --out FILE``, read by ``plan solve --profile``):
its top-level keys; each timing entry is checked by the profile loader itself (it refuses unknown
fields and non-finite or negative numbers)."""

from __future__ import annotations

from planner.core.limits import MIN_PASS_RATE
from planner.core.schema import Free, Int, Name, Num, OneOf, Text, check_list, check_object
from planner.model.schema import MAX_LAYERS, MAX_SEQ

PROFILE_JSON = {
    "schema": Text(required=True),
    "model_name": Name(required=True),
    "device": OneOf("cpu", "gpu", required=True),
    "device_name": Text(required=True),
    "dtype": Text(required=True),
    "tp": Int(1, 4096, required=True),
    "micro_batch": Int(1, 2**20, required=True),
    "seq_len": Int(1, MAX_SEQ, required=True),
    "timings": Free(required=True),
    "layer_timing": Free(required=True),
    "environment": Free(required=True),
}


# The environment's measured matmul peak, the one number of it the planner computes with (MFU is
# FLOPs / step / peak). From MIN_PASS_RATE (10^-6 TFLOP/s) to 10^6 TFLOP/s, far above any chip
# (a B200 runs ~10^4 dense FP4): 10^-300 made an MFU of 10^298. ``drift`` is end / start - 1.
PEAK = {
    "matmul_tflops": Num(MIN_PASS_RATE / 1e12, 1e6, nullable=True),
    "drift": Num(-1, 1e6, nullable=True),
}


def check_profile_document(data, origin: str) -> None:
    """Refuse a profile JSON whose keys, types or ranges are wrong: one line, exit 2."""
    check_object(data, PROFILE_JSON, origin, "profile")
    check_list(data["timings"], f"{origin}: 'timings'", "timing objects", MAX_LAYERS)
    check_list(data["layer_timing"], f"{origin}: 'layer_timing'", "indices", MAX_LAYERS)
    environment = data["environment"]
    if isinstance(environment, dict) and environment.get("peak") is not None:
        check_object(environment["peak"], PEAK, f"{origin}: environment.peak", "peak",
                     tolerant=True)  # its other keys (source) are documentation
