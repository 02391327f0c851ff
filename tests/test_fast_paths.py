"""The planner's fast paths (issue #17: MoE screening speed) give exactly what the plain
formulas give: each one against its reference written the plain way, and a small MoE search
whose plans must be identical with every fast path swapped back for its reference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hypothesis import given, settings, strategies as st

from planner.core.parallel import Parallel
from planner.cost import comm, gemm, nccl, tensor_parallel
from planner.cost.memory import ACT_BYTES
from planner.hardware.profiles import load_hardware, make_cluster
from planner.layout.ranks import dp_group_crosses_nodes, stage_hop_crosses_nodes
from planner.model.load import model_from_dict
from planner.predict import data_parallel, pipeline_schedule
from planner.predict.chunks import ChunkArrays
from planner.search.request import Request
from planner.search.solver import search
from planner.stack import default_stack

H100 = load_hardware("h100")
CONFIGS = Path(__file__).parent / "hf_configs" / "moe"


# --- the references: each fast path's function as written before it was made fast -------------

def collective_s_reference(kind, nbytes, group):
    sizes = np.asarray(nbytes, dtype=float)
    if group.ranks <= 1:
        out = np.zeros_like(sizes)
    else:
        times = [c.time_s(sizes) for c in nccl.choices(kind, group)]
        out = np.where(sizes > 0, np.minimum.reduce(times), 0.0)
    return float(out) if out.ndim == 0 else out


def by_rank_reference(self, values, pp):
    return values.reshape(-1, pp).sum(axis=0)


def dp_group_reference(par, cluster, experts=False):
    n, domain = par.dp * par.cp, cluster.nvlink_domain
    inner = par.tp
    if experts:
        n, inner = par.expert_dp, par.expert_tp * par.ep
    per_domain = max(1, min(n, domain // inner))
    spans = cluster.gpus > domain and dp_group_crosses_nodes(inner, n, par.pp, domain)
    per_node = max(1, min(n, cluster.gpus_per_node // inner))
    link = comm.group_link(cluster.hardware, per_node, spans)
    domains = -(-n // per_domain) if spans else 1
    return nccl.Group(ranks=n, nodes=domains, bus_bytes_per_s=link.bytes_per_s)


def stage_transfer_s_reference(model, par, cluster, opts):
    chunks = par.num_chunks
    if chunks == 1:
        return []
    intra, inter = comm.links(cluster.hardware)
    domain = cluster.nvlink_domain
    full = ACT_BYTES * par.micro_batch * model.seq_length // par.cp * model.hidden_size
    sharded = par.sequence_parallel or opts.p2p_scatter_gather
    nbytes = full / par.tp if sharded else full
    regather = (tensor_parallel.all_gather_s(full, par.tp, cluster.hardware)
                if opts.p2p_scatter_gather and not par.sequence_parallel else 0.0)
    out = []
    for k in range(chunks - 1):
        a, b = k % par.pp, (k + 1) % par.pp
        crosses = cluster.gpus > domain and stage_hop_crosses_nodes(a, b, par.tp * par.cp,
                                                                     par.dp, domain)
        out.append(nccl.p2p_s(nbytes, (inter if crosses else intra).bytes_per_s, crosses)
                   + regather)
    return out


def weight_matmul_seconds_reference(shapes, rate):
    parts = [gemm.training_gemm_seconds(m, k, n, rate) for m, k, n in shapes]
    return tuple(sum(p[i] for p in parts) for i in range(3))


# --- each fast path against its reference ------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.sampled_from(nccl.KINDS), st.integers(2, 4096), st.integers(1, 64),
       st.lists(st.floats(0, 1e11), min_size=1, max_size=6))
def test_collective_s_matches_the_candidate_by_candidate_minimum(kind, ranks, nodes, sizes):
    group = nccl.Group(ranks=ranks, nodes=min(nodes, ranks), bus_bytes_per_s=4.5e10)
    arr = np.array(sizes)
    first = nccl.collective_s(kind, arr, group)
    assert np.array_equal(first, collective_s_reference(kind, arr, group))
    first += 1.0  # a caller changing its answer does not change the remembered one
    assert np.array_equal(nccl.collective_s(kind, arr, group),
                          collective_s_reference(kind, arr, group))
    assert nccl.collective_s(kind, sizes[0], group) == collective_s_reference(kind, sizes[0],
                                                                               group)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.integers(1, 4), st.lists(st.floats(0, 1e9), min_size=8,
                                                      max_size=8))
def test_by_rank_matches_the_reshaped_sum(pp, v, values):
    arr = np.resize(np.array(values), pp * v)
    fast = ChunkArrays.by_rank(None, arr, pp)
    assert np.array_equal(fast, by_rank_reference(None, arr, pp))
    assert fast is not arr  # callers may change what they get back


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from([1, 2]), st.booleans(), st.sampled_from([(16, 2), (64, 8), (256, 32)]))
def test_dp_groups_and_p2p_hops_match_the_plain_formulas(tp, pp, ep, v, sp, size):
    dp = max(1, size[0] // (tp * pp))  # powers of two: every product divides
    gpus = tp * pp * dp
    par = Parallel(tp=tp, pp=pp, dp=dp, micro_batch=1, num_microbatches=2 * pp,
                   schedule="interleaved" if v > 1 else "1f1b", virtual_stages=v,
                   sequence_parallel=sp and tp > 1, ep=min(ep, tp * dp), etp=1)
    cluster = make_cluster(H100, gpus, max(1, gpus // 8))
    for experts in (False, True):
        assert data_parallel.dp_group(par, cluster, experts) == \
            dp_group_reference(par, cluster, experts)
    opts = default_stack()
    assert pipeline_schedule.stage_transfer_s(MIXTRAL, par, cluster, opts) == \
        stage_transfer_s_reference(MIXTRAL, par, cluster, opts)


def test_repeated_expert_shapes_are_summed_as_before():
    shapes = ((37.5, 4096, 28672), (37.5, 14336, 4096)) * 8 + ((4096, 4096, 1024),)
    assert gemm.weight_matmul_seconds(shapes, 7e14) == \
        weight_matmul_seconds_reference(shapes, 7e14)


# --- a small MoE search: identical plans with every fast path swapped back -------------------

MIXTRAL = model_from_dict(
    dict(json.loads((CONFIGS / "mixtral-8x7b-v0.1.json").read_text()),
         max_position_embeddings=4096), "mixtral")


def _plans(result):
    return [(p.parallel, p.metrics, p.stages, p.rank_memory_bytes) for p in result.plans]


def test_small_moe_search_gives_the_same_plans_as_the_plain_formulas(monkeypatch):
    req = Request(model=MIXTRAL, cluster=make_cluster(H100, 16, 2), global_batch=64, top=5,
                  refine=4)
    fast = search(req)
    monkeypatch.setattr(nccl, "collective_s", collective_s_reference)
    monkeypatch.setattr(ChunkArrays, "by_rank", by_rank_reference)
    monkeypatch.setattr(data_parallel, "dp_group", dp_group_reference)
    monkeypatch.setattr(pipeline_schedule, "stage_transfer_s", stage_transfer_s_reference)
    monkeypatch.setattr("planner.predict.stages.stage_transfer_s", stage_transfer_s_reference)
    monkeypatch.setattr(gemm, "weight_matmul_seconds", weight_matmul_seconds_reference)
    plain = search(req)
    assert fast.plans and fast.screened == plain.screened
    assert _plans(fast) == _plans(plain)
