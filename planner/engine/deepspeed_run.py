"""A DeepSpeed export run as exported: the reference decoder as the flat layer list
``deepspeed.pipe.PipelineModule`` takes, split by the exported ``deepspeed_pipeline.py`` (pp > 1)
or checkpointed by ``deepspeed_recompute.py`` (pp = 1, full recompute), and stepped twice by
``deepspeed.initialize`` with the exported ds_config.json, unchanged (bf16 on), on gloo CPU
processes. What the engine then runs is read back from it (:func:`run_deepspeed`).

No CPU shim: the exported ``AdamW`` builds DeepSpeed's FusedAdam, which on the CPU accelerator
is a C++ op DeepSpeed compiles once (op_builder/cpu/fused_adam.py) into the torch extensions
cache, as it does its shared-memory collectives (deepspeed_shm_comm) at init_distributed.

One module per plan layer, in plan order, each with one tensor in and one out: the embedding
(token ids to hidden states), the blocks (class ``Block``, the name the DeepSpeed export's
``partition_method='type:Block'`` matches) and the head (final norm and output projection). No
other layer class name contains "block", so the type: method weighs exactly the blocks.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torch import nn

from planner.engine.exported import PLAN, plan_document, read_documents
from planner.engine.torch_model import Decoder, build_decoder, loss_fn
from planner.engine.torch_run import batch

__all__ = ["Block", "EmbeddingLayer", "HeadLayer", "layer_list", "run_deepspeed"]


class EmbeddingLayer(nn.Module):
    def __init__(self, model: Decoder):
        super().__init__()
        self.tok_embeddings = model.tok_embeddings
        self.pos_embeddings = model.pos_embeddings
        self.embedding_norm = model.embedding_norm

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        if self.pos_embeddings is not None:
            x = x + self.pos_embeddings(torch.arange(tokens.shape[1]))
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        return x


class Block(nn.Module):
    """One transformer block with the model's RoPE tables."""

    def __init__(self, model: Decoder, index: str):
        super().__init__()
        self.block = model.layers[index]
        self.rope = model.rope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x, self.rope)


class HeadLayer(nn.Module):
    def __init__(self, model: Decoder):
        super().__init__()
        self.norm = model.norm
        self.output = model.output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.norm(x))


def layer_list(doc: dict, seed: int = 0, dtype: torch.dtype = torch.float32) -> list[nn.Module]:
    """The plan's layers as modules (built by :func:`build_decoder` from the same seed)."""
    model = build_decoder(doc, seed, dtype)
    return [EmbeddingLayer(model), *(Block(model, i) for i in model.layers), HeadLayer(model)]


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _count_calls(layers: list[nn.Module]) -> list[int]:
    """Per layer, the calls of its first submodule since the last reset: a checkpointed layer
    runs its forward again in the backward (reentrant CheckpointFunction.backward reruns the
    function), so it counts twice per microbatch."""
    counts = [0] * len(layers)
    for index, layer in enumerate(layers):
        def hook(*_, index=index):
            counts[index] += 1
        next(layer.children()).register_forward_hook(hook)
    return counts


def _model(directory: Path, layers: list[nn.Module]) -> nn.Module:
    """The exported model: the pipeline file's PipelineModule, or the layers in a row with the
    recompute file's checkpointing applied."""
    if (directory / "deepspeed_pipeline.py").exists():
        return _load(directory / "deepspeed_pipeline.py").planned_pipeline_module(layers, loss_fn)
    if (directory / "deepspeed_recompute.py").exists():
        _load(directory / "deepspeed_recompute.py").checkpoint_blocks(layers)
    return nn.Sequential(*layers)


def _dtype(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}[dtype]


def _step(engine, pipelined: bool, tokens: torch.Tensor, targets: torch.Tensor,
          size: int) -> float:
    """One optimizer step over the rank's microbatches; the mean loss."""
    pairs = list(zip(tokens.split(size), targets.split(size)))
    if pipelined:
        return float(engine.train_batch(iter(pairs)))
    losses = []
    for x, y in pairs:
        loss = loss_fn(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    return sum(losses) / len(losses)


def _run(directory: Path, dp_rank: int) -> dict:
    import deepspeed

    files = read_documents(directory, (PLAN, "ds_config.json"))  # one verified export set
    doc, config = files[PLAN], files["ds_config.json"]
    layers = layer_list(doc)
    counts = _count_calls(layers)
    model = _model(directory, layers)
    engine, *_ = deepspeed.initialize(model=model, config=config,
                                      model_parameters=list(model.parameters()))
    pipelined = hasattr(model, "parts")
    tokens, targets = batch(doc, seed=1 + dp_rank)
    size = config["train_micro_batch_size_per_gpu"]
    losses = []
    for _ in range(2):
        counts[:] = [0] * len(counts)
        losses.append(_step(engine, pipelined, tokens, targets, size))
    opt = engine.optimizer
    accum = getattr(opt, "grad_acc_dtype", None) or getattr(
        opt, "gradient_accumulation_dtype", None) or engine.get_data_types()[1]
    out = {"zero": engine.zero_optimization_stage(), "bf16": engine.bfloat16_enabled(),
           "optimizer": type(opt).__name__, "grad_accum_dtype": _dtype(accum),
           "micro_batch": engine.train_micro_batch_size_per_gpu(),
           "accumulation_steps": engine.gradient_accumulation_steps(),
           "parts": [int(p) for p in model.parts] if pipelined else None,
           "interval": getattr(model, "activation_checkpoint_interval", None),
           "checkpointable": getattr(model, "checkpointable_layers", None),
           "calls": list(counts), "losses": losses}
    engine.destroy()
    return out


def _worker(rank: int, export_dirs: list[str], workdir: str, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    plans = [plan_document(d)["parallel"] for d in export_dirs]
    # pp = 1 exports first: a pipeline engine leaves its grid as DeepSpeed's global mpu
    # (engine.py _configure_distributed_model: "groups.mpu = self.mpu"), which a later
    # non-pipeline engine would take for its model-parallel groups
    order = sorted(range(len(plans)), key=lambda i: plans[i]["pp"] > 1)
    results = [None] * len(plans)
    for i in order:  # DeepSpeed's ranks are pipe-major: the DP rank is rank % dp
        results[i] = _run(Path(export_dirs[i]), dp_rank=rank % plans[i]["dp"])
    torch.save(results, os.path.join(workdir, f"rank{rank}.pt"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _merge(per_rank: list[dict]) -> dict:
    """One export's readings over its ranks: the engine's settings (equal on every rank),
    each layer's calls on the rank that holds it, every rank's losses."""
    out = dict(per_rank[0])
    out["calls"] = [max(c) for c in zip(*(r["calls"] for r in per_rank))]
    out["losses"] = [r["losses"] for r in per_rank]
    for key in ("zero", "bf16", "optimizer", "grad_accum_dtype", "micro_batch",
                "accumulation_steps", "parts", "interval", "checkpointable"):
        if any(r[key] != out[key] for r in per_rank):
            raise RuntimeError(f"DeepSpeed ranks disagree on {key}")
    return out


def run_deepspeed(export_dirs: list[Path], workdir: Path, world: int = 2) -> list[dict]:
    """What DeepSpeed ran for each export directory (json and deepspeed targets, every plan on
    ``world`` GPUs), read back after two steps: ZeRO stage, bf16, optimizer wrapper class and
    its gradient accumulation dtype, micro-batch and accumulation steps, the PipelineModule's
    parts, checkpoint interval and checkpointable layers, the calls of every layer in the
    second step (a checkpointed layer runs twice per microbatch) and the losses."""
    port = _free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=([str(d) for d in export_dirs], str(workdir), world, port),
             nprocs=world, join=True)
    ranks = [torch.load(workdir / f"rank{r}.pt") for r in range(world)]
    return [_merge(list(runs)) for runs in zip(*ranks)]
