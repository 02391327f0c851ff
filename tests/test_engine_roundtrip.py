"""A plan runs on a real engine: plan.json alone (no model.json) builds a small Llama-style decoder,
which torch.distributed.pipelining steps with gloo on 2 CPU processes under every schedule plan3d
exports (GPipe, 1F1B, interleaved 1F1B, zero-bubble); the gradients must equal one process's.

Needs torch (``pip install -e '.[engine]'``; .ci/run installs it); skipped without it.
"""

import os
from dataclasses import replace

import pytest

from planner.hardware.profiles import Cluster
from planner.engine.exported import plan_document
from planner.launchers import export_plan
from planner.model.spec import ModelSpec
from planner.core.parallel import Parallel
from planner.predict.plan import Metrics, Plan, Stage
from test_export import HW

if os.environ.get("PLAN3D_REQUIRE_ENGINE") == "1":  # .ci/run: the round trip must run
    import torch
else:
    torch = pytest.importorskip("torch", reason="torch is not installed: pip install -e "
                                "'.[engine]' (.ci/run installs it) to run the engine round trip")
from planner.engine.torch_run import reference_grads, run_pipeline  # noqa: E402

TINY = ModelSpec(name="tiny-llama", num_layers=4, hidden_size=32, num_attention_heads=4,
                 num_kv_heads=2, ffn_hidden_size=64, vocab_size=64, seq_length=8, mlp="swiglu",
                 norm="rmsnorm", bias=False, dropout=False)
# (schedule, virtual stages, stage boundaries over 6 layers: embedding, 4 blocks, head)
CASES = [("gpipe", 1, (0, 3, 6)), ("1f1b", 1, (0, 2, 6)),
         ("interleaved", 2, (0, 2, 3, 5, 6)), ("zb-h1", 1, (0, 4, 6))]


def tiny_plan(schedule: str, v: int, bounds: tuple[int, ...], model: ModelSpec = TINY) -> Plan:
    par = Parallel(tp=1, pp=2, dp=1, micro_batch=2, num_microbatches=4, schedule=schedule,
                   virtual_stages=v, recompute="none", zero=0)
    stages = tuple(Stage(stage=i, rank=i % 2, first=bounds[i], last=bounds[i + 1],
                         recompute="none", time_s=3e-3, memory_bytes=1e6, fwd_s=1e-3,
                         bwd_s=2e-3, wgrad_s=1e-3) for i in range(len(bounds) - 1))
    return Plan(model=model, cluster=Cluster(hardware=HW, nodes=1, gpus_per_node=2),
                parallel=par, stages=stages,
                metrics=Metrics(step_time_s=1.0, tokens_per_s=1.0, tflops_per_gpu=1.0, mfu=0.1,
                                hfu=0.1, bubble_fraction=0.1, peak_memory_bytes=1.0))


def plan_file(tmp_path, name, plan) -> dict:
    """Export plan.json and read it back from the verified set: the engine sees only the file."""
    export_plan(plan, ["json"], tmp_path / name)
    return plan_document(tmp_path / name)


def test_every_schedule_matches_one_process(tmp_path):
    docs = [plan_file(tmp_path, schedule, tiny_plan(schedule, v, bounds))
            for schedule, v, bounds in CASES]
    assert [d["engines"]["torch_pipelining"]["schedule_class"] for d in docs] == [
        "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B",
        "ScheduleInterleavedZeroBubble"]
    results = run_pipeline(docs, tmp_path / "run")
    for doc, (grads, _) in zip(docs, results):
        ref = reference_grads(doc)
        schedule = doc["parallel"]["schedule"]
        assert set(grads) == set(ref), f"{schedule}: stages hold other parameters than the model"
        assert all(ref[k].abs().sum() > 0 for k in ref), "a parameter got no gradient"
        for name, g in ref.items():
            assert torch.allclose(grads[name], g, rtol=1e-9, atol=1e-12), (schedule, name)


def test_model_built_from_plan_json_alone(tmp_path):
    """The decoder's shapes come from plan.json: another hidden size gives other parameters."""
    from planner.engine.torch_model import build_decoder, stage_module

    doc = plan_file(tmp_path, "a", tiny_plan("1f1b", 1, (0, 2, 6)))
    model = build_decoder(doc)
    assert model.layers["0"].feed_forward.w1.weight.shape == (64, 32)
    assert model.layers["0"].attention.wk.weight.shape == (16, 32)  # 2 KV heads of dim 8
    wide = replace(TINY, hidden_size=48, num_attention_heads=6, num_kv_heads=3)
    doc2 = plan_file(tmp_path, "b", tiny_plan("1f1b", 1, (0, 2, 6), wide))
    assert build_decoder(doc2).tok_embeddings.weight.shape == (64, 48)
    first = stage_module(model, doc["stages"][0]["modules"])
    assert first.norm is None and first.output is None and list(first.layers) == ["0"]


def test_engine_refuses_v1_and_plans_it_cannot_run(tmp_path):
    from planner.core.errors import PlanInputError
    from planner.engine.torch_model import build_decoder
    from planner.engine.torch_run import engine_entry

    with pytest.raises(PlanInputError, match="plan3d/plan/v2"):
        build_decoder(tiny_plan("1f1b", 1, (0, 2, 6)).to_dict())
    doc = plan_file(tmp_path, "c", tiny_plan("1f1b", 1, (0, 2, 6)))
    doc["engines"]["torch_pipelining"] = {"target": "x", "supported": False, "rule": "a rule"}
    with pytest.raises(PlanInputError, match="a rule"):
        engine_entry(doc)


# DeepSpeed's round trip (the exported files stepped by DeepSpeed 0.19.8 in bf16, what it runs
# read back and compared with plan.json): tests/test_engine_deepspeed.py
