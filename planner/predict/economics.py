"""What training a token budget on a plan takes: days, GPU-hours, board energy and cost.

    time_to_train_s = train_tokens / tokens_per_s
    gpu_hours       = time_to_train_s / 3600 x gpus
    energy_mwh      = gpu_hours x board_w / 1e6     (the GPUs' board power, no host or cooling)
    cost            = gpu_hours x gpu_hour_price

At the plan's steady throughput, with no allowance for restarts, evaluation, a batch ramp-up or
a long-context phase: a lower bound. Beside it, what GPU failures take at Llama 3's failure rate,
with checkpoints at Young's interval (planner/predict/goodput.py): the interruptions expected and
the days the run takes at that goodput. Meta's Llama 3.1 405B bears it out: its 3.8e25 FLOPs at the
400 TFLOP/s per GPU its 16,384 H100s sustained (Dubey et al. 2024, 'The Llama 3 Herd of Models',
Table 4) take 26.4M GPU-hours by these formulas, where its model card reports "30.84M" GPU
hours at "700" W (meta-llama/llama-models models/llama3_1/MODEL_CARD.md, tests/test_economics.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner.core.arguments import number
from planner.core.errors import PlanInputError
from planner.predict.goodput import FAILURES_PER_GPU_HOUR, Goodput, goodput

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0
# `--train-tokens 15T`: a count with an optional K, M, B (or G) or T suffix (powers of 1000), or
# Ki, Mi, Gi, Ti (powers of 1024: Llama 3's "16M tokens" batch is 2,048 x 8,192 = 16Mi)
_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12,
           "KI": 2.0**10, "MI": 2.0**20, "GI": 2.0**30, "TI": 2.0**40}
# Ten thousand times Llama 3's 15.6T tokens: above it a budget is a typo, not a plan.
MAX_TRAIN_TOKENS = 1e17
MAX_GPU_HOUR_PRICE = 1e4  # dollars; list prices of 2024-26 are 1-10 $ per GPU-hour


def parse_token_count(text: str, name: str = "--train-tokens") -> float:
    """``15T``, ``300B``, ``16Mi``, ``2.5e12`` as a number of tokens; one PlanInputError line
    otherwise."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*((?:[KMGTkmgt]i?|[Bb])?)\s*",
                         str(text))
    if not match:
        raise PlanInputError(f"{name} must be a token count such as 15T, 300B, 16Mi or "
                             f"2.5e12, got {text!r}")
    tokens = float(match.group(1)) * _SUFFIX[match.group(2).upper()]
    if not 1 <= tokens <= MAX_TRAIN_TOKENS:
        raise PlanInputError(f"{name} must be from 1 to {MAX_TRAIN_TOKENS:g} tokens, got {text!r}")
    return tokens


@dataclass(frozen=True)
class TrainingCost:
    """Training ``train_tokens`` tokens on one plan; ``energy_mwh`` and ``cost`` are None when the
    GPU's board power or the price is not known."""

    train_tokens: float
    time_to_train_s: float
    gpu_hours: float
    energy_mwh: float | None = None
    cost: float | None = None
    failures: Goodput | None = None  # failures and checkpointing (None: not asked)

    def __post_init__(self):
        if not self.time_to_train_s > 0 or not self.gpu_hours > 0:
            raise ValueError("TrainingCost needs a positive time and GPU-hours")

    def to_dict(self) -> dict:
        doc = {"train_tokens": self.train_tokens, "time_to_train_s": self.time_to_train_s,
               "days": self.time_to_train_s / SECONDS_PER_DAY, "gpu_hours": self.gpu_hours,
               "energy_mwh": self.energy_mwh, "cost": self.cost}
        if self.failures is not None:
            doc["failures"] = {**self.failures.to_dict(),
                               "interruptions": self.failures.interruptions(self.wall_s),
                               "wall_time_s": self.wall_s}
        return doc

    @property
    def wall_s(self) -> float:
        """The time to train at the goodput failures leave (the steady time without them)."""
        return self.time_to_train_s / (self.failures.goodput if self.failures else 1.0)

    def failures_line(self) -> str | None:
        """``GPU failures at 1.97e-05 per GPU-hour (Llama 3's rate): 419 interruptions expected,
        a checkpoint every 4.1 min (Young), goodput at most 97.7%: 55.3 days``."""
        f = self.failures
        if f is None:
            return None
        return (f"GPU failures at {FAILURES_PER_GPU_HOUR:.3g} per GPU-hour (Llama 3's rate): "
                f"{f.interruptions(self.wall_s):,.0f} interruptions expected, a checkpoint every "
                f"{f.interval_s / 60:.3g} min (Young's interval for a {f.save_s:.3g} s save), "
                f"goodput at most {f.goodput:.1%} (restarts not counted): "
                f"{self.wall_s / SECONDS_PER_DAY:.1f} days")

    def line(self, price: float | None) -> str:
        """``training 15T tokens: 64.1 days, 25.2M GPU-hours, 17.6 GWh of board power, $63.0M
        at $2.50/GPU-hour (steady throughput: a lower bound)``."""
        parts = [f"{self.time_to_train_s / SECONDS_PER_DAY:.1f} days",
                 f"{_short(self.gpu_hours)} GPU-hours"]
        if self.energy_mwh is not None:
            parts.append(f"{_energy(self.energy_mwh)} of GPU board power")
        if self.cost is not None:
            parts.append(f"${_short(self.cost)} at ${price:.2f}/GPU-hour")
        return (f"training {_short(self.train_tokens)} tokens on plan 1: " + ", ".join(parts)
                + " (steady throughput, no restarts: a lower bound)")


def training_cost(tokens_per_s: float, gpus: int, train_tokens: float,
                  board_w: float | None = None, price: float | None = None,
                  params: float | None = None) -> TrainingCost:
    """The formulas of the module docstring; ``board_w`` each GPU's board power (its rated
    power, or the --power-limit it runs at); ``params``, the model's parameters, adds the
    failures and checkpointing (planner/predict/goodput.py)."""
    seconds = train_tokens / tokens_per_s
    gpu_hours = seconds / SECONDS_PER_HOUR * gpus
    return TrainingCost(train_tokens=train_tokens, time_to_train_s=seconds, gpu_hours=gpu_hours,
                        energy_mwh=gpu_hours * board_w / 1e6 if board_w else None,
                        cost=gpu_hours * price if price is not None else None,
                        failures=goodput(params, gpus) if params else None)


def batch_of_tokens(text, seq_len: int, name: str = "--global-batch-tokens") -> int:
    """A global batch given in tokens (``16Mi``, ``4M``) as whole sequences of ``seq_len``: the
    nearest count, at least one."""
    tokens = parse_token_count(text, name)
    return max(1, round(tokens / seq_len))


def training_budget(train_tokens: str | None, price) -> tuple[float, float | None] | None:
    """``--train-tokens`` and ``--gpu-hour-price`` checked: (tokens, price or None), or None
    when no budget is asked for. A price alone would be ignored, so it is refused."""
    if train_tokens is None:
        if price is not None:
            raise PlanInputError("--gpu-hour-price prices --train-tokens; add --train-tokens "
                                 "TOKENS (e.g. 15T) or drop it")
        return None
    tokens = parse_token_count(train_tokens)
    number("--gpu-hour-price", price, low=0, low_open=True, high=MAX_GPU_HOUR_PRICE)
    return tokens, price


def cost_of(plan, cluster, budget: tuple[float, float | None]) -> TrainingCost:
    """``budget`` (training_budget's) trained on ``plan`` over ``cluster``'s GPUs, at each
    GPU's board power (its rated power, or the power limit it runs at)."""
    tokens, price = budget
    return training_cost(plan.metrics.tokens_per_s, cluster.gpus, tokens,
                         board_w=cluster.hardware.tdp_w, price=price, params=plan.model.params)


def _short(value: float) -> str:
    """1234 -> 1.23K, 25.2e6 -> 25.2M, 15e12 -> 15T."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _energy(mwh: float) -> str:
    return f"{mwh / 1000:.3g} GWh" if mwh >= 1000 else f"{mwh:.3g} MWh"
