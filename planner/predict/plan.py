"""A plan: one parallel configuration with its stage split and predicted metrics.

``Plan.to_dict`` is the plan JSON (schema ``plan3d/plan/v1``) that the exporters and
``plan simulate --plan`` read back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.core.parallel import Parallel
from planner.hardware.profiles import Cluster
from planner.layout.ranks import build_layout
from planner.model.spec import ModelSpec
from planner.stack import Stack

SCHEMA = "plan3d/plan/v1"


@dataclass(frozen=True)
class Stage:
    """One model chunk: layers [first, last) of the model's layer list, on pipeline rank ``rank``.

    Times are per microbatch: forward, full backward (recompute included), of the backward the
    weight-gradient part that zero-bubble schedules defer, and the transfer of the chunk's output
    to the next chunk."""

    stage: int
    rank: int
    first: int
    last: int
    recompute: str
    time_s: float
    memory_bytes: float
    fwd_s: float = 0.0
    bwd_s: float = 0.0
    wgrad_s: float = 0.0
    send_s: float = 0.0
    a2a_s: float = 0.0  # of fwd_s + bwd_s: MoE token dispatch/combine all-to-all
    # Megatron's block method: only the first N transformer blocks of the chunk recompute
    # (``recompute`` "full"); None: ``recompute`` applies to every block of the chunk
    recompute_layers: int | None = None

    @property
    def num_layers(self) -> int:
        return self.last - self.first

    @property
    def recompute_label(self) -> str:
        """The recompute mode as output shows it: "block N" when only the first N blocks of the
        chunk recompute (Megatron's --recompute-method block)."""
        return self.recompute if self.recompute_layers is None else f"block {self.recompute_layers}"


@dataclass(frozen=True)
class Metrics:
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    hfu: float
    bubble_fraction: float
    peak_memory_bytes: float


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    cluster: Cluster
    parallel: Parallel
    stages: tuple[Stage, ...]
    metrics: Metrics
    rank_memory_bytes: tuple[float, ...] = ()
    # per pipeline rank, its peak by part (predict/memory.py MEMORY_PARTS, in that order): pairs
    # (part, bytes per rank) that sum to rank_memory_bytes; () for a plan built without them
    memory_parts: tuple[tuple[str, tuple[float, ...]], ...] = field(default=(), compare=False)
    notes: tuple[str, ...] = field(default=(), compare=False)
    stack: Stack | None = field(default=None, compare=False)  # the stack it was priced on
    # what a run may measure, by the validation record (planner/fidelity/band.py ErrorBand.to_dict),
    # set above the search; plan.json carries it, its digest does not
    error_band: dict | None = field(default=None, compare=False)

    @property
    def precision(self) -> str:
        """The blocks' GEMM precision it was priced with: "bf16" or "fp8" (the stack's)."""
        return self.stack.precision if self.stack is not None else "bf16"

    def to_dict(self, with_layout: bool = True) -> dict:
        par, cl = self.parallel, self.cluster
        return {
            "schema": SCHEMA,
            "model": {"name": self.model.name, "num_layers": self.model.num_layers,
                      "params": self.model.params, "seq_length": self.model.seq_length,
                      **({"active_params": self.model.active_params,
                          "num_experts": self.model.num_experts,
                          "moe_top_k": self.model.moe_top_k} if self.model.is_moe else {})},
            "cluster": {"gpu": cl.hardware.name, "nodes": cl.nodes,
                        "gpus_per_node": cl.gpus_per_node, "gpus": cl.gpus},
            "parallel": {"tp": par.tp, "pp": par.pp, "dp": par.dp, "micro_batch": par.micro_batch,
                         "num_microbatches": par.num_microbatches,
                         "global_batch": par.global_batch, "schedule": par.schedule,
                         "virtual_stages": par.virtual_stages, "recompute": par.recompute,
                         "zero": par.zero, "sequence_parallel": par.sequence_parallel,
                         **({"cp": par.cp} if par.cp > 1 else {}),
                         **({"ep": par.ep, "etp": par.expert_tp} if self.model.is_moe else {})},
            "stages": [{"stage": s.stage, "rank": s.rank, "layers": [s.first, s.last],
                        "recompute": s.recompute,
                        **({"recompute_layers": s.recompute_layers}
                           if s.recompute_layers is not None else {}),
                        "time_s": round_6g(s.time_s),
                        "fwd_s": round_6g(s.fwd_s), "bwd_s": round_6g(s.bwd_s),
                        "wgrad_s": round_6g(s.wgrad_s), "send_s": round_6g(s.send_s),
                        **({"a2a_s": round_6g(s.a2a_s)} if self.model.is_moe else {}),
                        "memory_bytes": int(s.memory_bytes)}
                       for s in self.stages],
            "metrics": {"step_time_s": round_6g(self.metrics.step_time_s),
                        "tokens_per_s": round_6g(self.metrics.tokens_per_s),
                        "tflops_per_gpu": round_6g(self.metrics.tflops_per_gpu),
                        "mfu": round_6g(self.metrics.mfu), "hfu": round_6g(self.metrics.hfu),
                        "bubble_fraction": round_6g(self.metrics.bubble_fraction),
                        "peak_memory_bytes": int(self.metrics.peak_memory_bytes)},
            "layout": build_layout(par.tp, par.pp, par.dp, cl.gpus_per_node, cp=par.cp,
                                   ep=par.ep, etp=par.etp,
                                   nvlink_domain=cl.nvlink_domain).to_dict()
            if with_layout else None,
            "notes": list(self.notes),
            "stack": self.stack.to_dict() if self.stack is not None else None,
        }


def round_6g(x: float) -> float:
    """Six significant digits: stable JSON across platforms, far finer than the model's accuracy."""
    return float(f"{x:.6g}")
