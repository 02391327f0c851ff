"""One training step of torchtitan 0.2.2's own trainer (``torchtitan.train.Trainer``) on gloo CPU
processes, with the exported ``torchtitan.toml`` unchanged, and what the trainer built read back.

The export is passed as a user passes it, ``--job.config_file torchtitan.toml``, plus the
overrides a user also passes (``--model.hf_assets_path``, ``--training.dataset_path``,
``--training.steps``, ``--job.dump_folder``). Test-harness shims, none of them an edit to the
export: the device type (torchtitan/tools/utils.py 'device_type =
_get_available_device_type() or "cuda"', which is None on a CPU-only torch) is made "cpu" with a
stand-in device module for its memory monitor; the process group is gloo, created before the
trainer ('if torch.distributed.is_initialized(): logger.warning("torch.distributed is already
initialized. Skipping init_distributed. ...")', distributed/utils.py init_distributed); the
attention needs none (models/attention.py ScaledDotProductAttentionWrapper lists
'SDPBackend.MATH', which runs on CPU); the tokenizer and dataset are generated here (the wheel
ships neither: Model.hf_assets_path defaults to './tests/assets/tokenizer').
"""

from __future__ import annotations

import json
import os
import random
import socket
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.multiprocessing as mp

from planner.engine.exported import PLAN, plan_document, read_export

VOCAB = 2048  # torchtitan's debugmodel: 'vocab_size=2048'
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def write_assets(root: Path, lines: int = 64, words: int = 256) -> tuple[Path, Path]:
    """A word-level tokenizer of exactly VOCAB ids and a JSON-lines text dataset of its words."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {BOS: 0, EOS: 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=EOS))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok_dir, data_dir = root / "tokenizer", root / "data"
    tok_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(tok_dir / "tokenizer.json"))
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": True}))
    rng = random.Random(0)
    rows = [json.dumps({"text": " ".join(f"w{rng.randrange(2, VOCAB)}" for _ in range(words))})
            for _ in range(lines)]
    (data_dir / "train.json").write_text("\n".join(rows) + "\n")
    return tok_dir, data_dir


class _CpuDevice(SimpleNamespace):
    """What torchtitan calls on its device module (components/metrics.py DeviceMemoryMonitor:
    get_device_name, current_device, get_device_properties, memory_stats, ...), for a CPU."""

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    @staticmethod
    def get_device_name(device=None):
        return "cpu"

    @staticmethod
    def current_device():  # distributed/utils.py 'barrier(device_ids=[device_module.current_device()])'
        return 0

    @staticmethod
    def get_device_properties(device=None):
        return SimpleNamespace(total_memory=1 << 40)

    @staticmethod
    def memory_stats(device=None):
        return {"active_bytes.all.peak": 0, "reserved_bytes.all.peak": 0,
                "num_alloc_retries": 0, "num_ooms": 0}

    @staticmethod
    def reset_peak_memory_stats(device=None):
        return None

    @staticmethod
    def empty_cache():
        return None


def _cpu_shim() -> None:
    """Import torchtitan with device type "cpu" (see the module docstring)."""
    import torch._utils as tu

    saved = tu._get_available_device_type, tu._get_device_module
    tu._get_available_device_type = lambda: "cpu"
    tu._get_device_module = lambda kind=None: _CpuDevice()
    try:
        import torchtitan.tools.utils  # noqa: F401  (binds device_type, device_module)
        import torchtitan.train  # noqa: F401
    finally:
        tu._get_available_device_type, tu._get_device_module = saved


def _names(part: torch.nn.Module) -> list[str]:
    """The module FQNs a model part holds, as module_fqns_per_model_part names them."""
    out = []
    for name, child in part.named_children():
        out += [f"layers.{k}" for k in child.keys()] if name == "layers" else [name]
    return out


def _ac(block: torch.nn.Module) -> str:
    """none, full or selective: distributed/activation_checkpoint.py wraps a block with
    'ptd_checkpoint_wrapper(module, ...)' for full and with 'context_fn=
    selective_checkpointing_context_fn' for the op policy; CheckpointWrapper keeps them as
    'self.checkpoint_fn = partial(torch_utils_checkpoint, use_reentrant=False, ...)'."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    if not isinstance(block, CheckpointWrapper):
        return "none"
    return "selective" if "context_fn" in block.checkpoint_fn.keywords else "full"


def _fsdp(block: torch.nn.Module) -> dict | None:
    """FSDP2's settings on a block: reshard after forward (torch's FSDPParamGroup keeps
    'self.post_forward_mesh_info' None when it does not), param and reduce dtypes."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(block, FSDPModule):
        return None
    group = block._get_fsdp_state()._fsdp_param_group
    return {"reshard": group.post_forward_mesh_info is not None,
            "param_dtype": str(group.mp_policy.param_dtype),
            "reduce_dtype": str(group.mp_policy.reduce_dtype)}


def read_back(trainer) -> dict:
    """What the trainer built: mesh degrees, each stage's modules, AC and FSDP per block."""
    pd = trainer.parallel_dims
    if pd.pp_enabled:
        sched = trainer.pp_schedule
        stages = getattr(sched, "_stages", None) or [sched._stage]
        parts = [(s.stage_index, s.submod) for s in stages]
        schedule = {"class": type(sched).__name__, "n_microbatches": sched._n_microbatches}
    else:
        parts, schedule = [(0, trainer.model_parts[0])], None
    amp = trainer.maybe_enable_amp
    return {"tp": pd.tp, "pp": pd.pp, "dp_shard": pd.dp_shard, "dp_replicate": pd.dp_replicate,
            "schedule": schedule, "accumulation": trainer.gradient_accumulation_steps,
            "autocast": str(amp.fast_dtype) if isinstance(amp, torch.autocast) else None,
            "stages": {i: {"modules": _names(m),
                           "ac": {k: _ac(b) for k, b in m.layers.items()},
                           "fsdp": {k: _fsdp(b) for k, b in m.layers.items()}}
                       for i, m in parts}}


def _gloo_sum(trainer) -> None:
    """gloo has no PREMUL_SUM ('Cannot use ReduceOp.PREMUL_SUM with Gloo'), which FSDP2 picks
    for torchtitan's 'module.set_gradient_divide_factor(1.0)' (parallelize.py
    disable_fsdp_gradient_division; torch _fsdp_collectives.py _get_gradient_divide_factors
    'reduce_scatter_op = ReduceOp.PREMUL_SUM(1 / factor)'): the same sum, as SUM then times 1
    ('set_force_sum_reduction_for_comms': 'pre_factor, post_factor = None, factor')."""
    from torch.distributed.fsdp import FSDPModule

    for part in trainer.model_parts:
        for m in part.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)


def _one_step(directory: Path, assets: tuple[Path, Path], dump: Path) -> dict:
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import activation_checkpoint
    from torchtitan.train import Trainer

    activation_checkpoint._layer_sac_count = 0  # a fresh process per launch counts from 0
    config = ConfigManager().parse_args([
        "--job.config_file", str(directory / "torchtitan.toml"),
        "--model.hf_assets_path", str(assets[0]), "--training.dataset_path", str(assets[1]),
        "--training.steps", "1", "--job.dump_folder", str(dump)])
    trainer = Trainer(config)
    try:
        seen = read_back(trainer)
        _gloo_sum(trainer)
        rows = []
        first = [m for m in trainer.model_parts if getattr(m, "tok_embeddings", None) is not None]
        hooks = [m.register_forward_pre_hook(lambda _m, args: rows.append(args[0].shape[0]))
                 for m in first]
        trainer.train()
        for h in hooks:
            h.remove()
        # a part holding both ends: is the head's weight the embedding's after the step?
        # (qwen3/model/model.py 'self.output.weight = self.tok_embeddings.weight')
        tied = [m.output.weight is m.tok_embeddings.weight for m in first
                if getattr(m, "output", None) is not None]
        seen.update(step=trainer.step, microbatch_rows=rows, tied=tied, finite=all(
            bool(torch.isfinite(p.full_tensor() if hasattr(p, "full_tensor") else p).all())
            for m in trainer.model_parts for p in m.parameters()))
        return seen
    finally:
        trainer.close()


def _worker(rank: int, world: int, port: int, dirs: list[str], workdir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), HF_DATASETS_OFFLINE="1",
                      HF_HUB_OFFLINE="1")
    torch.set_num_threads(1)
    _cpu_shim()
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        assets = (Path(workdir) / "tokenizer", Path(workdir) / "data")
        out = [_one_step(Path(d), assets, Path(workdir) / f"dump{i}")
               for i, d in enumerate(dirs)]
        torch.save(out, os.path.join(workdir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torchtitan(export_dirs: list[Path], workdir: Path) -> list[list[dict]]:
    """Per export directory (json + torchtitan targets, all for the same world size), each
    rank's read back (``read_back`` plus step, microbatch_rows, tied, finite), in rank order."""
    workdir.mkdir(parents=True, exist_ok=True)
    write_assets(workdir)
    # each set complete and unedited before torchtitan reads its TOML, as launch.sh checks
    for d in export_dirs:
        read_export(d, (PLAN, "torchtitan.toml"))  # (a TOML file: read as text, not JSON)
    doc = plan_document(export_dirs[0])
    par = doc["parallel"]
    world = par["tp"] * par.get("cp", 1) * par["pp"] * par["dp"]
    mp.spawn(_worker, args=(world, _free_port(), [str(d) for d in export_dirs], str(workdir)),
             nprocs=world, join=True)
    ranks = [torch.load(workdir / f"rank{r}.pt") for r in range(world)]
    return [[r[i] for r in ranks] for i in range(len(export_dirs))]
