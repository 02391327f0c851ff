"""The schema of a profile JSON (``plan profile --out FILE``, read by ``plan solve --profile``):
its top-level keys; each timing entry is checked by the profile loader itself (it refuses unknown
fields and non-finite or negative numbers)."""

from __future__ import annotations

from planner.core.schema import Free, Int, Name, OneOf, Text, check_list, check_object
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


def check_profile_document(data, origin: str) -> None:
    """Refuse a profile JSON whose keys, types or ranges are wrong: one line, exit 2."""
    check_object(data, PROFILE_JSON, origin, "profile")
    check_list(data["timings"], f"{origin}: 'timings'", "timing objects", MAX_LAYERS)
    check_list(data["layer_timing"], f"{origin}: 'layer_timing'", "indices", MAX_LAYERS)
