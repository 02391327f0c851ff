"""Exports for the engines' current releases: torchtitan 0.2.2 TOML (flavor,
ZeRO -> FSDP2 reshard policy, schedule classes), DeepSpeed's public partition method and its
1F1B-only rule, and launch.sh handing framework arguments only to the framework's entry point.

When torchtitan is importable the exported TOML is parsed by its own ConfigManager; otherwise the
golden files stand in.
"""

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import engine_module

from planner.core.fileset import MANIFEST
from planner.launchers import ExportError, export_plan, render_all
from planner.launchers import deepspeed, torchtitan
from planner.model.presets import PRESETS
from planner.stack import load_stack
from test_export import GOLDEN, UPDATE, make_plan


def titan(**change):
    return make_plan(**{"zero": 2, **change})


def ddp():
    """A plan Megatron and torchtitan 0.2.2 both run: ZeRO-0 as 1-D data parallelism (DDP)."""
    return titan(zero=0, tp=1, pp=1, dp=16, sequence_parallel=False, bounds=(0, 34))


def test_torchtitan_02_golden():
    text = torchtitan.render(titan())["torchtitan.toml"]
    path = GOLDEN / "torchtitan.toml"
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text()
    assert "module_fqns_per_model_part = [[\"tok_embeddings\", \"layers.0\"" in text
    assert '"norm", "output"]]' in text and "split_points" not in text


@pytest.mark.parametrize("zero,pp,dp,shard,replicate,reshard", [
    (3, 1, 8, 8, 1, "always"), (3, 4, 2, 2, 1, "default"), (2, 4, 2, 2, 1, "never"),
    (0, 1, 16, 1, 16, None)])
def test_torchtitan_zero_maps_to_fsdp2(zero, pp, dp, shard, replicate, reshard):
    """Under pipelining ZeRO-3 runs torchtitan's "default" (no reshard with PP), as the
    torchtitan stack prices it (zero3_pipeline_hold); without PP it reshards after forward."""
    bounds = (0, 8, 17, 26, 34) if pp == 4 else (0, 34)
    tp = 16 // (pp * dp)  # ZeRO-0 is 1-D DDP in torchtitan 0.2.2: tp = pp = 1
    entry = torchtitan.entry(titan(zero=zero, pp=pp, dp=dp, tp=tp, sequence_parallel=tp > 1,
                                   bounds=bounds))
    assert entry["supported"], entry
    assert entry["data_parallel_shard_degree"] == shard
    assert entry["data_parallel_replicate_degree"] == replicate
    assert entry.get("fsdp_reshard_after_forward") == reshard


@pytest.mark.parametrize("change,phrase", [
    (dict(zero=1), "no ZeRO-1"),
    (dict(zero=0), "DDP"),
    (dict(schedule="zb-h1"), "at least 2 stages per rank"),
    (dict(schedule="interleaved", virtual_stages=2, num_microbatches=9,
          bounds=(0, 5, 9, 13, 17, 21, 25, 29, 34)), "divisible by max"),
])
def test_torchtitan_refusals(tmp_path, change, phrase):
    with pytest.raises(ExportError, match=phrase):
        export_plan(titan(**change), ["torchtitan"], tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_torchtitan_refuses_unmatched_flavor(tmp_path):
    plan = replace(titan(), model=replace(PRESETS["llama3-8b"], ffn_hidden_size=14000))
    with pytest.raises(ExportError, match="no Llama 3 or Qwen3 flavor"):
        export_plan(plan, ["torchtitan"], tmp_path)
    assert "SET-ME" not in torchtitan.__doc__


def test_solve_for_torchtitan_refuses_a_model_without_flavor_before_searching(tmp_path,
                                                                              monkeypatch):
    """No configuration of llama2-7b runs on torchtitan (no flavor has its shape): the solve
    says so in one line before any search, writes nothing, and the API refuses alike."""
    from typer.testing import CliRunner

    import planner
    import planner.api.solving as solving
    from cli import app

    def no_search(*a, **k):
        raise AssertionError("searched a model torchtitan cannot build")

    monkeypatch.setattr(solving, "search", no_search)  # the CLI's search and the API's
    out = tmp_path / "out"
    for args in (["--export", "torchtitan", "--out", str(out)], ["--launcher", "torchtitan"]):
        res = CliRunner().invoke(app, ["solve", "--gpus", "16", "--nodes", "2", "--model",
                                       "llama2-7b", *args])
        assert res.exit_code == 2 and "no Llama 3 or Qwen3 flavor" in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert not out.exists()
    with pytest.raises(ExportError, match="no Llama 3 or Qwen3 flavor"):
        planner.solve(gpus=16, nodes=2, model="llama2-7b", launcher="torchtitan")


def test_torchtitan_schedule_classes():
    inter = titan(bounds=(0, 5, 9, 13, 17, 21, 25, 29, 34), virtual_stages=2,
                  schedule="interleaved")
    assert torchtitan.entry(inter)["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert len(torchtitan.entry(inter)["module_fqns_per_model_part"]) == 8
    zb = replace(inter, parallel=replace(inter.parallel, schedule="zb-h1"))
    assert torchtitan.entry(zb)["pipeline_parallel_schedule"] == "InterleavedZeroBubble"
    assert torchtitan.entry(titan(schedule="gpipe"))["pipeline_parallel_schedule"] == "GPipe"


def test_torchtitan_parses_the_export(tmp_path):
    engine_module("torchtitan", reason="torchtitan is not installed; the golden files stand in "
                  "for its parser")
    from torchtitan.config.manager import ConfigManager

    plan = replace(titan(recompute="full"), stack=load_stack("torchtitan"))
    (tmp_path / "t.toml").write_text(torchtitan.render(plan)["torchtitan.toml"])
    cfg = ConfigManager().parse_args(["--job.config_file", str(tmp_path / "t.toml")])
    assert cfg.model.flavor == "8B" and cfg.activation_checkpoint.mode == "full"
    p = cfg.parallelism
    assert (p.tensor_parallel_degree, p.pipeline_parallel_degree, p.data_parallel_shard_degree,
            p.data_parallel_replicate_degree) == (2, 4, 2, 1)
    assert p.fsdp_reshard_after_forward == "never" and p.pipeline_parallel_schedule == "1F1B"
    assert [len(part) for part in p.module_fqns_per_model_part] == [8, 9, 9, 9]
    assert cfg.training.local_batch_size == 16 and cfg.training.global_batch_size == 32
    assert cfg.training.mixed_precision_reduce == "float32"
    assert cfg.compile.enable is plan.stack.fused_elementwise


def test_torchtitan_refuses_a_stack_it_cannot_run(tmp_path):
    from planner.stack import with_overrides

    stack = with_overrides(load_stack("torchtitan"), grad_dtype="bf16")
    with pytest.raises(ExportError, match="float32 only"):
        export_plan(replace(titan(), stack=stack), ["torchtitan"], tmp_path)


# --- DeepSpeed -------------------------------------------------------------------------------

# deepspeed.runtime.utils.partition_balanced (DeepSpeed 0.19.8) on [0] + [1] * blocks + [0]
# (type: weights of embedding, blocks, head), run with DeepSpeed's own code.
DS_BALANCED = [
    (32, 4, [0, 9, 17, 25, 34]),
    (32, 8, [0, 5, 9, 13, 17, 21, 25, 29, 34]),
    (30, 4, [0, 9, 17, 24, 32]),
    (4, 2, [0, 3, 6]),
    (6, 4, [0, 3, 5, 6, 8]),
    (3, 4, [0, 2, 3, 4, 5]),
    (80, 8, [0, 11, 21, 31, 41, 51, 61, 71, 82]),
]


@pytest.mark.parametrize("blocks,parts,expect", DS_BALANCED)
def test_deepspeed_balanced_parts_match_deepspeed(blocks, parts, expect):
    assert deepspeed.balanced_parts([0] + [1] * blocks + [0], parts) == expect


def test_deepspeed_uniform_and_tiny_cases():
    # partition_uniform(3, 5) and partition_uniform(10, 4), as DeepSpeed 0.19.8 returns them
    assert deepspeed.uniform_parts(3, 5) == [0, 1, 2, 3, 3, 3]
    assert deepspeed.uniform_parts(10, 4) == [0, 3, 6, 8, 10]
    assert deepspeed.balanced_parts([1, 0, 1, 1, 0], 3) == [0, 2, 3, 5]


def test_deepspeed_public_partition_method_when_it_reproduces_the_split():
    even = make_plan(bounds=(0, 9, 17, 25, 34))
    assert deepspeed.partition_method(even) == "type:Block"
    text = deepspeed.render(even)["deepspeed_pipeline.py"]
    assert "partition_method=PARTITION_METHOD" in text and "_partition_layers" not in text
    uneven = make_plan()  # (0, 8, 17, 26, 34): not DeepSpeed's balanced split
    assert deepspeed.partition_method(uneven) is None
    assert "def _partition_layers" in deepspeed.render(uneven)["deepspeed_pipeline.py"]
    compile(text, "deepspeed_pipeline.py", "exec")


def test_deepspeed_config_has_an_optimizer():
    cfg = json.loads(deepspeed.render(make_plan())["ds_config.json"])
    assert cfg["optimizer"]["type"] == "AdamW" and cfg["optimizer"]["params"]["lr"] > 0


# --- torchrun ------------------------------------------------------------------------------

def test_torchrun_refuses_two_frameworks(tmp_path):
    with pytest.raises(ExportError, match="not both"):
        export_plan(ddp(), ["megatron", "torchtitan", "torchrun"], tmp_path)
    assert list(tmp_path.iterdir()) == []
    render_all(ddp(), ["megatron", "torchtitan"])  # without launch.sh they may coexist


def _run_launch(directory: Path, **env) -> list[str]:
    fake = directory / "bin" / "torchrun"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    full = {"PATH": f"{fake.parent}:{os.environ['PATH']}", "MASTER_ADDR": "node0", **env}
    done = subprocess.run(["bash", str(directory / "launch.sh")], env=full, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:-1]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_launch_sh_framework_args_only_to_the_framework(tmp_path):
    export_plan(titan(), ["torchtitan", "torchrun"], tmp_path)
    out = _run_launch(tmp_path, TRAIN_ARGS="--training.steps 5")
    at = out.index("-m")
    assert out[at:at + 4] == ["-m", "torchtitan.train", "--job.config_file",
                              str(tmp_path / "torchtitan.toml")]
    assert out[-2:] == ["--training.steps", "5"]
    mine = _run_launch(tmp_path, TRAIN_SCRIPT="my_train.py", TRAIN_ARGS="--lr 1")
    assert mine[-3:] == ["my_train.py", "--lr", "1"] and "--job.config_file" not in mine


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_launch_sh_refuses_two_frameworks_beside_it(tmp_path):
    export_plan(ddp(), ["megatron", "torchrun"], tmp_path)
    # export sets replace each other whole, so a second framework arrives only by hand
    (other,) = export_plan(ddp(), ["torchtitan"], tmp_path / "other")
    shutil.copy(other, tmp_path / other.name)

    def launch():
        return subprocess.run(["bash", str(tmp_path / "launch.sh")], capture_output=True,
                              text=True, env={"PATH": os.environ["PATH"], "MASTER_ADDR": "n0"})

    # a framework file its manifest does not list: not the export set launch.sh belongs to
    done = launch()
    assert done.returncode == 1 and "export set incomplete or modified" in done.stderr
    # listed by hand too: the set checks out, and launch.sh still runs one framework
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    manifest["files"][other.name] = hashlib.sha256(other.read_bytes()).hexdigest()
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    done = launch()
    assert done.returncode == 2 and "keep one framework" in done.stderr
