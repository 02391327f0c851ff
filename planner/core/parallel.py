"""The parallel configuration a user sets in their launcher: degrees, batch split, schedule, memory knobs.

Five degrees, as Megatron-Core names them (megatron/core/parallel_state.py): tensor (tp), context
(cp), pipeline (pp) and data (dp) parallel multiply to the GPU count; expert layers re-divide the
same tp·cp·dp ranks of a stage into expert tensor (etp), expert (ep) and expert data parallel
(edp = tp·cp·dp / (etp·ep)), so ep does not multiply the GPU count.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.core.errors import PlanInputError
from planner.core.schedules import DEFAULT_SCHEDULE, SCHEDULES, Schedule, schedule_traits

RECOMPUTE_MODES = ("none", "selective", "full")
# Megatron's --recompute-modules the planner prices under "selective" (planner/cost/recompute.py);
# Megatron-Core TransformerConfig.recompute_modules: '"core_attn": recompute the core attention
# part of the transformer layer. "moe_act": recompute the MoE MLP activation function.
# "layernorm": recompute the input_layernorm and pre_mlp_layernorm. "mla_up_proj": recompute
# the MLA up projection and RoPE applying parts.' Its "mlp", "moe" and "shared_experts" are not
# priced (a stack naming them is refused).
# "torchtitan_op": not a module but torchtitan's op-level selective AC policy
# (selective_ac_option = 'op': every second mm and every element-wise op recomputed), priced
# alone (planner/cost/recompute.py).
RECOMPUTE_MODULES = ("core_attn", "layernorm", "moe_act", "mla_up_proj", "torchtitan_op")
__all__ = ["SCHEDULES"]  # the schedule names, re-exported from the registry (core/schedules.py)


@dataclass(frozen=True)
class Parallel:
    """The knobs a user sets in their launcher."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    num_microbatches: int
    schedule: str = DEFAULT_SCHEDULE
    virtual_stages: int = 1
    recompute: str = "none"
    zero: int = 1
    sequence_parallel: bool = False
    cp: int = 1  # context parallel: the sequence split across cp ranks
    ep: int = 1  # expert parallel: the experts of a layer split across ep ranks
    etp: int | None = None  # expert tensor parallel; None = tp, Megatron's default

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "micro_batch", "num_microbatches", "virtual_stages",
                     "cp", "ep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ParallelError(f"{name} must be a positive integer, got {value!r}")
        if self.etp is not None and (isinstance(self.etp, bool) or not isinstance(self.etp, int)
                                     or self.etp < 1):
            raise ParallelError(f"etp must be a positive integer, got {self.etp!r}")
        problem = expert_problem(self.tp, self.cp, self.dp, self.ep, self.expert_tp)
        if problem:
            raise ParallelError(problem)
        if self.schedule not in SCHEDULES:
            raise ParallelError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.recompute not in RECOMPUTE_MODES:
            raise ParallelError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, "
                                f"got {self.recompute!r}")
        if self.zero not in (0, 1, 2, 3):
            raise ParallelError(f"zero must be 0, 1, 2 or 3, got {self.zero!r}")

    def schedule_problem(self) -> str | None:
        """Why this pipeline schedule cannot run with these sizes (None when it can)."""
        return schedule_problem(self.schedule, self.pp, self.num_microbatches, self.virtual_stages)

    @property
    def schedule_traits(self) -> Schedule:
        """What the schedule is (core/schedules.py): consumers ask it, not the name."""
        return schedule_traits(self.schedule)

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def expert_tp(self) -> int:
        """The tensor-parallel degree of expert layers (etp, or tp when not set)."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Replicas of each expert shard within a stage: tp·cp·dp / (etp·ep)."""
        return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.num_microbatches * self.dp

    @property
    def num_chunks(self) -> int:
        return self.pp * self.virtual_stages


class ParallelError(PlanInputError):
    """A parallel configuration that cannot exist (a degree below 1, an unknown schedule ...)."""


def expert_problem(tp: int, cp: int, dp: int, ep: int, etp: int) -> str | None:
    """Why these expert degrees cannot divide a stage's ranks (None when they can).

    Megatron-Core builds expert groups from the tp·cp·dp ranks of a pipeline stage, so etp·ep must
    divide tp·cp·dp (parallel_state.initialize_model_parallel)."""
    if (tp * cp * dp) % (etp * ep):
        return (f"etp x ep = {etp * ep} must divide tp x cp x dp = {tp * cp * dp} "
                f"(expert groups re-divide a stage's ranks)")
    return None


def schedule_problem(schedule: str, pp: int, num_microbatches: int, virtual_stages: int) -> str | None:
    """Why a pipeline schedule cannot run with these sizes, as Megatron-LM rules it; None when it can.

    The one owner of the schedule rules: the search counts them, pins and the simulator refuse with
    them, and the exporters add only their own launcher's rules on top.
    Megatron-LM (megatron/training/arguments.py) allows virtual pipeline stages only with its
    interleaved schedule, which needs pp > 1 and (in the releases we price) a microbatch count
    divisible by pp.
    """
    traits = schedule_traits(schedule)
    if virtual_stages > 1 and not traits.takes_virtual_stages:
        return "virtual stages need the interleaved schedule"
    if traits.mirrored:
        # DeepSeek-V3 report sec. 3.2.1: "DualPipe only requires that the pipeline stages and
        # micro-batches be divisible by 2"; deepseek-ai/DualPipe's step() also asserts
        # "num_chunks >= num_ranks * 2" (at least pp microbatches enter at each end)
        if pp % 2:
            return f"{schedule} needs an even pp (it pairs rank r with rank pp-1-r), got pp={pp}"
        if num_microbatches % 2 or num_microbatches < 2 * pp:
            return (f"{schedule} needs an even microbatch count of at least 2 x pp = {2 * pp} "
                    f"(half enter at each end), got {num_microbatches}")
    if traits.takes_virtual_stages and pp == 1:
        return f"{schedule} needs pp > 1"
    if traits.microbatches_divisible_by_pp and num_microbatches % pp:
        return (f"{schedule} needs the microbatch count ({num_microbatches}) divisible "
                f"by pp ({pp}): use {(num_microbatches // pp + 1) * pp} or another schedule")
    return None
