"""The error band of a plan: the step time, MFU and peak memory that the validation set's record
says a run of this kind may measure, given what the model predicts.

A prediction is worth what the model's predictions of comparable runs were worth, measured the
honest way: with each run's source held out (planner/fidelity/holdout.py). Comparable means the
same stack (its software), the same GPU generation and the same kind of model (dense or MoE);
among those, runs within a factor of 8 of the plan's GPU count where at least ``MIN_RUNS`` are.
With errors e = predicted / measured - 1 in [lo, hi], a measured step time lies in
[predicted / (1 + hi), predicted / (1 + lo)], and MFU (inverse to it) in
[MFU * (1 + lo), MFU * (1 + hi)].

Where fewer than ``MIN_RUNS`` comparable runs were measured, the band is "uncalibrated": it spans
the held-out errors of every run of the same kind on any stack and GPU, which is wider, and says
so. Memory shows the worst under-estimate among the comparable runs that published memory (among
every run of the kind that did where none of those did, and among all where no run of the kind
did): the peak may be that much higher, and by default a plan keeps that much of each GPU free
(default_headroom).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from functools import lru_cache

from planner.core.errors import PlanInputError
from planner.fidelity.record import Family, load_record
from planner.predict.plan import Plan
from planner.stack import default_stack

# Fewer comparable runs than this and the band is called uncalibrated: two runs give no spread
# worth the name. Our choice, not a published figure, made with the bundled record in view.
MIN_RUNS = 3
# "Within a factor of 8 of the plan's GPUs" (one node to a small cluster, or a pod to eight):
# our choice, made with the bundled record in view: the width at which the families of one
# stack still overlap.
SCALE_FACTOR = 8
# GPU generations by profile-name prefix (the bundled profiles, profiles/hardware/, and profiles
# calibrated from them keep their prefix); longest prefix first.
GENERATIONS = (("gb200", "Blackwell"), ("b200", "Blackwell"), ("h100", "Hopper"),
               ("h200", "Hopper"), ("h800", "Hopper"), ("gh200", "Hopper"), ("a100", "Ampere"),
               ("mi325x", "CDNA 3"), ("mi300x", "CDNA 3"))


def generation(hardware: str) -> str:
    """The GPU generation of a profile name; "" when the name is none of the known ones."""
    name = hardware.lower()
    return next((gen for prefix, gen in GENERATIONS if name.startswith(prefix)), "")


@dataclass(frozen=True)
class ErrorBand:
    """The range of signed errors a plan's numbers carry, and what they rest on."""

    low: float  # signed step-time errors, predicted / measured - 1
    high: float
    runs: int  # the runs the range comes from
    calibrated: bool
    basis: str  # one line: which runs
    memory_under: float  # the worst memory under-estimate (<= 0), 0 where none was seen

    def __post_init__(self):
        if not (-1 < self.low <= self.high) or self.runs < 1 or self.memory_under > 0:
            raise PlanInputError(f"error band: bad range {self.low}..{self.high}")

    def step_range(self, step_s: float) -> tuple[float, float]:
        return step_s / (1 + self.high), step_s / (1 + self.low)

    def mfu_range(self, mfu: float) -> tuple[float, float]:
        return mfu * (1 + self.low), mfu * (1 + self.high)

    def memory_high(self, peak_bytes: float) -> float:
        """The peak the run may reach: the prediction less the worst under-estimate seen."""
        return peak_bytes / (1 + self.memory_under)

    def to_dict(self, step_s: float, mfu: float, peak_bytes: float) -> dict:
        """plan.json's and --json's "error_band"."""
        return {"step_time_s": [round(x, 6) for x in self.step_range(step_s)],
                "mfu": [round(x, 4) for x in self.mfu_range(mfu)],
                "peak_memory_bytes_max": int(self.memory_high(peak_bytes)),
                "errors": [self.low, self.high], "runs": self.runs,
                "calibrated": self.calibrated, "basis": self.basis}


def error_band(record: tuple[Family, ...], stack: str, hardware: str, moe: bool,
               gpus: int) -> ErrorBand:
    """The band of a plan on ``stack`` with ``hardware``, of a dense or MoE model on ``gpus``."""
    kind = "moe" if moe else "dense"
    same_kind = [f for f in record if f.kind == kind] or list(record)
    gen = generation(hardware)
    near = [f for f in same_kind if f.stack == stack and gen and generation(f.hardware) == gen]
    scaled = [f for f in near
              if f.max_gpus * SCALE_FACTOR >= gpus and f.min_gpus <= gpus * SCALE_FACTOR]
    if sum(f.runs for f in scaled) >= MIN_RUNS:
        near = scaled
    calibrated = sum(f.runs for f in near) >= MIN_RUNS
    chosen = near if calibrated else same_kind
    runs = sum(f.runs for f in chosen)
    basis = (f"from {runs} {kind} runs on {stack} with {gen} GPUs, each source held out"
             if calibrated else
             f"uncalibrated: under {MIN_RUNS} {kind} runs on {stack} with {gen or hardware} "
             f"GPUs, so it spans {runs} {kind} runs on any stack")
    # memory from the comparable runs that published it, else from every run of the kind, else
    # from every run that did: no reading is no evidence that memory is never under-estimated
    memory = next(([f.min_memory_error for f in fams if f.min_memory_error is not None]
                   for fams in (chosen, same_kind, record)
                   if any(f.min_memory_error is not None for f in fams)), [])
    return ErrorBand(low=min(f.held_out_min_error for f in chosen),
                     high=max(f.held_out_max_error for f in chosen), runs=runs,
                     calibrated=calibrated, basis=basis,
                     memory_under=min(min(memory, default=0.0), 0.0))


@lru_cache(maxsize=1)
def _bundled_record() -> tuple[Family, ...]:
    return load_record()


def with_band(plan: Plan) -> Plan:
    """``plan`` carrying its band (plan.json's and --json's ``error_band``)."""
    m = plan.metrics
    return replace(plan, error_band=plan_band(plan).to_dict(m.step_time_s, m.mfu,
                                                            m.peak_memory_bytes))


def plan_band(plan: Plan) -> ErrorBand:
    """The band of ``plan`` from the bundled record (profiles/validation/record.json)."""
    stack = plan.stack.name if plan.stack is not None else default_stack().name
    return error_band(_bundled_record(), stack, plan.cluster.hardware.name, plan.model.is_moe,
                      plan.cluster.gpus)


def default_headroom(stack: str, cluster, moe: bool) -> float:
    """The memory headroom a plan keeps by default: the worst under-estimate of peak memory
    among the comparable published runs (the band's), 0 where none was under-estimated."""
    band = error_band(_bundled_record(), stack, cluster.hardware.name, moe, cluster.gpus)
    return -band.memory_under
