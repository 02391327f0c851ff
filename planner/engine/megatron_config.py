"""megatron-core 0.13.1's own config objects built from an exported ``megatron_args.sh``, and what
they say Megatron runs (the CI check of the Megatron-LM core_r0.13 export,
tests/test_engine_megatron.py).

Megatron-LM's training arguments are not in the megatron-core package, so the file's flags are
turned into its argument namespace here by a table of the flags plan3d writes (their ``dest`` and
type as megatron/training/arguments.py declares them; an unknown flag fails, so a new exported
flag must be added here first), with the validate_args steps that change what reaches the config,
and then into the config the way ``core_transformer_config_from_args`` does (Megatron-LM
arguments.py, stored NVIDIA revision 000c4ac):

    for f in dataclasses.fields(config_class):
        if hasattr(args, f.name):
            kw_args[f.name] = getattr(args, f.name)
    ... kw_args['num_moe_experts'] = args.num_experts
    kw_args['num_layers_in_first_pipeline_stage']= args.decoder_first_pipeline_num_layers
    kw_args['num_layers_in_last_pipeline_stage']= args.decoder_last_pipeline_num_layers
    kw_args['fp8_param'] = args.fp8_param_gather
    if args.swiglu: kw_args['activation_func'] = F.silu; kw_args['gated_linear_unit'] = True
    if args.group_query_attention: kw_args['num_query_groups'] = args.num_query_groups
    else: kw_args['num_query_groups'] = None
    if args.rope_type is None: kw_args.pop('rope_type', None)
    if len(args.cp_comm_type) == 1: kw_args['cp_comm_type'] = args.cp_comm_type[0]

with ``config_class = MLATransformerConfig`` "if args.multi_latent_attention". The config's
``__post_init__`` validates it; :func:`read_back` then reports what megatron-core would build.
"""

from __future__ import annotations

import dataclasses
import re

from planner.launchers.megatron import megatron_words

# flag -> (dest, kind) as arguments.py declares them; kind: int, float, str, true (store_true),
# false (store_false), freq (moe_freq_type), list (nargs='+' of str)
FLAGS = {
    "--tensor-model-parallel-size": ("tensor_model_parallel_size", "int"),
    "--pipeline-model-parallel-size": ("pipeline_model_parallel_size", "int"),
    "--context-parallel-size": ("context_parallel_size", "int"),
    "--cp-comm-type": ("cp_comm_type", "list"),
    "--sequence-parallel": ("sequence_parallel", "true"),
    "--num-layers-per-virtual-pipeline-stage": ("num_layers_per_virtual_pipeline_stage", "int"),
    "--num-virtual-stages-per-pipeline-rank": ("num_virtual_stages_per_pipeline_rank", "int"),
    "--decoder-first-pipeline-num-layers": ("decoder_first_pipeline_num_layers", "int"),
    "--decoder-last-pipeline-num-layers": ("decoder_last_pipeline_num_layers", "int"),
    "--pipeline-model-parallel-layout": ("pipeline_model_parallel_layout", "str"),
    "--micro-batch-size": ("micro_batch_size", "int"),
    "--global-batch-size": ("global_batch_size", "int"),
    **{f"--{k.replace('_', '-')}": (k, "int") for k in (
        "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
        "mtp_num_layers", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
        "v_head_dim", "num_experts", "moe_router_topk", "moe_ffn_hidden_size",
        "moe_shared_expert_intermediate_size", "moe_router_num_groups", "moe_router_group_topk",
        "expert_model_parallel_size", "expert_tensor_parallel_size", "ffn_hidden_size",
        "seq_length", "max_position_embeddings", "rotary_base", "make_vocab_size_divisible_by",
        "recompute_num_layers")},
    **{f"--{k.replace('_', '-')}": (k, "float") for k in (
        "moe_aux_loss_coeff", "rope_scaling_factor", "rotary_scaling_factor", "mscale",
        "mscale_all_dim", "attention_dropout", "hidden_dropout")},
    **{f"--{k.replace('_', '-')}": (k, "str") for k in (
        "moe_router_score_function", "moe_router_load_balancing_type",
        "moe_token_dispatcher_type", "normalization", "position_embedding_type", "rope_type",
        "recompute_granularity", "recompute_method", "attention_backend", "fp8_recipe")},
    **{f"--{k.replace('_', '-')}": (k, "true") for k in (
        "group_query_attention", "add_qkv_bias", "qk_layernorm", "multi_latent_attention",
        "moe_router_enable_expert_bias", "moe_grouped_gemm", "swiglu", "use_rope_scaling",
        "untie_embeddings_and_output_weights", "use_distributed_optimizer", "bf16", "fp16",
        "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "fp8_param_gather")},
    "--moe-layer-freq": ("moe_layer_freq", "freq"),
    "--disable-bias-linear": ("add_bias_linear", "false"),
    "--fp8-format": ("fp8", "str"),  # "dest='fp8'"
}

# Megatron-LM's argparse defaults for the names read here, where a default reaches the config
# (a name the namespace lacks keeps megatron-core's own default, as hasattr() skips it).
DEFAULTS = dict(
    tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
    cp_comm_type=["p2p"], sequence_parallel=False, num_layers_per_virtual_pipeline_stage=None,
    num_virtual_stages_per_pipeline_rank=None, decoder_first_pipeline_num_layers=None,
    decoder_last_pipeline_num_layers=None, pipeline_model_parallel_layout=None,
    group_query_attention=False, num_query_groups=1, num_experts=None, swiglu=False,
    add_bias_linear=True, add_qkv_bias=False, rope_type=None, multi_latent_attention=False,
    q_lora_rank=None, kv_lora_rank=32, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128,
    rotary_scaling_factor=1.0, mscale=1.0, mscale_all_dim=0.0, rotary_base=10000,
    moe_router_topk=2, moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=0.0,
    moe_token_dispatcher_type="allgather", expert_model_parallel_size=1,
    expert_tensor_parallel_size=None, fp8=None, fp8_recipe="delayed", fp8_param_gather=False,
    bf16=False, fp16=False, recompute_granularity=None, recompute_method=None,
    recompute_num_layers=None, attention_backend="auto", use_distributed_optimizer=False,
    moe_grouped_gemm=False, overlap_grad_reduce=False, overlap_param_gather=False,
    overlap_p2p_comm=True)  # "'--no-overlap-p2p-communication', action='store_false'"


def _freq(text: str):
    """moe_freq_type: an int, or a list expression of digits, [ ] ( ) + * and commas."""
    if re.search(r"[^,\d\[\]\(\)\+\*]", text):
        raise ValueError(f"--moe-layer-freq {text!r} is not a list expression")
    return eval(text, {"__builtins__": {}}) if "[" in text else int(text)  # noqa: S307


def namespace(text: str) -> dict:
    """The exported file's arguments as Megatron-LM's parser would set them."""
    words, args, i = megatron_words(text), dict(DEFAULTS), 0
    while i < len(words):
        flag = words[i]
        if flag not in FLAGS:
            raise KeyError(f"{flag}: not a flag this check knows; add it to FLAGS")
        dest, kind = FLAGS[flag]
        if kind in ("true", "false"):
            args[dest], i = kind == "true", i + 1
            continue
        value = words[i + 1]
        args[dest] = {"int": int, "float": float, "str": str, "freq": _freq,
                      "list": lambda v: [v]}[kind](value)
        i += 2
    return _validated(args)


def _validated(args: dict) -> dict:
    """The validate_args steps whose results reach the config (arguments.py, quoted)."""
    pp = args["pipeline_model_parallel_size"]
    # "if args.expert_tensor_parallel_size is None: args.expert_tensor_parallel_size =
    # args.tensor_model_parallel_size"
    if args["expert_tensor_parallel_size"] is None:
        args["expert_tensor_parallel_size"] = args["tensor_model_parallel_size"]
    # "if args.add_bias_linear: args.add_qkv_bias = True"
    if args["add_bias_linear"]:
        args["add_qkv_bias"] = True
    # layout: "args.virtual_pipeline_model_parallel_size = num_stages // ...size"; else
    # "num_layers_per_pipeline_stage // args.num_layers_per_virtual_pipeline_stage", or
    # "args.num_virtual_stages_per_pipeline_rank"; "if ... == 1: ... = None"
    layout, per_vp = args["pipeline_model_parallel_layout"], \
        args["num_layers_per_virtual_pipeline_stage"]
    vp = None
    if layout is not None:
        vp = layout.count("|") + 1
        assert vp % pp == 0, "layout length must be divisible by pp"
        vp //= pp
    elif per_vp is not None:
        assert args["decoder_first_pipeline_num_layers"] is None
        vp = args["num_layers"] // pp // per_vp
    elif args["num_virtual_stages_per_pipeline_rank"] is not None:
        vp = args["num_virtual_stages_per_pipeline_rank"]
    args["virtual_pipeline_model_parallel_size"] = vp if vp and vp > 1 else None
    if vp and vp > 1:  # "if args.overlap_p2p_comm: assert args.pipeline_model_parallel_size > 1
        # ... else: assert args.pipeline_model_parallel_size > 2"
        assert pp > (1 if args["overlap_p2p_comm"] else 2), "interleaved schedule needs more pp"
    else:  # "Overlap P2P communication is disabled if not using the interleaved schedule."
        args["overlap_p2p_comm"] = False
    # "assert args.max_position_embeddings >= args.seq_length"
    assert args["max_position_embeddings"] >= args["seq_length"]
    if args["recompute_granularity"] == "selective":
        assert args["recompute_method"] is None
    if args["overlap_param_gather"]:
        assert args["use_distributed_optimizer"] and args["overlap_grad_reduce"]
    if args["expert_model_parallel_size"] > 1:
        assert args["num_experts"] % args["expert_model_parallel_size"] == 0
    if args["moe_grouped_gemm"]:  # "Currently GroupedGEMM for MoE only supports bf16 dtype."
        assert args["bf16"]
    import torch
    # "args.params_dtype = torch.float ... if args.bf16: args.params_dtype = torch.bfloat16"
    args["params_dtype"] = torch.bfloat16 if args["bf16"] else (
        torch.half if args["fp16"] else torch.float)
    return args


def transformer_config(text: str):
    """megatron-core 0.13.1's TransformerConfig (MLATransformerConfig for MLA) for the file."""
    import torch.nn.functional as F
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    args = namespace(text)
    _one_process_group()
    cls = MLATransformerConfig if args["multi_latent_attention"] else TransformerConfig
    kw = {f.name: args[f.name] for f in dataclasses.fields(cls) if f.name in args}
    kw.update(num_moe_experts=args["num_experts"], fp8_param=args["fp8_param_gather"],
              num_layers_in_first_pipeline_stage=args["decoder_first_pipeline_num_layers"],
              num_layers_in_last_pipeline_stage=args["decoder_last_pipeline_num_layers"],
              pipeline_dtype=args["params_dtype"], deallocate_pipeline_outputs=True,
              num_query_groups=args["num_query_groups"] if args["group_query_attention"]
              else None,
              # '--attention-backend', type=lambda attn_backend: AttnBackend[attn_backend]
              attention_backend=AttnBackend[args["attention_backend"]])
    if args["swiglu"]:
        kw.update(activation_func=F.silu, gated_linear_unit=True)
    if args["rope_type"] is None:
        kw.pop("rope_type", None)
    if len(args["cp_comm_type"]) == 1:
        kw["cp_comm_type"] = args["cp_comm_type"][0]
    return cls(**kw), args


def _one_process_group() -> None:
    """A one-rank gloo group: PipelineParallelLayerLayout.from_str logs under "if
    torch.distributed.get_rank() == 0:", which needs a default process group."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def chunk_blocks(config) -> list[int]:
    """Transformer blocks megatron-core builds in each model chunk, in model order (chunk c is
    rank c % pp, virtual stage c // pp), by its own get_num_layers_to_build."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    pp = config.pipeline_model_parallel_size
    vp = config.virtual_pipeline_model_parallel_size
    out = []
    try:
        ps.set_pipeline_model_parallel_world_size(pp)
        ps.set_virtual_pipeline_model_parallel_world_size(vp)
        for c in range(pp * (vp or 1)):
            ps.set_pipeline_model_parallel_rank(c % pp)
            out.append(get_num_layers_to_build(config, vp_stage=c // pp if vp else None))
    finally:
        ps.set_pipeline_model_parallel_world_size(None)
        ps.set_virtual_pipeline_model_parallel_world_size(None)
        ps.set_pipeline_model_parallel_rank(None)
    return out


def recomputed(config, blocks: int) -> int:
    """Blocks one chunk of ``blocks`` recomputes in full (transformer_block.py
    _checkpointed_forward: uniform checkpoints "custom(layer_idx, layer_idx +
    self.config.recompute_num_layers)" over every layer; block "layer_idx <
    self.config.recompute_num_layers"; selective and none recompute no whole block)."""
    if config.recompute_granularity != "full":
        return 0
    return blocks if config.recompute_method == "uniform" else min(blocks,
                                                                   config.recompute_num_layers)


def read_back(text: str) -> dict:
    """What megatron-core would run for the file, read from its validated config objects."""
    from megatron.core.distributed import DistributedDataParallelConfig

    cfg, args = transformer_config(text)
    ddp = DistributedDataParallelConfig(**{f.name: args[f.name] for f in
                                           dataclasses.fields(DistributedDataParallelConfig)
                                           if f.name in args})
    blocks = chunk_blocks(cfg)
    out = dict(
        config=type(cfg).__name__, tp=cfg.tensor_model_parallel_size,
        pp=cfg.pipeline_model_parallel_size, v=cfg.virtual_pipeline_model_parallel_size or 1,
        cp=cfg.context_parallel_size, ep=cfg.expert_model_parallel_size,
        etp=cfg.expert_tensor_parallel_size, sequence_parallel=cfg.sequence_parallel,
        recompute=(cfg.recompute_granularity, cfg.recompute_method, cfg.recompute_num_layers),
        stage_blocks=blocks, recomputed=[recomputed(cfg, b) for b in blocks],
        bf16=cfg.bf16, fp8=cfg.fp8, fp8_recipe=cfg.fp8_recipe, fp8_param=cfg.fp8_param,
        distributed_optimizer=ddp.use_distributed_optimizer,
        overlap_grad_reduce=ddp.overlap_grad_reduce, num_experts=cfg.num_moe_experts,
        topk=cfg.moe_router_topk, balancing=cfg.moe_router_load_balancing_type,
        aux_loss=cfg.moe_aux_loss_coeff, grouped_gemm=cfg.moe_grouped_gemm)
    if out["config"] == "MLATransformerConfig":
        out.update(rope_type=cfg.rope_type, rotary_scaling_factor=cfg.rotary_scaling_factor,
                   original_max_positions=cfg.max_position_embeddings, beta_fast=cfg.beta_fast,
                   beta_slow=cfg.beta_slow, mscale=cfg.mscale, mscale_all_dim=cfg.mscale_all_dim)
    return out
