"""The pipeline schedules and what each one is: the one place a schedule's name is spelled.

Every consumer (the simulator, the closed forms, the bounds, the exporters, the reports) asks a
schedule's traits here instead of comparing its name, so adding a schedule is one entry below,
its op order in planner/pipeline/schedule.py (or a module of its own, as DualPipe's), and the
launchers that run it. It sits on floor 0 (core/) so that every package may import it.

The schedules (planner/pipeline/schedule.py gives their op orders, DESIGN.md section 3):
- gpipe: all forwards, then all backwards (Huang et al. 2019, GPipe).
- 1f1b: PipeDream-Flush, one forward one backward in steady state (Narayanan et al. 2021).
- interleaved: Megatron's interleaved 1F1B, v chunks per rank (Narayanan et al. 2021 sec. 2.2).
- zb-h1, zb-2p: zero bubble, the backward split into B (input grad) and W (weight grad)
  (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", ZB-H1 and ZB-2p).
- dualpipe: DeepSeek-V3's bidirectional schedule (arXiv:2412.19437 sec. 3.2.1,
  planner/pipeline/dualpipe.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.core.errors import PlanInputError

# how many microbatches' activations a chunk holds at its peak (predict/pipeline_schedule.py's
# closed form; the simulator counts them exactly)
HOLDS_ALL = "all"  # every microbatch: all forwards run before any backward (GPipe)
HOLDS_WARM_UP = "warm-up"  # the rank's warm-up forwards (1F1B: p - i; interleaved: its v chunks)
HOLDS_LIMIT = "limit"  # up to inflight_limit x p on every rank (zero bubble: a deferred W
#                        keeps what it needs until it runs)
HOLDS_BOTH_DIRECTIONS = "both directions"  # DualPipe's dualpipe.held_at_peak
HOLDS = (HOLDS_ALL, HOLDS_WARM_UP, HOLDS_LIMIT, HOLDS_BOTH_DIRECTIONS)


@dataclass(frozen=True)
class Schedule:
    """What a pipeline schedule is, as its consumers need to know it."""

    name: str  # as users write it (--schedule, stack files, plan.json)
    title: str  # as its paper or engine spells it
    # the backward runs as two actions, B (input gradient) and W (weight gradient), and W may
    # run later (zero bubble, Qi et al. 2023): W fills the bubble
    split_backward: bool = False
    # the schedule has W ops of its own (split backward, or DualPipe's W after a B), so an
    # engine charges a split backward's costs (pipeline/chunk_times.py charge_actions)
    weight_grad_ops: bool = False
    # ZB-H1: rank i defers its W ops by i microbatches (Qi et al. 2023); zb-2p's fall anywhere
    defers_w_by_rank: bool = False
    # rank r also holds stage p - 1 - r, microbatches entering from both ends (DualPipe): each
    # stage's weights live on two ranks, the first and last stage on one
    mirrored: bool = False
    # chunks a rank holds are --virtual-stages (Megatron's interleaved 1F1B), not a fixed count
    takes_virtual_stages: bool = False
    fixed_chunks_per_rank: int = 1  # without virtual stages: 2 for DualPipe's two directions
    # steady state alternates one forward and one fused backward per chunk, the rank's first op
    # a forward of microbatch 0 and its last a backward of the last one (search/chunk_bound.py)
    steady_one_f_one_b: bool = False
    # it runs a forward and a full backward of two microbatches as one F&B pair, hiding the
    # MoE all-to-all and the p2p transfers of each under the other's compute (DualPipe)
    pairs_forward_backward: bool = False
    # Megatron-LM's interleaved schedule needs M divisible by pp (megatron/training/arguments.py)
    microbatches_divisible_by_pp: bool = False
    # the op kinds that free a microbatch's activations on a chunk
    releases: tuple[str, ...] = ("B",)
    holds: str = HOLDS_WARM_UP
    inflight_limit: int = 0  # with HOLDS_LIMIT: at most inflight_limit x p microbatches a rank
    # a long run repeats a steady period (pipeline/periodic.py); False: an exact closed form
    # times it instead (GPipe)
    periodic: bool = True
    # the simulator's first short run is short_run[0] x p + short_run[1] microbatches (warm-up,
    # a cut, the next period and cool-down: pipeline/simulate.py _first_short_run)
    short_run: tuple[int, int] = (2, 4)
    # engines that run it: Megatron-LM (1F1B and interleaved 1F1B only), DeepSpeed's
    # PipelineEngine (its TrainSchedule is 1F1B), torch.distributed.pipelining's class and its
    # get_schedule_class name (torch/distributed/pipelining/schedules.py), None: no class
    megatron: bool = False
    deepspeed: bool = False
    torch_class: tuple[str, str] | None = None
    # torch runs it with a multi-stage class (several stages per rank); single-stage otherwise
    torch_multi_stage: bool = False

    def __post_init__(self) -> None:
        if not self.name or not self.title:
            raise ValueError("a schedule needs a name and a title")
        if self.holds not in HOLDS:
            raise ValueError(f"{self.name}: holds must be one of {', '.join(HOLDS)}")
        if (self.holds == HOLDS_LIMIT) != (self.inflight_limit > 0):
            raise ValueError(f"{self.name}: inflight_limit goes with holds={HOLDS_LIMIT!r}")
        if self.split_backward and not self.weight_grad_ops:
            raise ValueError(f"{self.name}: a split backward has W ops")
        if self.defers_w_by_rank and not self.split_backward:
            raise ValueError(f"{self.name}: only a split backward defers W")
        if self.takes_virtual_stages and self.fixed_chunks_per_rank != 1:
            raise ValueError(f"{self.name}: virtual stages set the chunks per rank")
        if self.fixed_chunks_per_rank < 1:
            raise ValueError(f"{self.name}: a rank holds at least one chunk")

    def chunks_per_rank(self, virtual_stages: int) -> int:
        """Model chunks a rank holds: the virtual stages, or the schedule's fixed count."""
        return virtual_stages if self.takes_virtual_stages else self.fixed_chunks_per_rank

    def period_microbatches(self, p: int) -> int:
        """Microbatches of one steady period: p for interleaved (a round through the v chunks
        takes p microbatches), one of each direction for a mirrored schedule, else one."""
        return p if self.takes_virtual_stages else 2 if self.mirrored else 1

    def fill_divisor(self, virtual_stages: int) -> int:
        """k in the textbook bubble (p - 1)/(k·M + p - 1) with uniform stages: v for interleaved
        (Narayanan et al. 2021), 3 for a split backward with F = B = W (Qi et al. 2023), else
        1 (GPipe, 1F1B). A mirrored schedule has a form of its own (simulate.closed_form_bubble)."""
        if self.takes_virtual_stages:
            return virtual_stages
        return 3 if self.split_backward else 1

    @property
    def launchers(self) -> tuple[str, ...]:
        """The engines plan3d exports it to."""
        return tuple(name for name, runs in (("megatron", self.megatron),
                                             ("deepspeed", self.deepspeed),
                                             ("torch.distributed.pipelining",
                                              self.torch_class is not None)) if runs)


GPIPE = Schedule("gpipe", "GPipe", holds=HOLDS_ALL, periodic=False,
                 torch_class=("ScheduleGPipe", "GPipe"))
ONE_F_ONE_B = Schedule("1f1b", "1F1B", steady_one_f_one_b=True, short_run=(1, 2),
                       megatron=True, deepspeed=True, torch_class=("Schedule1F1B", "1F1B"))
INTERLEAVED = Schedule("interleaved", "interleaved 1F1B", takes_virtual_stages=True,
                       steady_one_f_one_b=True, microbatches_divisible_by_pp=True,
                       short_run=(6, 0), megatron=True,
                       torch_class=("ScheduleInterleaved1F1B", "Interleaved1F1B"),
                       torch_multi_stage=True)
ZB_H1 = Schedule("zb-h1", "ZB-H1", split_backward=True, weight_grad_ops=True,
                 defers_w_by_rank=True, releases=("W",), holds=HOLDS_LIMIT, inflight_limit=1,
                 torch_class=("ScheduleInterleavedZeroBubble", "InterleavedZeroBubble"),
                 torch_multi_stage=True)
# ZB-2p: at most 2p microbatches' activations (F run, W not yet) a rank (pipeline/schedule.py).
# Its first short run is twice the default 2p + 4: that one held no steady cut for any p from 3
# to 64 and the simulator doubled it every time (measured; tests/test_periodic.py checks every
# schedule's first short run has its cut), after building it for nothing (~4 s at p = 256).
ZB_2P = Schedule("zb-2p", "ZB-2p", split_backward=True, weight_grad_ops=True, releases=("W",),
                 holds=HOLDS_LIMIT, inflight_limit=2, short_run=(4, 8))
DUALPIPE = Schedule("dualpipe", "DualPipe", weight_grad_ops=True, mirrored=True,
                    fixed_chunks_per_rank=2, pairs_forward_backward=True, releases=("W", "BW"),
                    holds=HOLDS_BOTH_DIRECTIONS, short_run=(2, 8))

# dualpipe last: the search ranks ties by this order, and no built-in stack runs it
REGISTRY = (GPIPE, ONE_F_ONE_B, INTERLEAVED, ZB_H1, ZB_2P, DUALPIPE)
SCHEDULES = tuple(s.name for s in REGISTRY)
DEFAULT_SCHEDULE = ONE_F_ONE_B.name  # the schedule of a one-stage run (a plain loop)
_BY_NAME = {s.name: s for s in REGISTRY}


class UnknownSchedule(PlanInputError):
    """A schedule name the registry does not hold."""


def find_schedule(name: str) -> Schedule | None:
    """The traits of schedule ``name``, None for a name not registered (a launcher's own check
    then says which schedules it runs)."""
    return _BY_NAME.get(name) if isinstance(name, str) else None


def schedule_traits(name: str) -> Schedule:
    """The traits of schedule ``name``; UnknownSchedule (one line) for a name not registered."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise UnknownSchedule(f"unknown schedule {name!r}; choose one of "
                              f"{', '.join(SCHEDULES)}") from None
