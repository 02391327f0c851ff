"""The schema of a hardware JSON (``--hardware FILE``, the bundled profiles, ``plan profile
--calibrate`` output): every field of hardware.Hardware, ``sources`` for their provenance, nothing
else. Efficiencies are fractions of a peak, so in (0, 1] (5.0 once printed 191.6% MFU); rates and
sizes are positive and below caps no device comes near, so that a typo is not planned."""

from __future__ import annotations

from planner.core.limits import MAX_GPUS_PER_NODE
from planner.core.schema import Bool, Free, Int, Name, Num, check_object

MAX_TFLOPS = 1e6  # a GB200 NVL72 rack is ~2.5e3 dense BF16 TFLOP/s per GPU
MAX_GBPS = 1e6  # GB/s; HBM3e is ~8e3
MAX_MEMORY_GIB = 1e6
MAX_WATTS = 1e5  # one board; a GB200 superchip is ~2.7e3 W

HARDWARE_JSON = {
    "name": Name(required=True),
    "peak_tflops": Num(0, MAX_TFLOPS, low_open=True, required=True),
    "memory_gib": Num(0, MAX_MEMORY_GIB, low_open=True, required=True),
    "memory_bandwidth_gbps": Num(0, MAX_GBPS, low_open=True, required=True),
    "intra_node_gbps": Num(0, MAX_GBPS, low_open=True, required=True),
    "inter_node_gbps": Num(0, MAX_GBPS, low_open=True, required=True),
    "gpus_per_node": Int(1, MAX_GPUS_PER_NODE),
    "matmul_efficiency": Num(0, 1, low_open=True, nullable=True),
    "attention_efficiency": Num(0, 1, low_open=True, nullable=True),
    "memory_efficiency": Num(0, 1, low_open=True, nullable=True),
    "network_efficiency": Num(0, 1, low_open=True, nullable=True),
    "sm_count": Int(1, 2**16, nullable=True),
    "nics_per_node": Int(1, MAX_GPUS_PER_NODE, nullable=True),
    "nic_gbps": Num(0, MAX_GBPS, low_open=True, nullable=True),
    "rail_optimized": Bool(nullable=True),
    "peak_fp8_tflops": Num(0, MAX_TFLOPS, low_open=True, nullable=True),
    "fp8_matmul_efficiency": Num(0, 1, low_open=True, nullable=True),
    "nvlink_domain": Int(1, MAX_GPUS_PER_NODE, nullable=True),
    "tdp_w": Num(0, MAX_WATTS, low_open=True, nullable=True),
    "sources": Free(),
}


def check_hardware_document(data, origin: str) -> None:
    """Refuse a hardware JSON that breaks HARDWARE_JSON: one line naming the file and field."""
    check_object(data, HARDWARE_JSON, origin, "hardware file")
