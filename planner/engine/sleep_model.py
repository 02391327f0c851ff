"""Stages that take a plan's per-action times by sleeping, so CPU processes behave like devices.

A stage computes ``y = A(x * s) + B(w)``: ``A`` sleeps the stage's ``fwd_s`` in forward and its
``bwd_input_s`` in backward, and lies on the path to the stage input; ``B`` sleeps
``bwd_weight_s`` in backward and lies only on the path to the weight ``w``. A fused backward
(GPipe, 1F1B, interleaved) runs both; torch's zero-bubble schedules run ``A``'s backward in the
input action and ``B``'s in the weight action, as they would a real stage's. (The first stage has
no input gradient to send; torch runs its whole backward in the weight action, and so does this
stage: ``s`` puts ``A`` on a weight's path too.) Sleeping releases the GIL, so ranks on a 2-core
machine overlap as devices would; the tensors are tiny, so the rest is the engine's own cost.
"""

from __future__ import annotations

import time

import torch
from torch import nn

WIDTH = 4  # features of the emulated activations: enough to be a tensor, too few to cost time


class _Sleep(torch.autograd.Function):
    """Identity that sleeps ``fwd`` seconds in forward and ``bwd`` in backward."""

    @staticmethod
    def forward(ctx, x, fwd: float, bwd: float):
        ctx.bwd = bwd
        time.sleep(fwd)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.bwd)
        return grad, None, None


class SleepStage(nn.Module):
    """One plan stage with its forward, input-backward and weight-backward times."""

    def __init__(self, stage: dict):
        super().__init__()
        self.fwd, self.bwd_input = stage["fwd_s"], stage["bwd_input_s"]
        self.bwd_weight = stage["bwd_weight_s"]
        self.scale = nn.Parameter(torch.ones(1))
        self.weight = nn.Parameter(torch.zeros(WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = _Sleep.apply(x * self.scale, self.fwd, self.bwd_input)
        return a + _Sleep.apply(self.weight, 0.0, self.bwd_weight)


def batch(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(rows, WIDTH), torch.zeros(rows, WIDTH)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((output - target) ** 2).mean()
