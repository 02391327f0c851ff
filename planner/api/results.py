"""The API's results: frozen dataclasses holding the planner's own objects, with ``.to_frame()``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.parallel import Parallel
from planner.predict.plan import Plan
from planner.profiling.record import save_profile
from planner.report import frames


@dataclass(frozen=True)
class Stages:
    """One plan's per-stage breakdown: layers, recompute, per-microbatch times, memory."""

    plan: Plan

    def to_frame(self):
        return frames.stages_frame(self.plan)


@dataclass(frozen=True)
class Solution:
    """The plans of a search, best first, and how the configurations considered were spent."""

    plans: tuple[Plan, ...]
    considered: int  # configurations of the search space = sum(rejected) + not refined + feasible
    rejected: dict[str, int]
    screened: int
    elapsed_s: float = field(compare=False)  # reported only, never compared (issue #32)
    notes: tuple[str, ...]
    hint: str | None = None  # a larger global batch, when the best plan's pipeline idles
    # every feasible plan, ranked (``plans`` are the first distinct ones, up to ``top``)
    candidates: tuple[Plan, ...] = ()

    @property
    def best(self) -> Plan:
        return self.plans[0]

    def stages(self, rank: int = 1) -> Stages:
        """The per-stage breakdown of the plan ranked ``rank`` (1 = best, as in the table)."""
        if not 1 <= rank <= len(self.plans):
            raise PlanInputError(f"rank must be 1..{len(self.plans)}, got {rank}")
        return Stages(self.plans[rank - 1])

    def to_frame(self):
        """One row per plan (index: rank, 1 = best); the columns of `plan solve --csv`."""
        return frames.plans_frame(self.plans)


@dataclass(frozen=True)
class Explanation:
    """One pinned configuration: its prediction, whether it fits in memory, or the rule it breaks."""

    parallel: Parallel | None
    plan: Plan | None
    capacity_bytes: float
    rule: str | None

    @property
    def fits(self) -> bool:
        return (self.rule is None and self.plan is not None
                and self.plan.metrics.peak_memory_bytes <= self.capacity_bytes)

    def to_frame(self):
        """The configuration's stages (empty when a rule forbids it before any prediction)."""
        if self.plan is None:
            import pandas as pd

            return pd.DataFrame()
        return frames.stages_frame(self.plan)


@dataclass(frozen=True)
class Partition:
    """`plan partition`: the min-bottleneck split beside Megatron's even and the equal-parameter
    split of the same configuration."""

    optimal: Plan
    even: Plan
    equal_params: Plan
    method: str
    capacity_bytes: float
    placement: str = ""  # how the GPUs were placed on nodes

    @property
    def gain(self) -> float:
        """Throughput gain of the min-bottleneck split over the even split."""
        return self.even.metrics.step_time_s / self.optimal.metrics.step_time_s - 1

    def stages(self, split: str = "optimal") -> Stages:
        return Stages(getattr(self, split))

    def to_frame(self):
        """One row per split: the plans-frame columns of each (index: split name)."""
        frame = frames.plans_frame([self.optimal, self.even, self.equal_params])
        frame.index = ["min-bottleneck", "even", "equal parameters"]
        frame.index.name = "split"
        frame["fits"] = frame["peak_memory_bytes"] <= self.capacity_bytes
        return frame


@dataclass(frozen=True)
class Validation:
    """`plan validate`: each published run predicted and compared, and the summary."""

    rows: tuple
    summary: object  # planner.validate.ValidationSummary
    held_out: tuple = ()  # the rows priced with each source held out (fidelity/holdout.py)

    def to_frame(self):
        """One row per case (index: case name) with the signed errors, in-sample and with its
        source held out."""
        return frames.validation_frame(self.rows, self.held_out)


@dataclass(frozen=True)
class Profiled:
    """`plan profile`: measured per-layer times on this machine."""

    profile: object  # planner.profiling.Profile

    def to_frame(self):
        """One row per model layer with the passes' median times and their spread."""
        return frames.profile_frame(self.profile)

    def save(self, path, force: bool = False) -> Path:

        return save_profile(self.profile, path, force=force)
