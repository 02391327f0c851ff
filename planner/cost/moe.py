"""Mixture-of-experts costs of one block on one GPU: router, routed and shared experts, the token
dispatch/combine all-to-all, expert weights sharded by expert parallelism, kept activations.

How a block runs (Megatron-Core's MoE layer with the all-to-all token dispatcher, which DeepSeek-V3
§3.2.2 describes likewise): the router (one h x E matmul, a softmax or sigmoid and a top-k) picks
moe_top_k experts per token; each token is sent to the GPUs holding its experts (dispatch
all-to-all over the EP group; DeepEP's kernels where the stack says so, deepep_s), the experts
run as grouped GEMMs, and the outputs come back
(combine all-to-all) to be weighted and summed; shared experts run as a dense MLP beside them.
Expert weights are split over ep x etp GPUs: each holds num_experts / ep experts, each expert's
matrices split etp ways (--expert-tensor-parallel-size); dense weights stay split by tp.

FLOPs. Each routed copy of a token costs an expert's MLP, 2·mats·h·f forward (mats 3 for SwiGLU,
2 for GeLU), so a block's routed experts cost 2·mats·T·k·h·f: the active-parameter FLOPs,
what MFU counts. With ep·etp dividing tp·dp (Megatron's rule) the expert work of the GPUs at one
pipeline stage is spread over all of them, so on average a GPU does 1/tp of its replica's, as for
dense layers. The busiest GPU does ``expert_load`` times the mean: the load-imbalance knob (1.0:
balanced routing, what auxiliary-loss and auxiliary-loss-free balancing aim for; a capacity
factor c drops tokens beyond c times the mean, so it caps the load at c). The plan states it.
Time: a GPU's routed GEMMs are one up/down pair per local expert over its share of the copies,
at the busiest GPU's load (mlp_gemm_shapes, through precision.block_gemms), each timed at the rate
its shape allows (cost/gemm.py); the model FLOPs stay the balanced ones.

All-to-all. Each GPU sends every routed copy of its T/tp tokens (sequence parallel: Megatron
requires it for MoE with TP) to the expert's owner, 16-bit, times the load: B = 2·T·k·h/tp bytes;
1/ep of it stays on the GPU. Of the other ep - 1 peers, those in the GPU's NVLink domain receive
over NVLink, the rest over the network, both at once: time = max(NVLink share / NVLink bandwidth,
network share / NIC bandwidth) plus one latency of the slowest link crossed (a pairwise exchange
is one round). Forward: dispatch + combine; backward: their two transposes; full recompute
repeats the forward pair. With etp > 1 each dispatch also all-gathers the routed tokens over the
etp group and each combine reduce-scatters them (NVLink). Not overlapped with compute: Megatron's
all-to-all overlap (--overlap-moe-expert-parallel-comm) and DeepSeek's DualPipe hide it; a stack
that does is not priced here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.cost import comm, routing
from planner.hardware.profiles import Hardware
from planner.stack.spec import ACTIVATION_BYTES as ACT_BYTES

if TYPE_CHECKING:  # pragma: no cover
    from planner.model.spec import Layer

# Router probabilities are kept in fp32 for the top-k and the auxiliary loss (Megatron-Core
# moe/router.py computes the scores in fp32: "logits = logits.float()" under moe_router_dtype).
ROUTER_PROB_BYTES = 4


def _mats(layer: Layer) -> int:
    return 3 if layer.mlp == "swiglu" else 2


def routed_flops(layer: Layer, tokens: float) -> float:
    """Forward FLOPs of the routed experts, whole layer, balanced (0 for a dense layer)."""
    if not layer.is_moe:
        return 0.0
    return 2.0 * _mats(layer) * tokens * layer.moe_top_k * layer.hidden_size * \
        layer.ffn_hidden_size


def mlp_flops(layer: Layer, tokens: float) -> float:
    """Forward FLOPs of an MoE block's MLP, whole layer: routed experts, shared experts, router
    (2·T·h·E) and Qwen2-MoE's shared-expert gate (2·T·h)."""
    h = layer.hidden_size
    shared = 2.0 * _mats(layer) * tokens * h * layer.shared_ffn_hidden_size
    gate = 2.0 * tokens * h if layer.shared_expert_gate else 0.0
    return routed_flops(layer, tokens) + shared + 2.0 * tokens * h * layer.num_experts + gate


def expert_tp(shape) -> int:
    return shape.etp or shape.tp


def block_tp_pairs(layer: Layer) -> int:
    """Dense-TP collective pairs of one block's forward (sequence parallel: an all-gather before
    the column-parallel linear, a reduce-scatter after the row-parallel one; without it one
    all-reduce each): the attention's and, in a dense block, the MLP's. An MoE block's MLP runs
    on the sequence-parallel shard and has no dense pair: Megatron-Core's token dispatcher works
    on "hidden_states: 3D tensor [S/TP, B, H]" and its only tensor-parallel collectives are over
    the expert-TP group ("# use model_comm_pgs.expt_tp_group as tensor parallel group in this
    module."), "permute->A2A(EP)->AG(TP)->sort_chunk" and "sort_chunk->RS(TP)->A2A(EP)->
    unpermute" (megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher),
    priced in dispatch_s over etp ranks (none at etp 1). Shared experts are a dense MLP split by
    tp (SharedExpertMLP, a column- then row-parallel pair): one pair where the model has them."""
    if not layer.is_moe:
        return 2
    return 1 + (1 if layer.shared_ffn_hidden_size else 0)


def local_expert_params(layer: Layer, shape) -> float:
    """Routed-expert weights on one GPU: num_experts / ep experts, each split etp ways."""
    return layer.expert_params / (shape.ep * expert_tp(shape))


def routed_copies(layer: Layer, shape) -> float:
    """Routed token copies one GPU's experts process per microbatch, at the stated load: with
    each expert split etp ways, every copy is seen by etp GPUs, T·k·etp/tp on average."""
    return mean_routed_copies(layer, shape) * shape.expert_load


def mean_routed_copies(layer: Layer, shape) -> float:
    """Routed token copies per GPU per microbatch at the mean load, T·k·etp/tp: what a GPU
    keeps summed over many layers. Each layer routes on its own scores to its own experts, so
    the GPU that is busiest in one layer is not the busiest in the next; the activations a
    stage holds (its layers times its in-flight microbatches) add up to about the mean, while
    each layer's time, which waits for its busiest GPU at the combine, carries the load."""
    return shape.tokens * layer.moe_top_k * expert_tp(shape) / shape.tp


def mlp_gemm_shapes(layer: Layer, shape) -> tuple[tuple[float, float, float], ...]:
    """(m, k, n) of an MoE block's MLP GEMMs on one GPU: each local expert (num_experts / ep)
    an up (with the gate for SwiGLU) and a down GEMM over its share of the routed copies, split
    etp ways; the shared experts as a dense MLP split by tp. A grouped GEMM reads each local
    expert's weights once, as these per-expert GEMMs do."""
    local = layer.num_experts / shape.ep
    m, f = routed_copies(layer, shape) / local, layer.ffn_hidden_size / expert_tp(shape)
    up = (_mats(layer) - 1) * f
    experts = ((m, layer.hidden_size, up), (m, f, layer.hidden_size)) * round(local)
    t, sf = shape.tp, layer.shared_ffn_hidden_size
    shared = ((shape.tokens, layer.hidden_size, (_mats(layer) - 1) * sf / t),
              (shape.tokens, sf / t, layer.hidden_size)) if sf else ()
    return experts + shared


def permute_bytes(layer: Layer, shape) -> float:
    """HBM traffic of sorting tokens by expert and back (memory-bound): dispatch reads each
    token and writes its k copies, combine reads the copies and writes the weighted sum."""
    return 2 * ACT_BYTES * (shape.tokens / shape.tp) * layer.hidden_size * (
        1 + layer.moe_top_k * shape.expert_load)


def dispatch_bytes(layer: Layer, shape) -> float:
    """Bytes one GPU sends in one dispatch (or combine) all-to-all, its own share included."""
    return ACT_BYTES * shape.tokens / shape.tp * layer.moe_top_k * layer.hidden_size * \
        shape.expert_load


def all_to_all_s(nbytes: float, ep: int, in_domain: int, hw: Hardware) -> float:
    """One all-to-all of ``nbytes`` per GPU over ``ep`` ranks, ``in_domain`` of them (this GPU
    included) in its NVLink domain: the NVLink and network shares move at once."""
    if ep <= 1:
        return 0.0
    intra, inter = comm.links(hw)
    local = max(1, min(in_domain, ep))
    nvlink = nbytes * (local - 1) / ep / intra.bytes_per_s
    network = nbytes * (ep - local) / ep / inter.bytes_per_s
    latency = inter.latency_s if local < ep else intra.latency_s
    return max(nvlink, network) + latency


def remote_domains_per_token(layer: Layer, ep: int, in_domain: int,
                             how: str = "scores") -> float:
    """Expected number of other NVLink domains of the EP group that hold at least one of a
    token's top-k experts: the group spans D = ceil(ep / in_domain) domains of E / D experts
    each, and a token touches routing.parts_per_token of them (balanced routing, the load knob's
    1.0; DeepSeek-V3's group limit where the model has one; the stack's routing); the token's
    own domain is one of the D alike, so (D - 1) / D of those are others."""
    domains = -(-ep // max(1, in_domain))
    if domains <= 1:
        return 0.0
    return routing.parts_per_token(layer, domains, how) * (domains - 1) / domains


def ranks_per_token(layer: Layer, shape) -> float:
    """Expected EP ranks that hold at least one of a token's experts (DeepEP sends the token
    once to each: its get_dispatch_layout returns is_token_in_rank, one flag per token and
    rank), at most k."""
    return routing.parts_per_token(layer, shape.ep, shape.moe_routing)


def deepep_s(layer: Layer, shape, hw: Hardware) -> float:
    """One DeepEP dispatch (or combine) across NVLink domains (DeepEP's normal kernels): a token
    crosses the network once per destination domain, not once per expert, and is forwarded
    there over NVLink to each GPU holding one of its experts. DeepEP csrc/kernels/internode.cu:
    the token's network copy carries ``SourceMeta(int rdma_rank, const bool*
    is_token_in_nvl_ranks)``, one bit per NVLink peer of the destination node that needs it.
    Network: the token (2h, times the load) times the expected remote domains; NVLink: the
    token once per rank holding one of its experts (ranks_per_token, not once per expert),
    sent directly or forwarded, crossing NVLink unless it is the rank the network delivers to:
    R·(d - 1)/d copies with d EP members per domain. Both at once, plus a network latency.
    Within one domain it is an all-to-all of the token once per rank (DeepEP's intranode
    kernels: the same is_token_in_rank)."""
    ep = shape.ep
    in_domain = max(1, min(shape.ep_in_domain or ep, ep))
    token = ACT_BYTES * shape.tokens / shape.tp * layer.hidden_size * shape.expert_load
    ranks = ranks_per_token(layer, shape)
    if in_domain >= ep:
        return all_to_all_s(token * ranks, ep, in_domain, hw)
    intra, inter = comm.links(hw)
    network = token * remote_domains_per_token(layer, ep, in_domain,
                                               shape.moe_routing) / inter.bytes_per_s
    nvlink = token * ranks * (in_domain - 1) / in_domain / intra.bytes_per_s
    return max(network, nvlink) + inter.latency_s


def dispatch_s(layer: Layer, shape, hw: Hardware) -> float:
    """One dispatch (or combine): the EP all-to-all, plus the etp all-gather (or
    reduce-scatter) of the routed copies over NVLink."""
    if not layer.is_moe:
        return 0.0
    ep, etp = shape.ep, expert_tp(shape)
    in_domain = shape.ep_in_domain or ep
    if shape.moe_dispatcher == "deepep":
        a2a = deepep_s(layer, shape, hw)
    else:
        a2a = all_to_all_s(dispatch_bytes(layer, shape), ep, in_domain, hw)
    gather = comm.all_gather_s(dispatch_bytes(layer, shape) * etp, etp, comm.links(hw)[0])
    return a2a + gather


def kept_bytes(layer: Layer, shape) -> float:
    """Activations an MoE MLP keeps for the backward, beyond its input (counted as a dense MLP's
    is): the router's fp32 probabilities (T·E, replicated across TP unless SP), per routed copy
    (at the mean load, mean_routed_copies)
    the expert's input (2h), its FC1 outputs and activation (SwiGLU 6f/etp, GeLU 4f/etp), and
    the shared experts as a dense MLP (sharded by tp). Where the routing weights multiply the
    experts' outputs (torchtitan, DeepSpeed-MoE) the weights' gradient needs each copy's output
    (2h more); where they multiply the activation inside the expert (Megatron-Core's
    ``activation_func_with_probs(fc1_output, permuted_probs)``; the stack's
    ``moe_probs_in_activation``) the FC1 output already kept serves, and the activation keeps
    the copy's fp32 weight instead (4 bytes)."""
    sb, t = shape.tokens, shape.tp
    rep = 1 / t if shape.sp else 1.0
    router = ROUTER_PROB_BYTES * sb * layer.num_experts * rep
    f = layer.ffn_hidden_size / expert_tp(shape)
    weight = ROUTER_PROB_BYTES if shape.moe_probs_in_activation else 2 * layer.hidden_size
    per_copy = 2 * layer.hidden_size + (6 if layer.mlp == "swiglu" else 4) * f + weight
    shared = sb * (6 if layer.mlp == "swiglu" else 4) * layer.shared_ffn_hidden_size / t
    return router + mean_routed_copies(layer, shape) * per_copy + shared


def ep_in_domain(etp: int, ep: int, domain: int) -> int:
    """EP group members in one NVLink domain under Megatron's expert rank order (etp-ep-edp-pp,
    layout/ranks.py): members are etp ranks apart, so a domain of D GPUs holds D / etp of them
    (at least 1, at most ep). tests/test_moe_cost.py checks it against the layout's groups."""
    return max(1, min(ep, domain // etp))


def shape_fields(par, hw: Hardware, opts) -> dict:
    """The Shape fields of a configuration's experts: ep, etp, EP members per NVLink domain (the
    hardware's domain, else its node; make_cluster sets the hardware's node size), the stack's
    expert load and where it applies the routing weights."""
    domain = hw.nvlink_domain or hw.gpus_per_node  # as Cluster.nvlink_domain rules it:
    if domain % hw.gpus_per_node:  # a domain that does not hold whole nodes is one node
        domain = hw.gpus_per_node
    return dict(ep=par.ep, etp=par.expert_tp,
                ep_in_domain=ep_in_domain(par.expert_tp, par.ep, domain),
                expert_load=opts.moe_expert_load,
                moe_probs_in_activation=opts.moe_probs_in_activation,
                moe_dispatcher=opts.moe_dispatcher, moe_routing=opts.moe_routing)


def notes(model, par, opts) -> tuple[str, ...]:
    """The plan's MoE footer: experts, active parameters, the expert split and the stated load."""
    if not model.is_moe:
        return ()
    return (f"MoE: {model.num_experts} experts, top-{model.moe_top_k}; "
            f"{model.active_params / 1e9:.1f}B of {model.params / 1e9:.1f}B parameters active "
            f"per token (MFU counts active-parameter FLOPs); ep {par.ep}, etp {par.expert_tp}; "
            f"expert load {opts.moe_expert_load:.2f}x the mean (--expert-load); " +
            ("all-to-all hidden in DualPipe's F&B pairs (pipeline/dualpipe.py)"
             if par.schedule_traits.pairs_forward_backward
             else "all-to-all not overlapped with compute"),)
