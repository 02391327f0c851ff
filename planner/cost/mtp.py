"""Multi-token prediction (DeepSeek-V3 Technical Report, arXiv:2412.19437, sec. 2.2): the cost of
the MTP modules, priced on the stage of the output head that carries them (Layer.mtp_depth).

The report: "our MTP implementation uses D sequential modules to predict D additional tokens.
The k-th MTP module consists of a shared embedding layer Emb(·), a shared output head
OutHead(·), a Transformer block TRM_k(·), and a projection matrix M_k ∈ R^{d×2d}", with
  h'_i^k = M_k [RMSNorm(h_i^{k-1}); RMSNorm(Emb(t_{i+k}))]          (eq. 21)
  h_{1:T-k}^k = TRM_k(h'_{1:T-k}^k)                                 (eq. 22)
  P_{i+k+1}^k = OutHead(h_i^k)                                      (eq. 23)
and a cross-entropy loss per depth (eq. 24). So one module, for one microbatch on one GPU, is
priced as the layers it is made of, each by the planner's own cost of that layer kind:
- the two RMSNorms of eq. 21 (memory-bound passes over T·h each; their 16-bit inputs kept);
- the projection M_k: a 2h -> h linear layer (16-bit GEMMs: conservative where a stack would
  run it in FP8), its 2h-wide input kept;
- the block TRM_k: a transformer block (an MoE block for DeepSeek-V3) under the plan's recompute
  mode, with its all-to-all;
- the shared output head: the head's GEMM, loss and log-probabilities again, its weights not
  stored again ("This arrangement enables the physical sharing of parameters and gradients, of
  the shared embedding and output head, between the MTP module and the main model", sec. 3.2.3).
The embedding lookup of t_{i+k} (a gather of T·h) is not priced. The sequence is taken whole
(T, not T - k: under 0.1% at k = 1, 4K tokens). The parameters a GPU stores for the head and its
modules are cost/memory.py sharded_params'.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from planner.cost import elementwise, moe
from planner.model.spec import Layer

ACT_BYTES = 2  # 16-bit activations


def module_layers(head: Layer) -> tuple[Layer, Layer, Layer]:
    """(projection, block, shared head) of one of the head's MTP modules, as plain layers."""
    h = head.hidden_size
    projection = Layer(kind="linear", hidden_size=2 * h, out_features=h, bias=False,
                       norm=head.norm, dropout=False)
    return projection, head.mtp_block, replace(head, mtp_depth=0, mtp_block=None)


def head_cost(head: Layer, shape, cost_of: Callable, params: float, mem_rate: float):
    """The LayerCost of an output head with its MTP modules: the head's own cost plus, per
    module, its projection, block and shared head (``cost_of`` prices one plain layer under the
    caller's shape, recompute mode, hardware and stack) and the two norms of eq. 21; ``params``
    are what the GPU stores for all of it (sharded_params)."""
    projection, block, shared = module_layers(head)
    main = cost_of(shared)
    parts = [cost_of(projection), cost_of(block), main]
    rep = 1 / shape.tp if shape.sp else 1.0
    norm_bytes = shape.tokens * head.hidden_size * rep
    norms_s = 2 * elementwise.RMSNORM_FUSED * norm_bytes / mem_rate  # two norms, forward
    d = head.mtp_depth

    def total(name: str) -> float:
        return getattr(main, name) + d * sum(getattr(p, name) for p in parts)

    return replace(
        main,
        fwd_s=total("fwd_s") + d * norms_s,
        bwd_input_s=total("bwd_input_s") + d * 2 * norms_s,
        bwd_weight_s=total("bwd_weight_s"),
        recompute_s=total("recompute_s"),
        model_flops=total("model_flops"),
        hardware_flops=total("hardware_flops"),
        params=params,
        act_bytes=total("act_bytes") + d * 2 * ACT_BYTES * norm_bytes,  # the norms' inputs
        work_bytes=max([main.work_bytes] + [p.work_bytes for p in parts]),
        cache_bytes=total("cache_bytes"),
        expert_params=d * moe.local_expert_params(block, shape),
        a2a_s=total("a2a_s"),
    )
