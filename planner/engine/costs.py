"""The two costs a pipeline engine adds to the compute, measured on torch.distributed.pipelining.

- Per-action overhead (Stack.pipeline_action_overhead_s): what every action (a chunk's forward,
  backward, input- or weight-gradient half) costs beyond its compute: the schedule's dispatch,
  the p2p setup and wait of its inputs and outputs. Measured on stages that sleep their compute
  (sleep_model.py), so the only other cost is the engine's: the constant ``c`` that, charged per
  action by the simulator, makes the simulated step equal the measured one
  (:func:`implied_action_overhead`).
- Split backward (Stack.split_backward_overhead): how much more torch's input-gradient pass plus
  weight-gradient pass (``stage_backward_input`` + ``stage_backward_weight``, what its
  zero-bubble schedules run) costs than its fused ``stage_backward``, on real decoder blocks
  (:func:`split_backward_times`): one process, one thread, median of repeats.

benchmarks/bench_engine.py runs both and prints the tables the stack values quote.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

from planner.pipeline.job import SimulationJob, run_simulation

BISECT_STEPS = 60  # halvings of the search interval: far below a microsecond from 0.1 s


def implied_action_overhead(job: SimulationJob, measured_s: float, high_s: float = 0.1) -> float:
    """The per-action cost ``c`` for which the simulated step of ``job`` equals ``measured_s``
    (0 when the measurement is faster than the compute alone). The simulated step never falls
    as ``c`` grows (every op starts at a max of earlier ends plus durations), so bisection finds
    it; ``high_s`` bounds the search (the stack field's own upper limit)."""
    def step(c: float) -> float:
        return run_simulation(replace(job, action_s=c)).makespan_s

    low, high = 0.0, high_s
    if step(low) >= measured_s:
        return 0.0
    for _ in range(BISECT_STEPS):
        mid = (low + high) / 2
        low, high = (mid, high) if step(mid) < measured_s else (low, mid)
    return (low + high) / 2


def split_backward_times(hidden: int, layers: int, batch: int, seq: int,
                         repeats: int = 11) -> tuple[float, float, float]:
    """Median seconds of torch's fused backward, input-gradient pass and weight-gradient pass of
    ``layers`` Llama-style blocks (RMSNorm, SwiGLU, 4 x hidden FFN, ``hidden // 64`` heads) on
    a (batch, seq, hidden) fp32 input, one CPU thread. The first repeat warms up and is dropped."""
    import torch
    from torch.distributed.pipelining._backward import (stage_backward, stage_backward_input,
                                                        stage_backward_weight)

    from planner.engine.torch_model import Block

    torch.set_num_threads(1)
    heads = max(1, hidden // 64)
    arch = {"hidden_size": hidden, "num_attention_heads": heads, "num_kv_heads": heads,
            "ffn_hidden_size": 4 * hidden, "bias": False, "norm": "rmsnorm", "mlp": "swiglu"}
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(Block(arch) for _ in range(layers))

    def forward(x):
        for block in blocks:
            x = block(x, None)
        return x

    x0, grad = torch.randn(batch, seq, hidden), torch.randn(batch, seq, hidden)
    fused, inputs, weights = [], [], []
    for _ in range(repeats + 1):
        x = x0.clone().requires_grad_(True)
        y = forward(x)
        start = time.perf_counter()
        stage_backward([y], [grad], [x])
        fused.append(time.perf_counter() - start)
        blocks.zero_grad()
        x = x0.clone().requires_grad_(True)
        y = forward(x)
        start = time.perf_counter()
        _, groups = stage_backward_input([y], [grad], [x], blocks.parameters())
        middle = time.perf_counter()
        stage_backward_weight(blocks.parameters(), groups)
        inputs.append(middle - start)
        weights.append(time.perf_counter() - middle)
        blocks.zero_grad()
    return tuple(statistics.median(t[1:]) for t in (fused, inputs, weights))
