"""Hardware profiles (one GPU kind and its links) and the cluster built from them."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

from planner.core.limits import MAX_GPUS
from planner.core.units import DATA_DIR, GIB
from planner.core.errors import PlanInputError
from planner.core.files import read_json
from planner.core.schema import check_value, suggestion
from planner.core.limits import MAX_GPUS_PER_NODE
from planner.hardware.schema import HARDWARE_JSON, check_hardware_document

HARDWARE_DIR = DATA_DIR / "hardware"
DEFAULT_GPU = "a100-80gb"

ALIASES = {
    "a100": "a100-80gb", "a100-80g": "a100-80gb", "a100-sxm4-80gb": "a100-80gb",
    "a100-40g": "a100-40gb", "a100-sxm4-40gb": "a100-40gb",
    "h100": "h100-sxm-80gb", "h100-sxm": "h100-sxm-80gb", "h100-80gb": "h100-sxm-80gb",
    "h200-sxm": "h200", "h200-141gb": "h200",
    "b200-sxm": "b200", "gb200": "gb200-nvl72", "nvl72": "gb200-nvl72",
    "h800-sxm": "h800", "h800-80gb": "h800", "h100-pcie-80gb": "h100-pcie",
    "mi300": "mi300x", "mi325": "mi325x",
}


@dataclass(frozen=True)
class Hardware:
    """One GPU kind. Bandwidths are per GPU, one direction, in GB/s (10^9 bytes/s).

    The efficiency figures say how much of a peak real kernels reach; their defaults and sources
    live in planner/cost/constants.py, and a profile file may override them with its own measurement.
    """

    name: str
    peak_tflops: float
    memory_gib: float
    memory_bandwidth_gbps: float
    intra_node_gbps: float
    inter_node_gbps: float
    gpus_per_node: int = 8
    matmul_efficiency: float | None = None
    attention_efficiency: float | None = None  # flash-attention kernels, fraction of peak
    memory_efficiency: float | None = None
    network_efficiency: float | None = None
    # Streaming multiprocessors: what an overlapped NCCL collective takes a share of
    # (calibration.NCCL_SMS; comm.overlap_interference).
    sm_count: int | None = None
    # The node's NICs as installed, when the profile describes them: how many, and GB/s one
    # direction each. Without them a node has ``inter_node_gbps`` x ``gpus_per_node`` (one NIC
    # per GPU). Collectives price the bytes each NIC carries (comm.group_link).
    nics_per_node: int | None = None
    nic_gbps: float | None = None
    # NIC k of every node on the same leaf switch (DGX SuperPOD rail-optimised fabric): a
    # group's traffic stays on its members' rails. None (unstated) is read as rail-optimised.
    rail_optimized: bool | None = None
    # Dense FP8 tensor-core peak and the fraction of it large FP8 GEMMs reach; None on a GPU
    # without FP8 tensor cores (A100), where FP8 training is refused (cost/precision.py).
    peak_fp8_tflops: float | None = None
    fp8_matmul_efficiency: float | None = None
    # GPUs that share one NVLink (or xGMI) fabric: 8 on HGX/DGX boards, 72 in a GB200 NVL72 rack.
    # TP, CP and EP groups stay inside it; None means one node.
    nvlink_domain: int | None = None
    # Board power (W) the datasheet peaks are quoted at; a lower power limit lowers the tensor
    # clock (hardware/power.py). None: unstated, and a power limit is refused.
    tdp_w: float | None = None

    def __post_init__(self):
        """Every field checked against the hardware schema (hardware/schema.py), one line naming
        the field: Hardware(peak_tflops=0) would divide by zero in every cost, -1 would plan a
        negative time, "989" would be a string compared with numbers."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue
            check_value(value, HARDWARE_JSON[f.name], f"Hardware '{f.name}'")
        if (self.nics_per_node is None) != (self.nic_gbps is None):
            raise PlanInputError("Hardware: 'nics_per_node' and 'nic_gbps' describe the node's "
                                 "NICs together; give both or neither")

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * 1e12

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB


# A plan may keep at most this share of each GPU's memory free as headroom: more is a typo.
MAX_MEMORY_HEADROOM = 0.5


@dataclass(frozen=True)
class Cluster:
    hardware: Hardware
    nodes: int
    gpus_per_node: int
    # the share of each GPU's memory a plan keeps free: what the model may under-estimate
    # (`plan solve --memory-headroom`; planner/fidelity/band.py gives the default)
    memory_headroom: float = 0.0

    def __post_init__(self):
        h = self.memory_headroom
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not \
                0 <= h <= MAX_MEMORY_HEADROOM:
            raise PlanInputError(f"--memory-headroom must be a share from 0 to "
                                 f"{MAX_MEMORY_HEADROOM:g} of the GPU's memory, got {h!r}")

    @property
    def capacity_bytes(self) -> float:
        """What a plan may use of each GPU: its memory less the headroom."""
        return self.hardware.memory_bytes * (1 - self.memory_headroom)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def nvlink_domain(self) -> int:
        """GPUs reachable over NVLink from any GPU: the hardware's domain when it holds whole
        nodes of this cluster, else one node."""
        domain = self.hardware.nvlink_domain or self.gpus_per_node
        return domain if domain % self.gpus_per_node == 0 else self.gpus_per_node


_REQUIRED = ("name", "peak_tflops", "memory_gib", "memory_bandwidth_gbps", "intra_node_gbps",
             "inter_node_gbps")


def hardware_from_dict(data: dict, origin: str) -> Hardware:
    check_hardware_document(data, origin)  # types, ranges, unknown keys: hardware/schema.py
    if not isinstance(data, dict):
        raise PlanInputError(f"{origin}: expected a JSON object describing the GPU")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise PlanInputError(f"{origin}: missing '{missing[0]}'; hardware files need "
                             f"{', '.join(_REQUIRED)}")
    known = {f.name for f in fields(Hardware)}
    values = {k: v for k, v in data.items() if k in known}
    for key, value in values.items():
        if key in ("name", "rail_optimized"):
            continue
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise PlanInputError(f"{origin}: '{key}' must be a positive number, got {value!r}")
    for key in ("gpus_per_node", "sm_count", "nvlink_domain", "nics_per_node"):
        if not isinstance(values.get(key) or 1, int):
            raise PlanInputError(f"{origin}: '{key}' must be a whole number")
    if (values.get("nics_per_node") is None) != (values.get("nic_gbps") is None):
        raise PlanInputError(f"{origin}: 'nics_per_node' and 'nic_gbps' describe the node's NICs "
                             "together; give both or neither")
    return Hardware(**values)


def load_hardware_file(path: str | Path) -> Hardware:
    data = read_json(path, "hardware file", "`plan hardware` lists the bundled ones")
    return hardware_from_dict(data, str(path))


def bundled_hardware() -> dict[str, Hardware]:
    return {p.stem: load_hardware_file(p) for p in sorted(HARDWARE_DIR.glob("*.json"))}


def bundled_sources() -> dict[str, dict]:
    """Each bundled profile's ``sources``: where every figure comes from (``datasheet`` names
    the vendor document the profile is read from)."""
    return {p.stem: dict(read_json(p, "hardware file").get("sources") or {})
            for p in sorted(HARDWARE_DIR.glob("*.json"))}


def load_hardware(name: str | None = None, file: str | Path | None = None) -> Hardware:
    """A bundled GPU by name (or alias), or the user's own hardware JSON."""
    if file is not None:
        return load_hardware_file(file)
    key = (name or DEFAULT_GPU).lower().strip()
    key = ALIASES.get(key, key)
    path = HARDWARE_DIR / f"{key}.json"
    if not path.exists():
        names = [p.stem for p in sorted(HARDWARE_DIR.glob("*.json"))]
        raise PlanInputError(f"unknown GPU '{name}'{suggestion(key, [*names, *ALIASES])}; "
                             f"choose one of {', '.join(names)}, or pass --hardware FILE")
    return load_hardware_file(path)


def make_cluster(hardware: Hardware, gpus: int, nodes: int) -> Cluster:
    """Check the GPU count against the node count; the node size comes from gpus / nodes."""
    if not isinstance(hardware, Hardware):
        raise PlanInputError(f"hardware must be a Hardware (or a hardware JSON path), got "
                             f"{type(hardware).__name__}")
    for label, value in (("--gpus", gpus), ("--nodes", nodes)):
        if isinstance(value, bool) or not isinstance(value, int):  # True would plan 1 GPU
            raise PlanInputError(f"{label} must be a whole number, got {value!r}")
        if value <= 0:
            raise PlanInputError(f"{label} must be positive, got {value}")
    if gpus > MAX_GPUS:
        raise PlanInputError(f"--gpus {gpus}: plan3d plans at most {MAX_GPUS:,} GPUs in one job")
    if gpus % nodes:
        raise PlanInputError(f"--gpus {gpus} is not divisible by --nodes {nodes}; "
                             "every node must hold the same number of GPUs")
    per_node = gpus // nodes
    if per_node > MAX_GPUS_PER_NODE:
        raise PlanInputError(f"--gpus {gpus} on --nodes {nodes} puts {per_node} GPUs in one node; "
                             f"a node holds at most {MAX_GPUS_PER_NODE}")
    if per_node != hardware.gpus_per_node:
        hardware = replace(hardware, gpus_per_node=per_node)
    return Cluster(hardware=hardware, nodes=nodes, gpus_per_node=per_node)
