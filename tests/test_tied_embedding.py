"""The tied embedding's gradient all-reduce between the first and last pipeline stage
(planner/cost/tied_embedding.py) and DeepSpeed's ZeRO-1 all-reduce (stack zero1_grad_reduce),
against hand-computed bytes and times."""

from dataclasses import replace

import pytest

from planner.core.errors import PlanInputError
from planner.core.parallel import Parallel
from planner.cost import comm, nccl, tied_embedding
from planner.fidelity.cases import DEFAULT_FILE, case_setup, load_cases
from planner.hardware.profiles import load_hardware, make_cluster
from planner.model.presets import PRESETS
from planner.predict.step import predict_plan
from planner.stack import load_stack, with_overrides
from planner.stack.spec import check_value


@pytest.fixture(scope="module")
def bloom():
    """BLOOM-176B as trained (tp4 pp12 dp8 on Jean Zay, deepspeed stack, ZeRO-1)."""
    cases = {c["name"]: c for c in load_cases(DEFAULT_FILE)}
    return case_setup(cases["bloom-176B-production"])


def test_bloom_all_reduces_its_fp32_embedding_shard_over_the_nics(bloom):
    """250,880 x 14,336 / tp4 = 899,153,920 gradient elements, held in BF16_Optimizer's fp32
    buffer (DeepSpeed all-reduces weight._hp_grad under bf16): 3,596,615,680 bytes. Stage 0
    (ranks 0-31) and stage 11 (ranks 352-383) are on different nodes, every GPU of a node runs
    its own two-rank all-reduce at once: each at 50 GB/s / 8 = 6.25 GB/s x the NICs' measured
    efficiency. A two-rank ring all-reduce sends 2 (n - 1) / n = 1 buffer per rank; NCCL's ring
    Simple latency: 8.4 us base + 2 network steps of 14 us."""
    model, par, cluster, opts = bloom.model, bloom.parallel, bloom.cluster, bloom.options
    assert (par.tp, par.pp, par.dp, par.zero) == (4, 12, 8, 1)
    nbytes = 250880 // 4 * 14336 * 4
    assert nbytes == 3_596_615_680
    assert tied_embedding.grad_bytes(model, par, opts) == nbytes
    group = tied_embedding.embedding_group(par, cluster)
    nic = comm.efficiencies(cluster.hardware)[1]
    assert (group.ranks, group.nodes) == (2, 2)
    assert group.bus_bytes_per_s == pytest.approx(6.25e9 * nic)
    expected = (8.4 + 2 * 14.0) * 1e-6 + nbytes / (6.25e9 * nic)
    assert tied_embedding.sync_s(model, par, cluster, opts) == pytest.approx(expected, rel=1e-9)
    assert 0.55 < expected < 0.65  # about 0.6 s of BLOOM's ~105 s step


def test_bloom_step_pays_the_all_reduce_once_after_the_drain(bloom):
    """The step grows by exactly the all-reduce: ranks 0 and 11 (embedding, head) already have
    the largest DP sync, and nothing overlaps the tied all-reduce."""
    model, par, cluster, opts = bloom.model, bloom.parallel, bloom.cluster, bloom.options
    untied = replace(model, tie_embeddings=False)  # same layers and split, no embedding group
    _, tied_pred = predict_plan(model, cluster, par, opts, list(bloom.bounds))
    _, untied_pred = predict_plan(untied, cluster, par, opts, list(bloom.bounds))
    assert tied_pred.step_s - untied_pred.step_s == pytest.approx(
        tied_embedding.sync_s(model, par, cluster, opts), rel=1e-6)


def test_megatron_all_reduces_the_fp32_main_grad_over_nvlink_inside_a_node():
    """GPT-3 175B at tp4 pp2 on one 8-GPU A100 node: Megatron all-reduces main_grad (fp32 on
    megatron-core) of its 51,200 / 4 x 12,288 shard between ranks 0 and 4 over NVLink: ring
    Simple, 8.4 us + 2 NVLink steps of 3.4 us + 1 buffer at the derated NVLink rate."""
    model, opts = PRESETS["gpt3-175b"], load_stack("megatron-core")
    cluster = make_cluster(load_hardware("a100-80gb"), 8, 1)
    par = Parallel(tp=4, pp=2, dp=1, micro_batch=1, num_microbatches=8)
    nbytes = 51200 // 4 * 12288 * 4
    assert tied_embedding.grad_bytes(model, par, opts) == nbytes == 629_145_600
    group = tied_embedding.embedding_group(par, cluster)
    nvlink = comm.links(cluster.hardware)[0].bytes_per_s
    assert (group.ranks, group.nodes, group.bus_bytes_per_s) == (2, 1, nvlink)
    expected = (8.4 + 2 * 3.4) * 1e-6 + nbytes / nvlink
    assert tied_embedding.sync_s(model, par, cluster, opts) == pytest.approx(expected, rel=1e-9)


def test_untied_llama_pays_nothing():
    """Llama's head has its own weight: no embedding group, no bytes, no seconds, and its
    predicted step is the same with the tied model's all-reduce priced at any size."""
    model, opts = PRESETS["llama3-8b"], load_stack("megatron-core")
    assert not model.tie_embeddings
    cluster = make_cluster(load_hardware("a100-80gb"), 16, 2)
    par = Parallel(tp=2, pp=4, dp=2, micro_batch=1, num_microbatches=8)
    assert not tied_embedding.synced(model, par)
    assert tied_embedding.grad_bytes(model, par, opts) == 0.0
    assert tied_embedding.sync_s(model, par, cluster, opts) == 0.0
    _, pred = predict_plan(model, cluster, par, opts)
    _, as_tied = predict_plan(replace(model, tie_embeddings=True), cluster, par, opts)
    assert as_tied.step_s > pred.step_s  # the same shape tied does pay (across nodes here)


@pytest.mark.parametrize("pp, schedule", [(1, "1f1b"), (4, "dualpipe")])
def test_embedding_and_head_on_one_rank_exchange_nothing(pp, schedule):
    """One stage, or DualPipe (rank 0 also holds the last stage): the head's weight is the
    embedding's on the same GPU."""
    model, opts = PRESETS["gpt3-175b"], load_stack("megatron-core")
    cluster = make_cluster(load_hardware("h100-sxm-80gb"), 64, 8)
    par = Parallel(tp=8, pp=pp, dp=64 // (8 * pp), micro_batch=1, num_microbatches=8,
                   schedule=schedule)
    assert tied_embedding.sync_s(model, par, cluster, opts) == 0.0


def test_the_gradient_dtype_follows_the_stack():
    """DeepSpeed reduces BF16_Optimizer's fp32 ``_hp_grad`` where it keeps one (ZeRO 0-1 with
    fp32 accumulation), else the bf16 ``.grad``."""
    model = PRESETS["gpt3-175b"]
    par = Parallel(tp=8, pp=8, dp=1, micro_batch=1, num_microbatches=8, zero=1)
    elements = 51200 / 8 * 12288
    ds = load_stack("deepspeed")
    assert tied_embedding.grad_bytes(model, par, ds) == elements * 4
    bf16 = with_overrides(ds, fp32_grad_accumulation_zero=[])
    assert tied_embedding.grad_bytes(model, par, bf16) == elements * 2


# --- DeepSpeed's ZeRO-1 all-reduce (stack zero1_grad_reduce) --------------------------------------

def test_stacks_name_their_zero1_collective():
    assert load_stack("deepspeed").zero1_grad_reduce == "all_reduce"
    for name in ("megatron-core", "megatron-2021", "torchtitan"):
        assert load_stack(name).zero1_grad_reduce == "reduce_scatter"
    with pytest.raises(PlanInputError, match="zero1_grad_reduce.*reduce_scatter, all_reduce"):
        check_value("zero1_grad_reduce", "allreduce", "stack.json")


def test_bf16_optimizer_all_reduces_the_fp32_gradients_at_zero1():
    """Llama 3 8B, pp1 dp8 on one A100 node, ZeRO-1 on the deepspeed stack: BF16_Optimizer
    all-reduces the 8.03e9 fp32 gradients (2 x 7/8 of the buffer per rank, 14 ring steps)
    where a reduce-scatter moves 7/8 (7 steps): the step grows by 7 x 3.4 us + 7/8 x 4 bytes x
    parameters at the derated NVLink rate; ZeRO-0 and ZeRO-2 are unchanged."""
    model, ds = PRESETS["llama3-8b"], load_stack("deepspeed")
    cluster = make_cluster(load_hardware("a100-80gb"), 8, 1)
    nvlink = comm.links(cluster.hardware)[0].bytes_per_s
    params = sum(layer.params for layer in model.layers)
    grads = params * 4
    scatter = with_overrides(ds, zero1_grad_reduce="reduce_scatter")
    par = Parallel(tp=1, pp=1, dp=8, micro_batch=1, num_microbatches=4, zero=1)
    _, whole = predict_plan(model, cluster, par, ds)
    _, shard = predict_plan(model, cluster, par, scatter)
    assert whole.step_s - shard.step_s == pytest.approx(7 * 3.4e-6 + 7 / 8 * grads / nvlink,
                                                        rel=1e-6)
    group = nccl.Group(ranks=8, nodes=1, bus_bytes_per_s=nvlink)
    assert whole.step_s - shard.step_s == pytest.approx(
        nccl.collective_s("all_reduce", grads, group)
        - nccl.collective_s("reduce_scatter", grads, group), rel=1e-9)
    for zero in (0, 2):
        other = replace(par, zero=zero)
        assert predict_plan(model, cluster, other, ds)[1].step_s == \
            predict_plan(model, cluster, other, scatter)[1].step_s


# --- the MTP modules' embedding copy (issue #18) -------------------------------------------------

def _deepseek_v3(mtp: int):
    import json
    from pathlib import Path

    from planner.model.load import model_from_dict
    config = Path(__file__).parent / "hf_configs" / "moe" / "deepseek-v3.json"
    data = {**json.loads(config.read_text()), "num_nextn_predict_layers": mtp}
    return model_from_dict(data, f"deepseek-v3-mtp{mtp}").with_seq_length(4096)


def test_an_mtp_embedding_copy_is_all_reduced_as_a_tied_head_is():
    """DeepSeek-V3 (untied, MTP depth 1) on 2,048 H800s at pp16 dp128 ep64 under 1F1B: the
    last stage keeps the embedding copy its MTP module reads (129,280 x 7,168, vocab padded
    to 129,280 already at tp1) and Megatron-Core all-reduces its fp32 main_grad with the first
    stage's ('if model_module.share_embeddings_and_output_weights or getattr(config,
    'mtp_num_layers', 0)'): 926,679,040 elements x 4 bytes, between two nodes (each GPU at
    its share of the node's NICs, comm.group_link). Under DualPipe
    the copy is the embedding itself (rank 0 holds both): nothing. Without MTP, or with one
    stage: nothing."""
    model, opts = _deepseek_v3(1), load_stack("megatron-core")
    assert not model.tie_embeddings and model.layers[-1].mtp_copies_embedding
    cluster = make_cluster(load_hardware("h800"), 2048, 256)
    par = Parallel(tp=1, pp=16, dp=128, micro_batch=1, num_microbatches=120, zero=1, ep=64)
    nbytes = 129280 * 7168 * 4
    assert nbytes == 3_706_716_160
    assert tied_embedding.synced(model, par)
    assert tied_embedding.grad_bytes(model, par, opts) == nbytes
    group = tied_embedding.embedding_group(par, cluster)
    assert (group.ranks, group.nodes) == (2, 2)
    assert tied_embedding.sync_s(model, par, cluster, opts) == pytest.approx(
        float(nccl.collective_s("all_reduce", nbytes, group)), rel=1e-12)
    # a two-rank ring moves one buffer per rank: bandwidth term plus NCCL's latency (< 1 ms)
    bandwidth = nbytes / group.bus_bytes_per_s
    assert bandwidth <= tied_embedding.sync_s(model, par, cluster, opts) < bandwidth + 1e-3
    for other in (replace(par, schedule="dualpipe"), replace(par, pp=1, dp=2048)):
        assert tied_embedding.grad_bytes(model, other, opts) == 0.0
    assert tied_embedding.grad_bytes(_deepseek_v3(0), par, opts) == 0.0


def test_the_step_pays_the_mtp_copy_all_reduce_once(monkeypatch):
    """DeepSeek-V3 at pp4 on 1F1B (64 H800s, ep8): the all-reduce follows the drain on the
    first and last rank, after their own DP sync, so the step grows by at most the all-reduce
    (less where another rank's DP sync was already the longest) and by more than nothing."""
    model, opts = _deepseek_v3(1), load_stack("megatron-core")
    cluster = make_cluster(load_hardware("h800"), 64, 8)
    par = Parallel(tp=1, pp=4, dp=16, micro_batch=1, num_microbatches=8, zero=1, ep=8)
    sync = tied_embedding.sync_s(model, par, cluster, opts)
    assert sync > 0.0
    _, with_sync = predict_plan(model, cluster, par, opts)
    monkeypatch.setattr(tied_embedding, "sync_s", lambda *args: 0.0)
    _, without = predict_plan(model, cluster, par, opts)
    assert 0.0 < with_sync.step_s - without.step_s <= sync * (1 + 1e-9)
