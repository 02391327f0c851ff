"""A published case's GPUs and links: the bundled profile of its GPU kind (HBM bandwidth and
measured efficiencies) with the cluster its source publishes (peak, links, node size, HBM, power
limit) in place of the profile's."""

from __future__ import annotations

from dataclasses import replace

from planner.hardware.power import power_limited
from planner.hardware.profiles import Cluster, Hardware, load_hardware


def base_profile(gpu: str) -> str:
    """The bundled profile of the case's GPU kind: its HBM bandwidth and measured efficiencies
    are the part's, whatever the source publishes about the cluster."""
    text = gpu.lower()
    if "h100" in text or "h800" in text:  # H800: the H100 die, its own NVLink figure per case
        return "h100-sxm-80gb"
    if "a100" in text and "40" in text:
        return "a100-40gb"
    return "a100-80gb"


def case_cluster(case: dict, hardware: Hardware | None = None) -> tuple[Cluster, tuple[str, ...]]:
    """The case's GPUs and links on the bundled profile of its GPU kind (HBM bandwidth and
    efficiencies), or on ``hardware`` (a calibrated profile) when given; an unpublished
    inter-node bandwidth falls back to that profile's (one NIC per GPU: 200 Gb/s HDR on A100,
    400 Gb/s NDR on H100) and says so. A source that names its part's HBM bandwidth
    (``hbm_GBps``: torchtitan's Grand Teton H100s carry 96 GB of HBM2e at 2.4 TB/s, not the
    SXM profile's HBM3 at 3.35) replaces the profile's; a source that names a board power limit
    below the part's rated power (``power_limit_w``: the same H100s ran at 500 W of 700) lowers
    its tensor peaks (hardware/power.py) and says so."""
    cl = case["cluster"]
    profile = base_profile(str(cl.get("gpu", "")))
    base = hardware or load_hardware(profile)
    notes = []
    inter = cl.get("inter_node_GBps")
    per_node = int(cl["gpus_per_node"])
    gpus = int(cl["gpus"])
    nics = {}
    if inter is None:
        inter = base.inter_node_gbps
        if gpus > per_node:
            notes.append(f"inter-node bandwidth unpublished: bundled {profile} {inter:g} GB/s")
    else:  # the source's per-GPU figure replaces the bundled profile's NICs
        nics = dict(nics_per_node=None, nic_gbps=None)
    hw = replace(base, name=cl.get("gpu", base.name), peak_tflops=float(cl["peak_tflops_bf16"]),
                 memory_gib=float(cl.get("hbm_gb") or base.memory_gib),
                 memory_bandwidth_gbps=float(cl.get("hbm_GBps") or base.memory_bandwidth_gbps),
                 intra_node_gbps=float(cl["intra_node_GBps"]), inter_node_gbps=float(inter),
                 gpus_per_node=per_node, **nics)
    if cl.get("power_limit_w") and hw.tdp_w is None:
        notes.append(f"power limit {cl['power_limit_w']:g} W not priced: {hw.name} states no tdp_w")
    elif cl.get("power_limit_w"):
        capped = power_limited(hw, float(cl["power_limit_w"]))
        notes.append(f"power limit {cl['power_limit_w']:g} W: tensor peak "
                     f"{capped.peak_tflops:.0f} of {hw.peak_tflops:g} TFLOP/s")
        hw = replace(capped, name=hw.name)
    return Cluster(hardware=hw, nodes=max(1, gpus // per_node), gpus_per_node=min(per_node, gpus)), \
        tuple(notes)
