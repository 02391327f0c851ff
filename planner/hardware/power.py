"""A GPU run below the board power its datasheet peak is quoted at.

Datasheet tensor peaks are quoted at the part's rated board power (``Hardware.tdp_w``). Operators
often cap it lower: torchtitan's published H100 runs "used the default 500W power limit, although
tuning it up to 700W TDP can potentially provide further speedups" (pytorch/torchtitan
docs/performance.md and docs/float8.md), and say "the actual peak TFLOPs number is between SXM
and NVL, and we don't know its exact value". Under a cap the firmware lowers the SM clock until
the board draws no more than the limit, so every tensor-core rate falls with it; HBM bandwidth
has its own clock and stays.

How far the clock falls is read from two datasheet points of one die: NVIDIA's H100 product page
quotes the same GH100 with 132 SMs as "BFLOAT16 Tensor Core | 1,979 teraFLOPS | 1,671 teraFLOPS"
(H100 SXM | H100 NVL, with sparsity: dense 989 and 835.5) at "Max Thermal Design Power (TDP) |
Up to 700W (configurable) | 350-400W (configurable)"; a peak holds at the top of its power
range, so the NVL point is taken at 400 W (at 350 W the exponent would read 0.24). A power
law through (700 W, 989) and (400 W, 835.5) has exponent ln(989/835.5) / ln(700/400) = 0.30: peak ~ P^0.30. That is the 1/3
that dynamic power gives when voltage follows frequency (P ~ f V^2, V ~ f, so f ~ P^(1/3)), a
check that the two points measure the clock law and not something else. At torchtitan's 500 W
it gives 894 TFLOP/s, inside the source's "between SXM and NVL".

Assumptions, stated: the law is read from Hopper's two points and applied to any part that
states its ``tdp_w``; efficiencies (fractions of the peak) stay what the profile measured at
full power; a limit at or above the rated power changes nothing (the boost clock is the cap).
"""

from __future__ import annotations

import math
from dataclasses import replace

from planner.core.errors import PlanInputError
from planner.hardware.profiles import Hardware

# (board watts, dense BF16 TFLOP/s) of one die, from NVIDIA's H100 product page (see above)
H100_SXM_POINT = (700.0, 989.0)
H100_NVL_POINT = (400.0, 835.5)
POWER_EXPONENT = (math.log(H100_SXM_POINT[1] / H100_NVL_POINT[1])
                  / math.log(H100_SXM_POINT[0] / H100_NVL_POINT[0]))


def clock_fraction(rated_w: float, limit_w: float) -> float:
    """The share of its rated tensor peak a part keeps when capped at ``limit_w`` watts."""
    if isinstance(limit_w, bool) or not isinstance(limit_w, (int, float)):
        raise PlanInputError(f"power limit must be a number of watts, got {limit_w!r}")
    if not math.isfinite(limit_w) or limit_w <= 0:  # nan would read as full power (min(1, nan))
        raise PlanInputError(f"power limit must be positive, finite watts, got {limit_w:g}")
    return min(1.0, limit_w / rated_w) ** POWER_EXPONENT


def power_limited(hw: Hardware, limit_w: float) -> Hardware:
    """``hw`` with its BF16 and FP8 tensor peaks at the clock a ``limit_w`` board cap allows."""
    if hw.tdp_w is None:
        raise PlanInputError(f"{hw.name}: its profile does not state the board power its peak is "
                             "quoted at (tdp_w); add tdp_w to a --hardware file to use a power "
                             "limit")
    keep = clock_fraction(hw.tdp_w, limit_w)
    if keep == 1.0:
        return hw
    fp8 = hw.peak_fp8_tflops * keep if hw.peak_fp8_tflops else hw.peak_fp8_tflops
    return replace(hw, name=f"{hw.name} at {limit_w:g} W", peak_tflops=hw.peak_tflops * keep,
                   peak_fp8_tflops=fp8, tdp_w=limit_w)
