"""DeepSpeed 0.19.8 runs the DeepSpeed export as priced: the exported files, unchanged (bf16 on,
the exported AdamW), go through ``deepspeed.initialize`` and two optimizer steps on 2 gloo CPU
processes, and what the engine runs is read back from it and compared with plan.json.

Cells (tiny decoder: embedding, 4 blocks, head; 2 GPUs): pp = 2, dp = 1, 1F1B, ZeRO-1, recompute
none (public type: split) and full (the _partition_layers override); pp = 1, dp = 2, ZeRO 0-3,
recompute none and full. Refused cells (pp = 2 without ZeRO, tp > 1, stages that recompute
differently) are tested here without the engine.
"""

import json
import math
from dataclasses import replace

import pytest
from conftest import engine_module

import planner
from planner.core.parallel import Parallel
from planner.hardware.profiles import Cluster
from planner.launchers import ExportError, Facts, export_plan, launcher_allows
from planner.launchers import deepspeed
from planner.predict.plan import Metrics, Plan, Stage
from planner.stack import load_stack
from test_engine_roundtrip import TINY
from test_export import HW

M = 2  # microbatches per step (gradient accumulation steps)


def ds_plan(pp: int, zero: int, recompute: str, bounds: tuple[int, ...] | None = None,
            stage_recompute: tuple[str, ...] | None = None) -> Plan:
    """A tiny-llama plan on 2 GPUs priced on the deepspeed stack (pp * dp = 2)."""
    bounds = bounds or ((0, 6) if pp == 1 else (0, 3, 6))
    modes = stage_recompute or (recompute,) * pp
    par = Parallel(tp=1, pp=pp, dp=2 // pp, micro_batch=2, num_microbatches=M,
                   schedule="1f1b", recompute=recompute, zero=zero)
    stages = tuple(Stage(stage=i, rank=i, first=bounds[i], last=bounds[i + 1],
                         recompute=modes[i], time_s=3e-3, memory_bytes=1e6, fwd_s=1e-3,
                         bwd_s=2e-3, wgrad_s=1e-3) for i in range(pp))
    return Plan(model=TINY, cluster=Cluster(hardware=HW, nodes=1, gpus_per_node=2),
                parallel=par, stages=stages, stack=load_stack("deepspeed"),
                metrics=Metrics(step_time_s=1.0, tokens_per_s=1.0, tflops_per_gpu=1.0, mfu=0.1,
                                hfu=0.1, bubble_fraction=0.1, peak_memory_bytes=1.0))


CELLS = [(2, 1, "none", (0, 3, 6)), (2, 1, "full", (0, 2, 6))] + [
    (1, zero, recompute, None) for zero in range(4) for recompute in ("none", "full")]


def expected_checkpointed(doc: dict) -> list[int]:
    """From plan.json alone: every block of a stage that recomputes in full."""
    kinds = [layer["kind"] for layer in doc["layers"]]
    return [i for s in doc["stages"] if s["recompute"] == "full"
            for i in range(s["layers"]["start"], s["layers"]["stop"]) if kinds[i] == "block"]


def test_deepspeed_runs_the_export_as_priced(tmp_path):
    engine_module("deepspeed", reason="DeepSpeed is not installed: pip install -e '.[engine]'")
    from planner.engine.deepspeed_run import run_deepspeed

    dirs = []
    for pp, zero, recompute, bounds in CELLS:
        out = tmp_path / f"pp{pp}-zero{zero}-{recompute}"
        export_plan(ds_plan(pp, zero, recompute, bounds), ["json", "deepspeed"], out)
        assert (out / "deepspeed_recompute.py").exists() is (pp == 1 and recompute == "full")
        dirs.append(out)
    for out, ran in zip(dirs, run_deepspeed(dirs, tmp_path / "run")):
        doc = json.loads((out / "plan.json").read_text())
        par, entry, stack = doc["parallel"], doc["engines"]["deepspeed"], doc["stack"]["values"]
        assert ran["zero"] == par["zero"], out.name
        assert ran["bf16"] is (stack["param_dtype"] == "bf16")
        assert ran["optimizer"] == entry["optimizer"], out.name
        fp32 = par["zero"] in stack["fp32_grad_accumulation_zero"]
        assert ran["grad_accum_dtype"] == entry["grad_accum_dtype"] == \
            ("fp32" if fp32 else stack["grad_dtype"]), out.name
        assert (ran["micro_batch"], ran["accumulation_steps"]) == \
            (par["micro_batch"], par["num_microbatches"])
        if par["pp"] > 1:
            assert ran["parts"] == entry["parts"]
            full = doc["stages"][0]["recompute"] == "full"
            assert (ran["interval"], ran["checkpointable"]) == \
                ((1 if full else 0), [deepspeed.BLOCK_TYPE])
        else:
            assert ran["parts"] is None
        # every layer ran once per microbatch, and the checkpointed ones once more in the
        # backward: exactly the plan's blocks under full recompute, never embedding or head
        assert all(c in (M, 2 * M) for c in ran["calls"]), (out.name, ran["calls"])
        checkpointed = [i for i, c in enumerate(ran["calls"]) if c == 2 * M]
        assert checkpointed == entry["checkpointed_layers"] == expected_checkpointed(doc)
        assert all(math.isfinite(x) for losses in ran["losses"] for x in losses)
        if par["pp"] > 1:  # the first step's loss is the one-process loss, to bf16 rounding
            assert ran["losses"][0][0] == pytest.approx(reference_loss(doc), rel=2e-2)


def reference_loss(doc: dict) -> float:
    """The mean microbatch loss of one process in fp32 on the data rank 0 steps."""
    import torch

    from planner.engine.torch_model import build_decoder, loss_fn
    from planner.engine.torch_run import batch

    model = build_decoder(doc, dtype=torch.float32)
    tokens, targets = batch(doc)
    with torch.no_grad():
        return float(sum(loss_fn(model(x), y) for x, y in zip(tokens.split(2), targets.split(2)))
                     / M)


# --- refused cells (no engine needed) ------------------------------------------------------


@pytest.mark.parametrize("change,phrase", [
    (dict(pp=2, zero=0), "BF16_Optimizer"),
    (dict(tp=2), "no tensor parallelism"),
    (dict(tp=2, sequence_parallel=True), "no tensor parallelism"),
    (dict(pp=2, zero=2), "ZeRO stage <= 1"),
])
def test_search_rules_refuse_cells_deepspeed_does_not_run_as_priced(change, phrase):
    values = dict(tp=1, pp=1, dp=2, micro_batch=2, num_microbatches=2, schedule="1f1b",
                  zero=1, num_heads=4, num_kv_heads=2, ffn=64)
    assert launcher_allows("deepspeed", Facts(**values)) is None
    values.update(change)
    assert phrase in launcher_allows("deepspeed", Facts(**values))


def test_export_refuses_pipeline_without_zero(tmp_path):
    with pytest.raises(ExportError, match="BF16_Optimizer"):
        export_plan(ds_plan(2, 0, "none"), ["json", "deepspeed"], tmp_path / "out")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_export_refuses_fp32_accumulation_where_deepspeed_runs_none(tmp_path):
    """ZeRO-0 with grad_accum_dtype fp32 raises NotImplementedError in DeepSpeed 0.19.8."""
    plan = ds_plan(1, 0, "none")
    plan = replace(plan, stack=replace(plan.stack, fp32_grad_accumulation_zero=(0, 1)))
    with pytest.raises(ExportError, match="only at ZeRO-1"):
        export_plan(plan, ["deepspeed"], tmp_path / "out")


def test_mixed_stage_recompute_is_refused_and_nothing_written(tmp_path):
    plan = ds_plan(2, 1, "full", stage_recompute=("full", "none"))
    with pytest.raises(ExportError) as err:
        export_plan(plan, ["json", "deepspeed"], tmp_path / "out")
    assert "recompute differently" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_zero3_full_recompute_writes_the_checkpointing():
    files = deepspeed.render(ds_plan(1, 3, "full"))
    assert set(files) == {"ds_config.json", deepspeed.RECOMPUTE_FILE}
    assert "deepspeed.checkpointing.checkpoint" in files[deepspeed.RECOMPUTE_FILE]
    assert json.loads(files["ds_config.json"])["zero_optimization"]["stage"] == 3
    assert set(deepspeed.render(ds_plan(1, 3, "none"))) == {"ds_config.json"}


def test_solve_on_deepspeed_prices_one_recompute_per_plan():
    solution = planner.solve(2, 1, TINY, gpu="h100-sxm-80gb", global_batch=8, top=5,
                             launcher="deepspeed")
    assert solution.plans
    for plan in solution.plans:
        assert len({s.recompute for s in plan.stages}) == 1
        assert plan.parallel.tp == 1 and not (plan.parallel.pp > 1 and plan.parallel.zero == 0)
        assert deepspeed.check(plan) == []
