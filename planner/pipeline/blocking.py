"""Blocking point-to-point transfers: what a pipeline engine that sends and receives between its
compute ops adds to each chunk's forward and backward.

DeepSpeed's pipeline engine runs a list of instructions per step, the step's exchanges first
(TrainSchedule: RecvActivation and SendGrad before a ForwardPass, SendActivation and RecvGrad
before a BackwardPass), each of them "blocking and must be paired with a :class:`RecvActivation`
on the next pipeline stage to avoid deadlock" (deepspeed/runtime/pipe/schedule.py). A transfer
then holds the sender and the receiver for its whole length and overlaps no compute. Per
microbatch a chunk k therefore spends, besides its compute,

    forward:  receive its input over boundary k-1, send the input's gradient back over it
    backward: send its output over boundary k, receive the output's gradient over it

and the simulator (pipeline/op_by_op.py) takes these as part of the chunk's forward and
backward, with no separate latency on the dependency (the transfer is already inside the ops
on both sides). tests/test_blocking.py checks the result against a rendezvous simulation of
DeepSpeed's own instruction streams (every send waits for its receive): in steady state the two
agree; the warm-up and cool-down steps exchange less than the four transfers charged here, so
the charge over-counts the fill and drain by at most 2(S - 1) transfers: +0 to +4.3% of the step
with at least 2S microbatches, up to +25% with one.
"""

from __future__ import annotations

import numpy as np


def blocking_charges(boundary_s: np.ndarray, chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds each of ``chunks`` chunks adds per microbatch, from the
    one-way transfer time ``boundary_s[k]`` across boundary k (between chunks k and k + 1)."""
    b = np.asarray(boundary_s, dtype=float).reshape(-1)
    if b.size != max(0, chunks - 1):
        raise ValueError(f"{b.size} boundary times for {chunks} chunks; need {chunks - 1}")
    fwd = np.zeros(chunks)
    bwd = np.zeros(chunks)
    fwd[1:] = 2 * b  # receive the input, send its gradient back
    bwd[:-1] = 2 * b  # send the output, receive its gradient
    return fwd, bwd
