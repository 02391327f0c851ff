"""Bytes a GPU holds: activations kept for the backward pass and the model states.

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", §4 and Table 2, written per tensor so that grouped KV heads, SwiGLU and any FFN width are
counted the same way the paper counts GPT (for a GPT block they reduce exactly to Table 2):
  no parallelism        s·b·h·(34 + 5as/h)
  tensor parallel t     s·b·h·(10 + 24/t + 5as/(ht))
  t + sequence parallel s·b·h·(34 + 5as/h)/t
  selective recompute   drops the 5as/h term (scores, softmax, dropout mask); Megatron's other
                        --recompute-modules drop what cost/recompute.py lists; torchtitan's
                        op-level policy keeps what cost/recompute.py op_kept_bytes counts
  full recompute        2·s·b·h per layer (the layer input), /t with sequence parallel
Flash attention never stores the s×s scores, so it drops the 5as/h term as selective recompute does.
A model trained without dropout (Llama, MPT: ``Layer.dropout`` False) keeps no masks: 2·sbh less
per block (the two residual-dropout masks), the a·s²·b score-dropout mask and its 2·a·s²·b output
(the softmax output feeds the values matmul directly: 2·a·s²·b kept instead of 5), and no mask on
the embedding. With dropout on, every formula is Korthikanti's.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost import mla, moe, recompute as modules
from planner.model.spec import Layer

ACT_BYTES = 2  # 16-bit activations
LOGIT_BYTES = 4  # the cross-entropy keeps fp32 logits (DESIGN.md §3), unless the stack's
# loss_dtype says bf16 (Shape.loss_bytes)


@dataclass(frozen=True)
class Shape:
    """How one layer runs: tensor-parallel degree, sequence parallel, micro-batch and sequence.

    ``seq_len`` is the tokens of one sequence this GPU holds: the whole sequence, or 1/cp of it
    under context parallelism (cost/context.py), whose ``cp`` ranks then exchange K/V over the
    NVLink domain, or over the network when the CP group leaves it (``cp_cross``)."""

    tp: int
    sp: bool
    micro_batch: int
    seq_len: int
    cp: int = 1
    cp_cross: bool = False
    # expert parallelism (cost/moe.py): EP and expert-TP degrees (etp 0: same as tp), the EP
    # group's members in one NVLink domain (0: all), the busiest GPU's routed load over the mean
    ep: int = 1
    etp: int = 0
    ep_in_domain: int = 0
    expert_load: float = 1.0
    # the stack's routing weights multiply the experts' activation (their outputs not kept)
    moe_probs_in_activation: bool = False
    # the stack's token dispatcher: "alltoall", or "deepep" (cost/moe.py deepep_s)
    moe_dispatcher: str = "alltoall"
    # how tokens pick their experts (cost/routing.py): "scores", or "round_robin"
    moe_routing: str = "scores"
    # the stack's modules a "selective" recompute recomputes (cost/recompute.py)
    recompute_modules: tuple[str, ...] = ("core_attn",)
    # bytes per logit of the loss's kept log-probabilities (the stack's loss_dtype)
    loss_bytes: int = LOGIT_BYTES
    # ZeRO-3 gathers the FP8 linear weights already in FP8: no forward weight cast
    # (cost/zero.py fp8_gathered, cost/precision.py)
    fp8_gathered: bool = False
    # bytes per parameter each microbatch's weight gradient is accumulated into at this ZeRO
    # stage (Stack.accumulation_bytes); None: the stack's at ZeRO-1
    accumulation_bytes: int | None = None
    # with SP, bytes per value of the all-gathered input each column-parallel linear keeps for
    # its backward (a stack whose TP is DTensor's: torchtitan; 1 where the blocks' linears run
    # FP8, cast before the gather); 0: the SP shard is kept and re-gathered (Megatron)
    sp_gathered_bytes: float = 0.0

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len

    @property
    def context(self) -> int:
        """Keys the queries of one sequence attend to: the whole sequence."""
        return self.seq_len * self.cp


def activation_bytes(layer: Layer, shape: Shape, recompute: str, flash: bool) -> float:
    """Bytes one microbatch leaves on this GPU between the layer's forward and its backward."""
    s, b, h, t = shape.seq_len, shape.micro_batch, layer.hidden_size, shape.tp
    sbh = s * b * h
    rep = 1 / t if shape.sp else 1.0  # tensors TP replicates, unless SP shards them
    if layer.kind == "embedding":
        # dropout mask on the embedding output (Korthikanti §4.3); nothing without dropout. An
        # embedding norm keeps its 16-bit input: recompute never covers the embedding (Megatron
        # checkpoints transformer layers only; DeepSpeed's GPTModelPipe likewise, pipe/module.py
        # ``_is_checkpointable``).
        mask = sbh if layer.dropout else 0.0
        return (mask + (ACT_BYTES * sbh if layer.embedding_norm else 0.0)) * rep
    if layer.kind == "linear":
        return ACT_BYTES * sbh * rep  # the input of the matmul
    if layer.kind == "head":
        # final norm input + output-projection input (16-bit; all-gathered where the stack
        # keeps SP's gathered inputs: _gathered_input) + the loss's log-probabilities (fp32,
        # or 16-bit where the stack's loss runs on the 16-bit logits).
        projection = ACT_BYTES * sbh * rep if not _keeps_gathered(shape) else ACT_BYTES * sbh
        return (ACT_BYTES * sbh * rep + projection
                + shape.loss_bytes * s * b * layer.padded_vocab(t) / t)
    if recompute == "full":
        return ACT_BYTES * sbh * rep
    if recompute == "selective" and modules.op_policy(shape):  # torchtitan's op-level SAC
        return modules.op_kept_bytes(layer, shape, flash)
    if recompute == "selective":
        scores = 0.0 if flash or modules.drops_scores(shape) else _scores_bytes(layer, shape)
        return _block_kept(layer, shape) + scores - modules.discarded_bytes(layer, shape)
    return _block_kept(layer, shape) + (0 if flash else _scores_bytes(layer, shape))


def _block_kept(layer: Layer, shape: Shape) -> float:
    """Korthikanti's tensors of a block other than the s×s scores (34·sbh for a GPT block)."""
    s, b, h, t = shape.seq_len, shape.micro_batch, layer.hidden_size, shape.tp
    sb = s * b
    q, kv = layer.q_size, layer.num_kv_heads * layer.head_dim  # q = h unless head_dim is set
    # Replicated across TP (sharded by SP): two norm inputs (4), QKV input (2), attention's
    # residual dropout mask (1, only with dropout) and the MLP's share (_mlp_kept).
    # Sharded by TP: Q and K (2h + 2kv), V (2kv), attention-output projection input (2h).
    replicated = (7 if layer.dropout else 6) * sb * h
    sharded = sb * (2 * q + 2 * kv + 2 * kv + 2 * q) / t
    if layer.is_mla:
        sharded = mla.kept_bytes(layer, sb, t)
    return replicated * (1 / t if shape.sp else 1.0) + sharded + _mlp_kept(layer, shape) \
        + _gathered_input(sb * h, shape)


def _mlp_kept(layer: Layer, shape: Shape) -> float:
    """The MLP's part of Korthikanti's tensors: its input (2·sbh) and residual dropout mask
    (sbh, only with dropout), replicated across TP unless SP; gelu keeps its input and the second
    matmul's input (2f + 2f), SwiGLU gate, up and their product (2f + 2f + 2f), sharded by TP."""
    sb, h, t = shape.seq_len * shape.micro_batch, layer.hidden_size, shape.tp
    replicated = (3 if layer.dropout else 2) * sb * h
    if layer.is_moe:  # router, routed copies and shared experts: cost/moe.py
        return replicated * (1 / t if shape.sp else 1.0) + moe.kept_bytes(layer, shape)
    mlp = (6 if layer.mlp == "swiglu" else 4) * layer.ffn_hidden_size
    return replicated * (1 / t if shape.sp else 1.0) + sb * mlp / t \
        + _gathered_input(sb * h, shape)


def sp_gathered_bytes(opts) -> float:
    """Shape.sp_gathered_bytes of a stack: 0 unless it keeps SP's gathered inputs, then 1 where
    its blocks' linears run FP8 (cast before the gather), else 2."""
    if not opts.sp_keeps_gathered:
        return 0.0
    return 1.0 if opts.precision == "fp8" else float(ACT_BYTES)


def _keeps_gathered(shape: Shape) -> bool:
    return shape.sp and shape.tp > 1 and shape.sp_gathered_bytes > 0


def _gathered_input(values: float, shape: Shape) -> float:
    """What a column-parallel linear keeps beyond Korthikanti's SP count (its 16-bit input
    sharded by SP, counted among the replicated tensors) when the stack keeps the all-gathered
    input instead (Shape.sp_gathered_bytes): the gathered ``values`` at that many bytes, less
    the shard already counted. torchtitan's TP plan redistributes the blocks' inputs from
    Shard(1) to Replicate() before the linears ('"attention": prepare_module_input(
    input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None))', and the same
    for "feed_forward"; parallelize_llama.py apply_tp), so autograd keeps the gathered tensor
    for the weight gradient; Megatron keeps the shard and gathers it again in the backward."""
    if not _keeps_gathered(shape):
        return 0.0
    return values * (shape.sp_gathered_bytes - ACT_BYTES / shape.tp)


def _scores_bytes(layer: Layer, shape: Shape) -> float:
    """Softmax output (2), its dropout mask (1) and dropout output (2) per score: 5·a·s²·b/t;
    without dropout only the softmax output: 2·a·s²·b/t."""
    a, s, b = layer.num_attention_heads, shape.seq_len, shape.micro_batch
    return (5 if layer.dropout else 2) * a * s * shape.context * b / shape.tp


def working_bytes(layer: Layer, shape: Shape, recompute: str, flash: bool) -> float:
    """Transient bytes while this layer runs its backward: with recompute, its rebuilt activations;
    always, the gradients of its widest tensors. For a block that is the larger of two moments:
    the MLP's backward (two hidden-size and two MLP-width gradients) and, without flash, the
    attention's, after the MLP has freed what it saved: the gradients of the s×s probabilities
    and scores, 16-bit, as the dropout and softmax backward write them. They live for one layer
    at a time, so a stage adds only its largest.

    Of the two hidden-size gradients one is whole even under sequence parallelism: where the
    backward enters the tensor-parallel region it all-gathers the SP-sharded gradient
    (Megatron-Core's _ReduceScatterToSequenceParallelRegion: "def backward(ctx, grad_output):
    ... return _gather_along_first_dim(grad_output, ...)", and where it leaves, the input
    gradient is whole until reduce-scattered (_GatherFromSequenceParallelRegion.backward:
    "return _reduce_scatter_along_first_dim(grad_output, ...)",
    megatron/core/tensor_parallel/mappings.py; DTensor's Shard(1) <-> Replicate redistributions
    under torchtitan's TP plan do the same): h·(1 + 1/t) hidden values instead of 2h/t."""
    s, b, h, t = shape.seq_len, shape.micro_batch, layer.hidden_size, shape.tp
    rep = 1 / t if shape.sp else 1.0
    hidden = h * (1 + rep)  # two hidden-size gradients, one whole (2h without SP)
    if layer.kind == "head":  # (its hidden-size gradients come after the loss's buffers,
        # cost/loss.py, are freed: kept at the two SP shards this sum has always counted)
        return ACT_BYTES * s * b * layer.padded_vocab(t) / t + 2 * ACT_BYTES * s * b * h * rep
    if layer.kind != "block":
        return ACT_BYTES * s * b * hidden
    # what the backward rebuilds: the whole block under full recompute and (conservatively, as
    # before the modules were priced) under Korthikanti's core_attn selective; under Megatron's
    # output-discarding modules only what they discarded (cost/recompute.py)
    rebuilt = 0.0
    if recompute == "selective" and modules.op_policy(shape):  # all it did not keep
        rebuilt = max(0.0, activation_bytes(layer, shape, "none", flash)
                      - modules.op_kept_bytes(layer, shape, flash))
    elif recompute == "full" or (recompute == "selective" and modules.drops_scores(shape)):
        rebuilt = activation_bytes(layer, shape, "none", flash)
    elif recompute == "selective":
        rebuilt = modules.discarded_bytes(layer, shape)
    width = (2 if layer.mlp == "swiglu" else 1) * layer.ffn_hidden_size
    mlp_moment = ACT_BYTES * s * b * (hidden + 2 * width / t)
    if layer.is_moe:  # the gradients of the routed copies' inputs and FC1 outputs
        mlp_moment = ACT_BYTES * (2 * s * b * h * rep + moe.routed_copies(layer, shape) * (
            2 * h + 2 * width / moe.expert_tp(shape)))
    attention_moment = 0.0
    if not flash:
        scores = layer.num_attention_heads * s * shape.context * b / t
        attention_moment = 2 * ACT_BYTES * scores - _mlp_kept(layer, shape)
    return rebuilt + max(mlp_moment, attention_moment)


def sharded_params(layer: Layer, tp: int, ep: int = 1, etp: int = 0) -> float:
    """Parameters this layer puts on one GPU of its TP group (Megatron column/row parallel:
    matmul weights and the column-parallel biases split by tp; norms and row-parallel biases
    replicated; vocab-parallel embedding and output head; routed experts split over ep x etp,
    etp 0 meaning tp)."""
    h = layer.hidden_size
    if layer.kind == "embedding":
        return layer.padded_vocab(tp) * h / tp + (layer.params - layer.vocab_size * h)
    if layer.kind == "head":
        if layer.mtp_block is None:
            return layer.params - layer.vocab_size * h + layer.padded_vocab(tp) * h / tp
        # with MTP (model/spec.py Layer.mtp_depth): the norm, the vocab-parallel output weight
        # and the embedding copy the modules read, and per module its block, the 2h x h
        # projection (column-parallel, as the blocks' matmuls) and its three replicated norms
        norm = (2 if layer.norm == "layernorm" else 1) * h
        module = (sharded_params(layer.mtp_block, tp, ep, etp) + 2 * h * h / tp
                  + layer.mtp_module_params - layer.mtp_block.params - 2 * h * h)
        vocab = (2 if layer.mtp_copies_embedding else 1) * layer.padded_vocab(tp) * h / tp
        return norm + vocab + layer.mtp_depth * module
    if layer.kind == "linear":
        return layer.params / tp
    norms = layer.norm_params
    replicated_bias = 2 * h if layer.bias else 0
    experts = layer.expert_params
    return ((layer.params - experts - norms - replicated_bias) / tp + norms + replicated_bias
            + experts / (ep * (etp or tp)))


def model_state_parts(params, dp: int, zero: int, grad_bytes: float = 4,
                      weight_bytes: float = 2, optimizer_bytes: float = 12.0,
                      zero2_shards_grads: bool = True) -> tuple:
    """(weights, gradients, optimizer states) bytes of ``params`` parameters: 16-bit weights
    (``weight_bytes``: 2, or 0 where the fp32 master is the only copy) + gradients
    (``grad_bytes``: 4 for Megatron's fp32 main grads, 2 for 16-bit, 6 for 16-bit beside an fp32
    accumulation buffer) + optimizer state (``optimizer_bytes``, Adam's 12: fp32 master weights,
    m and v); ZeRO-1 / the distributed optimizer shards the optimizer state over dp, ZeRO-2 also
    the gradients (unless the stack reduces them only once per step, so it keeps them whole),
    ZeRO-3 also the weights (Rajbhandari et al. 2020, §5)."""
    weights, grads, optim = float(weight_bytes), float(grad_bytes), float(optimizer_bytes)
    if zero >= 1:
        optim /= dp
    if zero >= 3 or (zero == 2 and zero2_shards_grads):
        grads /= dp
    if zero >= 3:
        weights /= dp
    return params * weights, params * grads, params * optim


def model_state_bytes(params: float, dp: int, zero: int, grad_bytes: float = 4,
                      weight_bytes: float = 2, optimizer_bytes: float = 12.0,
                      zero2_shards_grads: bool = True) -> float:
    """The sum of :func:`model_state_parts`."""
    return sum(model_state_parts(params, dp, zero, grad_bytes, weight_bytes, optimizer_bytes,
                                 zero2_shards_grads))
