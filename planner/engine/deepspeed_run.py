"""A DeepSpeed export run for one step: the reference decoder as the flat layer list
``deepspeed.pipe.PipelineModule`` takes, split by the exported ``deepspeed_pipeline.py`` and
stepped by ``deepspeed.initialize`` with the exported ds_config.json on gloo CPU processes.

One module per plan layer, in plan order, each with one tensor in and one out: the embedding
(token ids to hidden states), the blocks (class ``Block``, the name the DeepSpeed export's
``partition_method='type:Block'`` matches) and the head (final norm and output projection). No
other layer class name contains "block", so the type: method weighs exactly the blocks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torch import nn

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


def _worker(rank: int, export_dirs: list[str], workdir: str, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    results = []
    for directory in map(Path, export_dirs):
        doc = json.loads((directory / "plan.json").read_text())
        split = _load(directory / "deepspeed_pipeline.py")
        if hasattr(split, "planned_pipeline_module"):  # the public type: partition method
            model = split.planned_pipeline_module(layer_list(doc), loss_fn)
        else:
            model = split.PlannedPipelineModule(layers=layer_list(doc),
                                                num_stages=split.NUM_STAGES, loss_fn=loss_fn)
        config = json.loads((directory / "ds_config.json").read_text())
        config["bf16"]["enabled"] = False  # CPU reference run in float32
        config["optimizer"]["params"]["torch_adam"] = True  # no fused CUDA Adam on CPU
        engine, *_ = deepspeed.initialize(model=model, config=config,
                                          model_parameters=list(model.parameters()))
        tokens, targets = batch(doc)
        size = config["train_micro_batch_size_per_gpu"]
        loss = engine.train_batch(iter(list(zip(tokens.split(size), targets.split(size)))))
        results.append(([int(p) for p in model.parts], float(loss)))
    torch.save(results, os.path.join(workdir, f"rank{rank}.pt"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_deepspeed(export_dirs: list[Path], workdir: Path) -> list[tuple]:
    """(stage boundaries DeepSpeed used, mean loss of the step) per export directory, each
    exported with json and deepspeed targets for the same pp (one process per stage)."""
    port = _free_port()
    world = json.loads((Path(export_dirs[0]) / "plan.json").read_text())["parallel"]["pp"]
    workdir.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=([str(d) for d in export_dirs], str(workdir), world, port),
             nprocs=world, join=True)
    return torch.load(workdir / "rank0.pt")
