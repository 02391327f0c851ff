"""Model specs: what is being trained, as a sequence of layers the planner can split.

A model comes from our model.json, a HuggingFace ``config.json`` or a preset name, and always becomes
the same thing: a :class:`ModelSpec` whose ``layers`` are an embedding, the transformer blocks and the
output head (final norm + projection + loss), or any explicit sequence of such layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cached_property

from planner.core.errors import PlanInputError
from planner.core.limits import MAX_LAYERS
from planner.model.consistency import check_consistent
from planner.model.huggingface import PLANNING_SEQ_CAP
from planner.model.schema import (LAYER_FIELDS, LAYER_KINDS, MLP_KINDS, MODEL_JSON, MAX_SEQ,
                                  NORM_KINDS, QK_NORM_KINDS, check_fields, check_rope_scaling)

__all__ = ["LAYER_KINDS", "MLP_KINDS", "NORM_KINDS", "QK_NORM_KINDS", "Layer", "ModelSpec",
           "megatron_padded_vocab", "sequence_note"]


def megatron_padded_vocab(vocab_size: int, divisible_by: int, tp: int) -> int:
    """The vocabulary as Megatron-LM trains it at this TP, rounded up to a multiple of
    make_vocab_size_divisible_by x tp: Megatron-LM megatron/training/tokenizer/tokenizer.py,
    _vocab_size_with_padding ("Pad vocab size so it is divisible by model parallel size and
    still having GPU friendly size."), sets ``multiple = args.make_vocab_size_divisible_by *
    args.tensor_model_parallel_size`` and adds one until ``after % multiple`` is 0. The padded
    rows are stored and computed like real ones; parameter counts (params) stay the model's."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


@dataclass(frozen=True)
class Layer:
    """One pipeline-splittable layer; shapes only, the cost model turns them into time and bytes."""

    kind: str
    hidden_size: int
    num_attention_heads: int = 0
    num_kv_heads: int = 0
    ffn_hidden_size: int = 0
    mlp: str = "gelu"
    vocab_size: int = 0
    norm: str = "layernorm"
    bias: bool = True
    position_embeddings: int = 0  # learned absolute positions held by an embedding layer
    tied: bool = False  # a head whose weight is the embedding's (stored again when on another stage)
    out_features: int = 0  # a plain "linear" layer: hidden_size -> out_features
    # Dropout after the embedding, the attention probabilities and both residual branches
    # (GPT-2/3, Megatron-LM, BLOOM). Llama and MPT train without it (p = 0), so no masks are
    # kept and no dropout kernels run.
    dropout: bool = True
    # A norm on the embedding output (BLOOM's word_embeddings_layernorm; Le Scao et al. 2022,
    # §3.2.3): its weights and, since frameworks never recompute the embedding, its saved input.
    embedding_norm: bool = False
    # Width of one attention head; 0 means hidden_size / num_attention_heads. Qwen3, Gemma and
    # Mistral-NeMo declare their own (HF config.json "head_dim"; Megatron's --kv-channels), so
    # the query width heads x head_dim may differ from hidden_size.
    head_dim: int = 0
    qkv_bias: bool = False  # biases on the Q, K and V projections only (Qwen2; bias=False)
    # RMSNorm (or LayerNorm) on queries and keys before RoPE: "head" normalises each head over
    # head_dim with one shared weight (Qwen3, Gemma 3), "full" the whole Q and K projections
    # (OLMo 2); "" none.
    qk_norm: str = ""
    block_norms: int = 2  # norms per block: 2 (pre- or post-norm), 4 (Gemma 2/3: both)
    # Rotary position embeddings applied to Q and K in the block (their element-wise kernels are
    # priced, cost/elementwise.py); False for learned or ALiBi positions.
    rope: bool = False
    # Megatron-LM pads the vocabulary to a multiple of this times TP (see padded_vocab).
    make_vocab_size_divisible_by: int = 128
    # Mixture of experts (a block whose MLP is num_experts routed experts): each expert is an MLP
    # of ffn_hidden_size; a token goes to moe_top_k of them, chosen by a router (one h x E
    # matrix; router_bias: DeepSeek-V3's per-expert e_score_correction_bias), and through
    # shared_ffn_hidden_size of always-active shared experts (DeepSeek: n_shared_experts x the
    # expert width; Qwen2-MoE: one shared expert, scaled by a sigmoid gate, shared_expert_gate).
    # 0 experts: a dense MLP. See planner/cost/moe.py for what they cost.
    num_experts: int = 0
    moe_top_k: int = 0
    shared_ffn_hidden_size: int = 0
    shared_expert_gate: bool = False
    router_bias: bool = False
    # Group-limited routing (DeepSeek-V3's node-limited routing, HuggingFace n_group and
    # topk_group): the experts form moe_groups groups of consecutive experts and a token's
    # experts lie within moe_group_top_k of them; 0: no limit (cost/routing.py)
    moe_groups: int = 0
    moe_group_top_k: int = 0
    # Multi-head latent attention (DeepSeek-V2 §2.1, DeepSeek-V3 §2.1.1), on when kv_lora_rank >
    # 0: queries through a low-rank q_lora_rank bottleneck (0: a direct projection), keys and
    # values through a compressed kv_lora_rank latent plus a shared qk_rope_head_dim RoPE key;
    # heads of qk_nope_head_dim + qk_rope_head_dim for Q and K, v_head_dim for V.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # Multi-token prediction (DeepSeek-V3 §2.2, "MTP Modules"; planner/cost/mtp.py), carried by
    # the output head, whose stage it runs on: mtp_depth sequential modules, each "a shared
    # embedding layer Emb(·), a shared output head OutHead(·), a Transformer block TRM_k(·), and
    # a projection matrix M_k ∈ R^{d×2d}" (with the RMSNorms of eq. 21 and its head's own
    # norm), the block of each shaped as mtp_block. The embedding and head weights are the main
    # model's, stored once ("Shared Embedding and Output Head for Multi-Token Prediction", §3.2.3).
    mtp_depth: int = 0
    mtp_block: Layer | None = None

    def __post_init__(self) -> None:
        # the rules a layers entry of model.json follows (model/schema.py), for any caller
        where = f"a {self.kind} layer" if self.kind in LAYER_KINDS else "a layer"
        check_fields({f.name: getattr(self, f.name) for f in fields(self)}, LAYER_FIELDS, where)
        if self.mtp_block is not None and not isinstance(self.mtp_block, Layer):
            raise PlanInputError(f"{where}: 'mtp_block' must be a Layer or None, got "
                                 f"{type(self.mtp_block).__name__}")
        h, heads = self.hidden_size, self.num_attention_heads
        if self.kind == "block" and self.kv_lora_rank and not self.head_dim:
            object.__setattr__(self, "head_dim", self.qk_nope_head_dim + self.qk_rope_head_dim)
        if (self.kind == "block" and not self.head_dim and isinstance(h, int)
                and isinstance(heads, int) and heads > 0):
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    @property
    def is_moe(self) -> bool:
        return self.kind == "block" and self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kind == "block" and self.kv_lora_rank > 0

    @property
    def v_size(self) -> int:
        """Width of the values and of the attention output: heads x v_head_dim under MLA, else
        q_size."""
        return self.num_attention_heads * self.v_head_dim if self.is_mla else self.q_size

    @property
    def q_size(self) -> int:
        """Width of the queries (and of the attention output): heads x head_dim."""
        return self.num_attention_heads * self.head_dim

    def padded_vocab(self, tp: int) -> int:
        """The vocabulary Megatron-LM trains at this TP (see megatron_padded_vocab)."""
        return megatron_padded_vocab(self.vocab_size, self.make_vocab_size_divisible_by, tp)

    @cached_property  # a Layer is frozen: computed once, read by every cost
    def norm_params(self) -> int:
        """Weights of a block's norms (replicated across TP): its block_norms and any Q/K norm."""
        per_norm = 2 if self.norm == "layernorm" else 1
        qk = {"": 0, "head": 2 * self.head_dim,
              "full": self.q_size + self.num_kv_heads * self.head_dim}[self.qk_norm]
        return per_norm * (self.block_norms * self.hidden_size + qk)

    @cached_property  # a Layer is frozen: computed once, read by every cost
    def params(self) -> int:
        """Parameters this layer stores (a tied head counts its weight: the stage holding it stores it)."""
        h = self.hidden_size
        norm = (2 if self.norm == "layernorm" else 1) * h
        if self.kind == "embedding":
            return (self.vocab_size + self.position_embeddings) * h + (
                norm if self.embedding_norm else 0)
        if self.kind == "head":
            # with MTP, the stage also stores the embedding its modules read, unless it holds
            # the embedding itself (predict/memory.py): Megatron-Core's GPTModel, "if
            # self.pre_process or self.mtp_process: self.embedding = LanguageModelEmbedding("
            # (a tied head's weight is that embedding already)
            embedding = self.vocab_size * h if self.mtp_copies_embedding else 0
            return norm + self.vocab_size * h + embedding + self.mtp_depth * self.mtp_module_params
        if self.kind == "linear":
            return h * self.out_features + (self.out_features if self.bias else 0)
        return self.attention_params + self.mlp_params(self.num_experts) + self.norm_params

    @cached_property  # a Layer is frozen: computed once, read by every cost
    def mtp_module_params(self) -> int:
        """One MTP module's own weights (0 without MTP): its block, the 2h x h projection M_k
        and three norms, RMSNorm(h) and RMSNorm(Emb) of eq. 21 and the shared head's own norm
        (HuggingFace DeepSeek-V3's layer 61: enorm, hnorm, eh_proj, shared_head.norm beside
        the block); the embedding and output weights are shared, not counted."""
        if self.mtp_block is None:
            return 0
        h = self.hidden_size
        norm = (2 if self.norm == "layernorm" else 1) * h
        return self.mtp_block.params + 2 * h * h + 3 * norm

    @cached_property  # a Layer is frozen: computed once, read by every cost
    def attention_params(self) -> int:
        """Weights (and biases) of a block's attention, norms excluded."""
        h = self.hidden_size
        if self.is_mla:
            return self.mla_matrix_params + (self.q_lora_rank + self.kv_lora_rank)
        q, kv = self.q_size, self.num_kv_heads * self.head_dim
        attn = h * (q + 2 * kv) + q * h
        if self.bias:
            return attn + q + 2 * kv + h
        return attn + (q + 2 * kv if self.qkv_bias else 0)

    @cached_property  # a Layer is frozen: computed once, read by every cost
    def mla_matrix_params(self) -> int:
        """MLA's projection matrices, as DeepSeek-V2's modelling code declares them: q_a (h x
        q_lora) and q_b (q_lora x heads(nope + rope)), or one q_proj without q_lora; kv_a
        (h x kv_lora + rope) and kv_b (kv_lora x heads(nope + v)); o_proj (heads v x h). Its two
        latent RMSNorms (q_lora + kv_lora weights) are counted by attention_params."""
        h, heads = self.hidden_size, self.num_attention_heads
        qk = heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        q = h * self.q_lora_rank + self.q_lora_rank * qk if self.q_lora_rank else h * qk
        kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim)
              + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim))
        return q + kv + self.v_size * h

    def mlp_params(self, experts: int) -> int:
        """The MLP's weights with ``experts`` routed experts in it (all of them: the layer's
        parameters; moe_top_k: those one token uses), plus router and shared experts."""
        mlp_mats = 3 if self.mlp == "swiglu" else 2
        f = self.ffn_hidden_size
        one = mlp_mats * self.hidden_size * f + (
            f * (mlp_mats - 1) + self.hidden_size if self.bias else 0)
        if not self.is_moe:
            return one
        shared = mlp_mats * self.hidden_size * self.shared_ffn_hidden_size
        gate = self.hidden_size if self.shared_expert_gate else 0
        return experts * one + shared + gate + self.router_params

    @cached_property  # a Layer is frozen: computed once, read by every cost
    def router_params(self) -> int:
        return (self.hidden_size * self.num_experts
                + (self.num_experts if self.router_bias else 0)) if self.is_moe else 0

    @cached_property  # a Layer is frozen: computed once, read by every cost
    def expert_params(self) -> int:
        """Routed-expert weights: what expert parallelism shards (0 for a dense layer)."""
        return self.mlp_params(self.num_experts) - self.mlp_params(0) if self.is_moe else 0

    @cached_property  # a Layer is frozen: computed once, read by every cost
    def active_params(self) -> int:
        """Parameters one token passes through: all but the routed experts it is not sent to."""
        if self.mtp_block is not None:  # the MTP blocks' unused routed experts left out
            idle = self.mtp_block.params - self.mtp_block.active_params
            return self.unique_params - self.mtp_depth * idle
        if not self.is_moe:
            return self.unique_params
        return self.params - self.mlp_params(self.num_experts) + self.mlp_params(self.moe_top_k)

    @cached_property  # a Layer is frozen: computed once, read by every cost
    def unique_params(self) -> int:
        """Parameters counted once for the whole model (a tied head adds only its norm)."""
        out = self.params
        if self.kind == "head" and self.tied:
            out -= self.vocab_size * self.hidden_size
        if self.mtp_copies_embedding:
            out -= self.vocab_size * self.hidden_size
        return out

    @property
    def mtp_copies_embedding(self) -> bool:
        """Whether this head's stage stores an embedding copy for its MTP modules (an untied
        head carrying MTP; see params)."""
        return self.kind == "head" and self.mtp_block is not None and not self.tied


@dataclass(frozen=True)
class ModelSpec:
    """A model to plan: its headline shape and the ordered layers the pipeline splits."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_length: int
    mlp: str = "gelu"
    norm: str = "layernorm"
    bias: bool = True
    tie_embeddings: bool = False
    position_embeddings: int = 0
    dropout: bool = True  # see Layer.dropout
    embedding_norm: bool = False  # see Layer.embedding_norm
    head_dim: int = 0  # see Layer.head_dim; 0: hidden_size / num_attention_heads
    qkv_bias: bool = False  # see Layer.qkv_bias
    qk_norm: str = ""  # see Layer.qk_norm
    block_norms: int = 2  # see Layer.block_norms
    # Rotary position embeddings as trained (HF config.json "rope_theta", "rope_scaling"); None for
    # learned or ALiBi positions. Carried for exporters; whether they are set marks the blocks as
    # rotary (Layer.rope), whose element-wise kernels cost time.
    rope_theta: float | None = None
    rope_scaling: dict | None = field(default=None, hash=False)
    max_position_embeddings: int = 0  # the context the model declares; 0: not declared
    # The shortest attention window any block uses (Mistral 7B v0.1, Gemma 2/3, Phi-3); 0: every
    # block attends to the whole sequence. Planned only where it does not act: see with_seq_length.
    sliding_window: int = 0
    make_vocab_size_divisible_by: int = 128  # see Layer.padded_vocab; Megatron-LM's default
    # Mixture of experts (see Layer.num_experts): every block but those in dense_layers (block
    # indices from 0: DeepSeek's first_k_dense_replace, Qwen's mlp_only_layers) has num_experts
    # routed experts of moe_ffn_hidden_size each; dense blocks keep ffn_hidden_size.
    num_experts: int = 0
    moe_top_k: int = 0
    moe_ffn_hidden_size: int = 0
    shared_ffn_hidden_size: int = 0
    shared_expert_gate: bool = False
    router_bias: bool = False
    # The router's load-balancing loss as the model trained (HF router_aux_loss_coef; DeepSeek's
    # aux_loss_alpha, per sequence with seq_aux); 0: none. Not priced (balanced experts are),
    # carried to exports (Megatron --moe-aux-loss-coeff) so the launch balances as planned.
    router_aux_loss: float = 0.0
    router_aux_loss_per_sequence: bool = False
    moe_groups: int = 0  # group-limited routing (see Layer.moe_groups)
    moe_group_top_k: int = 0
    dense_layers: tuple[int, ...] = ()
    # Multi-head latent attention (see Layer.kv_lora_rank); kv_lora_rank 0: not MLA
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # Multi-token prediction modules after the main model (HF num_nextn_predict_layers, Megatron
    # --mtp-num-layers; see Layer.mtp_depth): on the output head's stage, each with one block
    # shaped as the block after the last (an MoE block where blocks past dense_layers are MoE)
    mtp_layers: int = 0
    layers: tuple[Layer, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        self._check_fields()
        loss = self.router_aux_loss
        if loss == 1:  # the schema's range is [0, 1]; a loss weighed as the whole loss is none
            raise PlanInputError(f"model {self.name}: 'router_aux_loss' must be below 1 (a "
                                 f"number in [0, 1)), got {loss!r}")
        if (loss or self.router_aux_loss_per_sequence) and not self.num_experts:
            raise PlanInputError(f"model {self.name}: router_aux_loss needs num_experts > 0")
        if not self.layers:
            object.__setattr__(self, "layers", _standard_layers(self))
        check_consistent(self, f"model {self.name}")

    def _check_fields(self) -> None:
        """Each field by the rule model.json's key of the same name follows (model/schema.py
        MODEL_JSON): one PlanInputError naming the field, whoever constructs the spec."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        where = f"model {self.name}" if isinstance(self.name, str) else "model"
        # the name first: the other messages show it
        check_fields({"name": self.name}, {"name": MODEL_JSON["name"]}, "model")
        check_fields(values, MODEL_JSON, where)
        check_rope_scaling(self.rope_scaling, where)
        dense = self.dense_layers
        if not isinstance(dense, tuple) or any(
                isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < MAX_LAYERS
                for i in dense):
            raise PlanInputError(f"{where}: 'dense_layers' must be a tuple of block indices "
                                 f"(whole numbers from 0), got {dense!r:.60}")
        if not isinstance(self.layers, tuple) or not all(isinstance(x, Layer)
                                                          for x in self.layers):
            raise PlanInputError(f"{where}: 'layers' must be a tuple of Layer (or empty: the "
                                 f"standard embedding, blocks and head), got {self.layers!r:.60}")

    @property
    def kv_channels(self) -> int:
        """The head width the blocks use (Megatron's --kv-channels): head_dim, or h / heads."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def padded_vocab_size(self, tp: int) -> int:
        """The vocabulary Megatron-LM trains at this TP (see megatron_padded_vocab)."""
        return megatron_padded_vocab(self.vocab_size, self.make_vocab_size_divisible_by, tp)

    @property
    def params(self) -> int:
        return sum(layer.unique_params for layer in self.layers)

    @property
    def active_params(self) -> int:
        """Parameters one token uses (= params for a dense model): a mixture of experts counts
        only its moe_top_k routed experts per block. Embedding and output head are counted, as
        Mistral (Mixtral 12.9B active) and Qwen (Qwen3-30B-A3B 3.3B) count them."""
        return sum(layer.active_params for layer in self.layers)

    @property
    def is_moe(self) -> bool:
        return any(layer.is_moe for layer in self.layers)

    @property
    def blocks(self) -> tuple[Layer, ...]:
        return tuple(layer for layer in self.layers if layer.kind == "block")

    def with_seq_length(self, seq_length: int | None) -> ModelSpec:
        """The model as planned: trained at another sequence length (None keeps its own), and
        refused where a sliding attention window is shorter than the sequence, since the cost
        model would count full attention where the model attends to a band of the window."""
        spec = self
        if seq_length is not None:
            if not 1 <= seq_length <= MAX_SEQ:
                raise PlanInputError(f"--seq-len must be between 1 and {MAX_SEQ:,}, got "
                                     f"{seq_length}")
            spec = replace(self, seq_length=seq_length)
        window = spec.sliding_window
        if 0 < window < spec.seq_length:
            raise PlanInputError(
                f"{spec.name}: sliding-window attention (a {window}-token window, shorter than "
                f"the {spec.seq_length}-token sequence) is not modelled: plan3d would count full "
                f"attention; plan it with --seq-len {window} or less")
        return spec


def sequence_note(spec: ModelSpec, seq_len_flag: int | None) -> str | None:
    """One line when the planned sequence length is not the context the model declares: a planning
    default below it, or a --seq-len that overrides it; None when there is nothing to say."""
    declared, seq = spec.max_position_embeddings, spec.seq_length
    if not declared or seq == declared:
        return None
    if seq > declared:
        return (f"{spec.name}: planning {seq}-token sequences, beyond the {declared} positions "
                "it declares (--seq-len)")
    if seq_len_flag is not None:
        return (f"{spec.name}: planning {seq}-token sequences (--seq-len); it declares {declared} "
                "positions")
    return (f"{spec.name} declares {declared} positions; planning {seq}-token sequences "
            f"(plan3d caps an imported config's default at {PLANNING_SEQ_CAP}); --seq-len "
            f"{declared} plans the full context")


def _standard_layers(spec: ModelSpec) -> tuple[Layer, ...]:
    common = dict(hidden_size=spec.hidden_size, norm=spec.norm, bias=spec.bias,
                  vocab_size=spec.vocab_size, dropout=spec.dropout,
                  make_vocab_size_divisible_by=spec.make_vocab_size_divisible_by)
    mla = dict(q_lora_rank=spec.q_lora_rank, kv_lora_rank=spec.kv_lora_rank,
               qk_rope_head_dim=spec.qk_rope_head_dim, qk_nope_head_dim=spec.qk_nope_head_dim,
               v_head_dim=spec.v_head_dim)
    block = Layer(kind="block", num_attention_heads=spec.num_attention_heads,
                  num_kv_heads=spec.num_kv_heads, ffn_hidden_size=spec.ffn_hidden_size,
                  mlp=spec.mlp, head_dim=spec.head_dim, qkv_bias=spec.qkv_bias,
                  qk_norm=spec.qk_norm, block_norms=spec.block_norms,
                  rope=spec.rope_theta is not None, **mla, **common)
    blocks = [block] * spec.num_layers
    if spec.num_experts:
        moe = replace(block, ffn_hidden_size=spec.moe_ffn_hidden_size or spec.ffn_hidden_size,
                      num_experts=spec.num_experts, moe_top_k=spec.moe_top_k,
                      shared_ffn_hidden_size=spec.shared_ffn_hidden_size,
                      shared_expert_gate=spec.shared_expert_gate, router_bias=spec.router_bias,
                      moe_groups=spec.moe_groups, moe_group_top_k=spec.moe_group_top_k)
        dense = set(spec.dense_layers)
        blocks = [block if i in dense else moe for i in range(spec.num_layers)]
    embedding = Layer(kind="embedding", position_embeddings=spec.position_embeddings,
                      embedding_norm=spec.embedding_norm, **common)
    # DeepSeek-V3's MTP block is its layer 61, past first_k_dense_replace: an MoE block
    mtp = dict(mtp_depth=spec.mtp_layers,
               mtp_block=(moe if spec.num_experts else block)) if spec.mtp_layers else {}
    head = Layer(kind="head", tied=spec.tie_embeddings, **mtp, **common)
    return (embedding, *blocks, head)


# --- loading -------------------------------------------------------------------------------------


