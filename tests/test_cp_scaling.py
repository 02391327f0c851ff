"""Cross-node context parallelism against published CP scaling (issue #30: "Check the cross-node
CP cost against published CP scaling").

The evidence is Yang et al. 2024, "Context Parallelism for Scalable Million-Token Inference"
(arXiv 2411.01783), abstract: ring attention "achieves near-linear scaling for long-context
prefill latency with up to 128 H100 GPUs across 16 nodes. Particularly, our method achieves 1M
context prefill with Llama3 405B model in 77s (93% parallelization efficiency, 63% FLOPS
utilization) and 128K context prefill in 3.8s." ... "Benchmarks on H100 GPU hosts
inter-connected with RDMA and TCP both show similar scalability for long-context prefill".
That is Llama 3 405B with TP 8 in each node and the sequence split over 16 nodes, the layout
of Llama 3's own 128K training (TP 8, CP 16). A prefill is the forward pass of the training step
(the same K/V ring, without its backward), so it checks the forward half of what
cost/context.py prices: the ring's K/V transfers across nodes, each behind one step's attention.

What it says about the model. The whole loss from 1 node to 16 was 7% at 1M tokens, so the
network's share of it, whatever it was, is under 7%: the model's network cost of the ring across
16 nodes must stay under that, at 1M tokens and at 128K. Scaling also stayed near-linear on TCP
hosts, slower than RDMA; the abstract gives no bandwidth for them, so the test takes a network 4
and 8 times slower than the profile's (the model's ring stops hiding at about 10 times slower:
16 times costs the 128K forward about 44%). Should the paper's TCP hosts prove slower than
that, the model overprices the ring there, and this is the test to tighten. The test does not
ask the model to reproduce the 7%: what the prefill lost besides the network (its kernels,
merges of partial softmax results) is not a published component figure, and the model does not
price it.

Beyond 16 nodes there is no published measurement. What the model says there (the 128K search
picks CP 32) rests on components: each ring step is a flash-attention call on blocks of
seq / (2 cp) tokens, 2K at CP 32, where the FlashAttention-2-class kernel the H100 profile
prices keeps its long-sequence rate (pytorch/benchmark PR #2296, H100, torch SDPA, 8 heads
of dim 128: 287 TFLOP/s at 1,024 tokens, 293 at 2,048, 298 at 4,096, 304 at 16,384), so the flat
attention rate holds there; the blocks shrink below 1K tokens only past CP 64.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.cost.layer import layer_cost
from planner.cost.memory import Shape
from planner.hardware.profiles import load_hardware
from planner.model.load import load_model
from planner.stack import default_stack

NODES = 16  # Yang et al.: "up to 128 H100 GPUs across 16 nodes", TP 8 in each
PUBLISHED_LOSS = 0.07  # "93% parallelization efficiency" at 1M tokens on 16 nodes


def _forward_s(seq_len: int, cp: int, hw, stack) -> float:
    """One Llama 3 405B block's forward on one GPU: TP 8 in the node, the sequence over cp nodes."""
    block = next(layer for layer in load_model("llama3-405b").layers if layer.kind == "block")
    shape = Shape(tp=8, sp=True, micro_batch=1, seq_len=seq_len // cp, cp=cp, cp_cross=cp > 1)
    return layer_cost(block, shape, "none", hw, stack).fwd_s


def _network_share(seq_len: int, hw) -> float:
    """The part of the 16-node forward that the ring's transfers add: the forward with them
    against the same forward with transfers of no cost (an infinitely fast network)."""
    stack = default_stack()
    free = replace(hw, inter_node_gbps=1e6, nics_per_node=None, nic_gbps=None)
    return _forward_s(seq_len, NODES, hw, stack) / _forward_s(seq_len, NODES, free, stack) - 1


@pytest.mark.parametrize("seq_len", [131072, 1048576])
def test_ring_across_16_nodes_costs_less_than_the_published_loss(seq_len):
    assert 0 <= _network_share(seq_len, load_hardware("h100")) < PUBLISHED_LOSS


@pytest.mark.parametrize("slower", [4, 8])
def test_the_ring_stays_hidden_on_a_network_several_times_slower(slower):
    # "RDMA and TCP both show similar scalability" (no TCP bandwidth published; module
    # docstring): a network `slower` times slower still costs the 128K forward less than 7%
    hw = load_hardware("h100")
    slow = replace(hw, inter_node_gbps=hw.inter_node_gbps / slower,
                   nic_gbps=hw.nic_gbps / slower if hw.nic_gbps else None)
    assert _network_share(131072, slow) < PUBLISHED_LOSS


@pytest.mark.parametrize("seq_len", [131072, 1048576])
def test_forward_scales_near_linearly_over_16_nodes(seq_len):
    # the modelled parallel efficiency of the whole forward, one node to 16: no lower than the
    # published 93% (the model prices no loss the paper did not attribute to a component)
    hw, stack = load_hardware("h100"), default_stack()
    efficiency = _forward_s(seq_len, 1, hw, stack) / (NODES * _forward_s(seq_len, NODES, hw, stack))
    assert 1 - PUBLISHED_LOSS <= efficiency <= 1.0 + 1e-9

