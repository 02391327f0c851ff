"""What the user asked for: the request (model, cluster, batch, stack, limits) and its pins, the
dimensions fixed rather than searched, with how a --recompute pin narrows the stages' modes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.core.errors import PlanInputError
from planner.launchers import LAUNCHERS
from planner.hardware.profiles import Cluster
from planner.model.spec import ModelSpec
from planner.predict.stages import BLOCK_PIN
from planner.core.parallel import RECOMPUTE_MODES
from planner.stack import Stack, default_stack

DEFAULT_TOKENS_PER_BATCH = 4 * 1024 * 1024  # ~4M tokens: Llama-2/3 and GPT-3 scale batches


@dataclass(frozen=True)
class Pins:
    """Dimensions the user fixed; None means search it."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    micro_batch: int | None = None
    schedule: str | None = None
    virtual_stages: int | None = None
    recompute: str | None = None
    zero: int | None = None
    sequence_parallel: bool | None = None
    cp: int | None = None  # context parallel (cost/context.py)
    ep: int | None = None  # expert parallel (MoE models only)
    etp: int | None = None  # expert tensor parallel (MoE models only)


@dataclass(frozen=True)
class Request:
    model: ModelSpec
    cluster: Cluster
    global_batch: int | None = None
    batch_range: tuple[int, int] | None = None  # let the search choose the batch in [min, max]
    max_bubble: float | None = None
    pins: Pins = Pins()
    options: Stack = field(default_factory=default_stack)  # the software stack it runs on
    top: int = 10
    refine: int | None = None  # at most K configurations refined; None: until proven (auto)
    launcher: str | None = None  # only configurations this launcher runs (None: the stack's)
    partition_method: str = "auto"  # predict/stages.py METHODS: auto, ilp or dp
    profile: object = None  # a measured Profile (planner/profiling/record.py) replacing analytical times

    @property
    def batch(self) -> int:
        return self.global_batch or default_global_batch(self.model.seq_length)

    @property
    def runs_on(self) -> str | None:
        """The launcher whose rules every plan must pass: the one asked for, else the stack's
        own (a plan priced on megatron-core is one Megatron-LM can launch: no ZeRO-2/3)."""
        if self.launcher is not None:
            return self.launcher
        return self.options.launcher if self.options.launcher in LAUNCHERS else None


def default_global_batch(seq_len: int) -> int:
    return max(1, DEFAULT_TOKENS_PER_BATCH // seq_len)


def parse_refine(value) -> int | None:
    """``--refine``: "auto" (None: refine until plan 1 is proven, within a work budget) or a
    whole number K >= 1 (at most K configurations refined)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        k = int(value)
    except (TypeError, ValueError):
        raise PlanInputError(f"--refine takes auto or a whole number K >= 1, got {value!r}")
    if isinstance(value, float) and k != value:
        raise PlanInputError(f"--refine takes auto or a whole number K >= 1, got {value!r}")
    if k < 1:
        raise PlanInputError(f"--refine must be auto or at least 1, got {k}")
    return k


# --recompute: a mode every stage uses, or "block" (Megatron's --recompute-method block): each
# stage recomputes its first N blocks, N chosen per stage (predict/stages.py BLOCK_PIN)
RECOMPUTE_PINS = (*RECOMPUTE_MODES, BLOCK_PIN)


def pinned_recompute(pin: str | None) -> str | None:
    """The configuration's recompute mode for a --recompute pin ("block" runs full granularity)."""
    return "full" if pin == BLOCK_PIN else pin


def exact_recompute(req: Request) -> bool | str:
    """How the stages' modes are narrowed (predict/stages.py allowed_modes): to Megatron's block
    method on that pin; else to the configuration's own mode where it is pinned or where the
    plan runs on a launcher, since every bundled launcher applies one recompute setting to all
    stages (Megatron's --recompute-granularity/-method, DeepSpeed's
    activation_checkpoint_interval, torchtitan's activation_checkpoint.mode), so a stage split
    that mixes modes would be priced as something no launcher runs; free otherwise."""
    if req.pins.recompute == BLOCK_PIN:
        return BLOCK_PIN
    return req.pins.recompute is not None or req.runs_on is not None
