"""Partial activation recompute (Megatron's --recompute-method block): a chunk recomputes only its
first N transformer blocks. Its time and memory are the per-layer sums; the partitioners choose
the least N that fits per chunk, the chain DP, the option MILP and brute force agreeing; the
exports say what each launcher runs."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from planner.core.parallel import Parallel
from planner.cost.memory import Shape, activation_bytes
from planner.hardware.profiles import Cluster, load_hardware
from planner.launchers import megatron, parse_megatron_args
from planner.launchers import deepspeed, torchtitan
from planner.launchers.common import Recompute, launched_recompute
from planner.model.presets import PRESETS
from planner.model.spec import Layer
from planner.partitioning.dp import _exhaustive, partition_dp
from planner.partitioning.prepared import prepare
from planner.partitioning.problem import PartitionError, PartitionProblem
from planner.partitioning.solve import partition
from planner.predict.chunks import CostTable
from planner.predict.layer_costs import model_layer_costs
from planner.predict.step import evaluate
from planner.stack import default_stack

MODEL = PRESETS["llama3-8b"]  # embedding, 32 blocks, head
CLUSTER = Cluster(hardware=load_hardware("h100-sxm-80gb"), nodes=1, gpus_per_node=8)
PAR = Parallel(tp=2, pp=4, dp=1, micro_batch=1, num_microbatches=8, recompute="full",
               sequence_parallel=True)
BOUNDS = [(0, 9), (9, 17), (17, 25), (25, 34)]  # 8 blocks in every stage


def _plan(layers):
    return evaluate(MODEL, CLUSTER, PAR, bounds=BOUNDS, recompute_layers=layers)


def _tables():
    return {m: CostTable(model_layer_costs(MODEL, PAR, CLUSTER.hardware, default_stack(), m))
            for m in ("none", "full")}


@pytest.mark.parametrize("n", [1, 3, 7])
def test_block_n_is_the_sum_of_its_layers(n):
    """Stage 1 = blocks 9..16: its first n blocks cost what full recompute costs them, the rest
    what no recompute costs them (time, activations, FLOPs)."""
    plan = _plan([None, n, None, None])
    t = _tables()
    full, none = t["full"].costs, t["none"].costs
    layers = [full[i] if i < 9 + n else none[i] for i in range(9, 17)]
    stage = plan.stages[1]
    assert stage.recompute == "full" and stage.recompute_layers == n
    assert stage.fwd_s == pytest.approx(sum(c.fwd_s for c in layers))
    assert stage.bwd_s == pytest.approx(sum(c.bwd_s + c.recompute_s for c in layers))
    assert stage.recompute_label == f"block {n}"


def test_block_n_memory_lies_between_none_and_full_and_is_linear_in_n():
    peaks = [_plan([n] * 4).rank_memory_bytes[0] for n in (1, 2, 3)]
    none = evaluate(MODEL, CLUSTER, replace(PAR, recompute="none"), bounds=BOUNDS)
    full = evaluate(MODEL, CLUSTER, PAR, bounds=BOUNDS)
    assert full.rank_memory_bytes[0] < peaks[2] < peaks[1] < peaks[0]
    assert peaks[0] - peaks[1] == pytest.approx(peaks[1] - peaks[2], rel=1e-9)
    # n = 0 is no recompute, n = every block is full recompute: the stage says so plainly
    zero, every = _plan([0] * 4), _plan([8] * 4)
    assert [s.recompute_layers for s in zero.stages + every.stages] == [None] * 8
    assert every.metrics == full.metrics
    assert zero.stages[0].time_s == pytest.approx(none.stages[0].time_s)


def test_korthikanti_table_2_per_layer_memory_mixes_by_count():
    """Korthikanti et al. 2022, §5: "A simple approach to choose the amount of activations that
    are stored vs recomputed is to only checkpoint some of the transformer layers and store all
    the activations of other layers." Their Table 2 per transformer layer, with tensor and
    sequence parallelism: no recompute sbh(34/t + 5as/(ht)), full recompute sbh(2) (the layer
    input). GPT-3 175B (Table 3: a = 96, s = 2048, h = 12288, t = 8, b = 1): a stage of MT-NLG's
    three layers per device recomputing N of them holds N·2sbh + (3 - N)·sbh(34/t + 5as/(ht))."""
    a, s, h, t, b = 96, 2048, 12288, 8, 1
    layer = Layer(kind="block", hidden_size=h, num_attention_heads=a, num_kv_heads=a,
                  ffn_hidden_size=4 * h, mlp="gelu", norm="layernorm", bias=True, dropout=True)
    shape = Shape(tp=t, sp=True, micro_batch=b, seq_len=s)
    keep = activation_bytes(layer, shape, "none", flash=False)
    drop = activation_bytes(layer, shape, "full", flash=False)
    assert keep == pytest.approx(s * b * h * (34 / t + 5 * a * s / (h * t)))
    assert drop == pytest.approx(s * b * h * 2 / t)  # the input, sharded by sequence parallelism
    for n in range(4):
        assert n * drop + (3 - n) * keep == pytest.approx(
            s * b * h * (n * 2 / t + (3 - n) * (34 / t + 5 * a * s / (h * t))))


# ------------------------------------------------------------------ the partitioners


def _problem(n_blocks, cap, inflight, slow=1.3, cap_ratio=0.95):
    L = n_blocks + 2
    t = np.array([[0.5, 0.5]] + [[1.0, slow]] * n_blocks + [[0.7, 0.7]])
    a = np.array([[1.0, 1.0]] + [[10.0, 2.0]] * n_blocks + [[3.0, 3.0]])
    s = np.array([5.0] + [4.0] * n_blocks + [6.0])
    blocks = np.array([False] + [True] * n_blocks + [False])
    return PartitionProblem(t, s, a, np.asarray(inflight, float), np.array([cap, cap * cap_ratio]),
                            ("none", "full"), 0.01, partial=(0, 1), blocks=blocks), L


@settings(max_examples=60, deadline=None, derandomize=True)
@given(n_blocks=st.integers(2, 6), p=st.integers(1, 3), v=st.integers(1, 2),
       cap=st.floats(15, 120), slow=st.floats(1.05, 1.6))
def test_dp_milp_and_brute_force_agree(n_blocks, p, v, cap, slow):
    """The chain DP (v = 1), the option MILP (any v) and brute force over every split, mode and
    recomputed count return the same split, modes and counts (or all find none)."""
    K = p * v
    if K > n_blocks + 2 or (v > 1 and K > n_blocks):
        return
    inflight = [min(p - k % p, 4) + (v > 1 and k < p) for k in range(K)]
    pr, _ = _problem(n_blocks, cap, inflight, slow)
    ref = _exhaustive(prepare(pr, K, p))
    dp = None if v > 1 else _solve(lambda: partition_dp(pr, K, p))
    milp = _solve(lambda: partition(pr, K, p, solver="highs"))
    if ref is None:
        assert milp is None and dp is None
        return
    for got in [milp] + ([dp] if v == 1 else []):  # the chain DP is v = 1 only
        assert got is not None and list(got.boundaries) == ref[0]
        assert got.method in ("dp", "ilp-highs")
        assert [_option(c) for c in got.chunks] == ref[1]


def _option(chunk):
    return {"none": 0, "full": 1}[chunk.recompute] if chunk.recompute_layers is None \
        else 2 + chunk.recompute_layers - 1


def _solve(fn):
    try:
        return fn()
    except PartitionError:
        return None


def test_the_least_count_that_fits_is_chosen():
    """One stage of 6 blocks, 4 microbatches in flight: the least N whose memory fits, by hand.
    Memory of N: 5 + 6 + 24 + 4·(1 + 3 + 60 - 8N) = 291 - 32N; capacity 0.95·220 = 209 => N = 3
    (195), N = 2 (227) does not fit."""
    pr, _ = _problem(6, 220.0, [4])
    part = partition_dp(pr, 1, 1)
    assert part.recompute == ("full",) and part.recompute_layers == (3,)
    assert part.chunks[0].memory_bytes == pytest.approx(291 - 32 * 3)
    assert part.chunks[0].time_s == pytest.approx(0.5 + 6 + 0.7 + 3 * 0.3)
    assert partition(pr, 1, 1, solver="highs").recompute_layers == (3,)


def test_partial_needs_recompute_that_saves_memory():
    t = np.array([[1.0, 2.0]] * 3)
    a = np.array([[1.0, 2.0]] * 3)  # "full" heavier than "none": not a recompute
    with pytest.raises(PartitionError, match="no faster and no heavier"):
        PartitionProblem(t, np.ones(3), a, np.ones(1), 10.0, ("none", "full"), partial=(0, 1))


# ------------------------------------------------------------------ exports


def test_megatron_exports_one_block_count_and_refuses_counts_that_differ():
    """Megatron's --recompute-num-layers is one N for every stage: a plan whose stages recompute
    3, 3, 3, 3 blocks exports block 3; one whose stages recompute 2, 3, 0, 0 is refused (it was
    exported as block 3 before, running stages 0, 2 and 3 other than priced)."""
    flags = dict(megatron.args(_plan([3, 3, 3, 3])))
    assert (flags["--recompute-granularity"], flags["--recompute-method"],
            flags["--recompute-num-layers"]) == ("full", "block", "3")
    assert parse_megatron_args(megatron.render(_plan([3, 3, 3, 3]))["megatron_args.sh"])[
        "recompute_layers"] == 3
    mixed = _plan([2, 3, None, None])
    mixed = replace(mixed, stages=tuple(replace(s, recompute="none") if s.stage >= 2 else s
                                        for s in mixed.stages))
    assert launched_recompute(mixed) is None
    (problem,) = [p for p in megatron.check(mixed) if "recompute" in p]
    assert "block 2, block 3, none, none" in problem and "one recompute setting" in problem


def test_a_chunk_with_fewer_blocks_than_n_recomputes_them_all():
    """Block N recomputes min(N, blocks) of each chunk: 3 blocks of a 3-block chunk is full."""
    plan = evaluate(MODEL, CLUSTER, PAR, bounds=[(0, 4), (4, 17), (17, 25), (25, 34)],
                    recompute_layers=[None, 3, 3, 3])
    assert launched_recompute(plan) == Recompute("full", 3)
    assert [s.recompute_label for s in plan.stages] == ["full", "block 3", "block 3", "block 3"]


def test_megatron_keeps_uniform_when_every_stage_recomputes_whole_chunks():
    flags = dict(megatron.args(evaluate(MODEL, CLUSTER, PAR, bounds=BOUNDS)))
    assert (flags["--recompute-method"], flags["--recompute-num-layers"]) == ("uniform", "1")
    text = megatron.render(evaluate(MODEL, CLUSTER, PAR, bounds=BOUNDS))["megatron_args.sh"]
    assert parse_megatron_args(text)["recompute_layers"] is None


def test_torchtitan_layer_sac_only_where_it_recomputes_exactly_the_planned_blocks():
    # 8 blocks a rank: k = 2 recomputes floor(8 / 2) = 4 on every rank
    assert torchtitan.layer_sac(_plan([4, 4, 4, 4])) == 2
    # 3 of 8: no k gives floor(8 / k) = 3, so there is no layer SAC (and the export refuses)
    assert torchtitan.layer_sac(_plan([3, 3, 3, 3])) is None
    assert torchtitan.layer_sac(_plan(None)) is None
    toml = torchtitan._toml(replace(_plan([4, 4, 4, 4]), parallel=replace(PAR, zero=2)))
    assert 'mode = "selective"' in toml and 'selective_ac_option = "2"' in toml


def test_deepspeed_refuses_the_block_method():
    """DeepSpeed checkpoints all blocks or none (activation_checkpoint_interval): a block plan
    is refused, where it was exported before with every block recomputing."""
    plan = _plan([2, 2, 2, 2])
    problems = deepspeed.check(replace(plan, parallel=replace(PAR, tp=1, dp=2)))
    assert any("first 2 blocks of each stage" in p for p in problems)


def test_deepspeed_refuses_a_partial_block_count_and_checkpoints_every_block_of_full():
    """DeepSpeed checkpoints every block or none: a stage recomputing only its first blocks is
    refused (never exported as full); an all-full plan checkpoints every block."""
    plan = replace(_plan([2, None, None, None]), parallel=replace(PAR, tp=1, dp=2))
    assert "recompute differently" in deepspeed.check(plan)[0]
    full = replace(_plan([None, None, None, None]), parallel=replace(PAR, tp=1, dp=2))
    assert "ACTIVATION_CHECKPOINT_INTERVAL = 1" in deepspeed._pipeline_py(full)


def test_the_block_pin_runs_megatrons_block_method_only():
    """--recompute block: every stage none, full or its first N blocks (no selective), one N on
    every stage, and the search uses a partial count where it pays (llama3-70b on 64 A100s)."""
    import json

    from typer.testing import CliRunner

    from cli import app

    out = CliRunner().invoke(app, ["solve", "--model", "llama3-70b", "--gpus", "64", "--nodes",
                                   "8", "--gpu", "a100-80gb", "--recompute", "block", "--top",
                                   "3", "--json"])
    assert out.exit_code == 0, out.output
    plans = json.loads(out.output)["plans"]
    assert all(p["parallel"]["recompute"] == "full" for p in plans)
    assert all(s["recompute"] in ("none", "full") for p in plans for s in p["stages"])
    block = [p for p in plans if any("recompute_layers" in s for s in p["stages"])]
    assert block, "no plan recomputes part of its blocks"
    for p in block:  # one N on every stage, as Megatron's --recompute-num-layers runs it
        assert len({s.get("recompute_layers") for s in p["stages"] if s["recompute"] == "full"}
                   - {None}) == 1
    bad = CliRunner().invoke(app, ["solve", "--gpus", "8", "--nodes", "1", "--recompute",
                                   "blocks"])
    assert bad.exit_code == 2 and "--recompute must be one of" in bad.output


def test_plan_json_carries_the_count_and_validates(tmp_path):
    """plan.json's stage says recompute_layers where only some blocks recompute (and nowhere
    else); the shipped schema accepts it and `plan simulate --plan` reads the plan back."""
    import json

    import jsonschema

    from planner.launchers import export_plan, plan_json
    from planner.pipeline.job import simulation_job

    plan = _plan([2, None, 5, None])
    export_plan(plan, ["json"], tmp_path, force=True)
    doc = json.loads((tmp_path / "plan.json").read_text())
    jsonschema.Draft202012Validator(plan_json.schema()).validate(doc)
    assert [s.get("recompute_layers") for s in doc["stages"]] == [2, None, 5, None]
    assert simulation_job(None, None, None, None, None, None, tmp_path / "plan.json")
