"""Model specs: what is being trained, as a sequence of layers the planner can split.

A model comes from our model.json, a HuggingFace ``config.json`` or a preset name, and always becomes
the same thing: a :class:`ModelSpec` whose ``layers`` are an embedding, the transformer blocks and the
output head (final norm + projection + loss), or any explicit sequence of such layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from planner.core.errors import PlanInputError
from planner.model.huggingface import PLANNING_SEQ_CAP
from planner.model.schema import MAX_SEQ

LAYER_KINDS = ("embedding", "block", "head", "linear")
MLP_KINDS = ("gelu", "swiglu")
NORM_KINDS = ("layernorm", "rmsnorm")
QK_NORM_KINDS = ("", "head", "full")


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

    def __post_init__(self) -> None:
        h, heads = self.hidden_size, self.num_attention_heads
        if (self.kind == "block" and not self.head_dim and isinstance(h, int)
                and isinstance(heads, int) and heads > 0):
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    @property
    def q_size(self) -> int:
        """Width of the queries (and of the attention output): heads x head_dim."""
        return self.num_attention_heads * self.head_dim

    def padded_vocab(self, tp: int) -> int:
        """The vocabulary Megatron-LM trains at this TP (see megatron_padded_vocab)."""
        return megatron_padded_vocab(self.vocab_size, self.make_vocab_size_divisible_by, tp)

    @property
    def norm_params(self) -> int:
        """Weights of a block's norms (replicated across TP): its block_norms and any Q/K norm."""
        per_norm = 2 if self.norm == "layernorm" else 1
        qk = {"": 0, "head": 2 * self.head_dim,
              "full": self.q_size + self.num_kv_heads * self.head_dim}[self.qk_norm]
        return per_norm * (self.block_norms * self.hidden_size + qk)

    @property
    def params(self) -> int:
        """Parameters this layer stores (a tied head counts its weight: the stage holding it stores it)."""
        h = self.hidden_size
        norm = (2 if self.norm == "layernorm" else 1) * h
        if self.kind == "embedding":
            return (self.vocab_size + self.position_embeddings) * h + (
                norm if self.embedding_norm else 0)
        if self.kind == "head":
            return norm + self.vocab_size * h
        if self.kind == "linear":
            return h * self.out_features + (self.out_features if self.bias else 0)
        q, kv = self.q_size, self.num_kv_heads * self.head_dim
        attn = h * (q + 2 * kv) + q * h
        mlp_mats = 3 if self.mlp == "swiglu" else 2
        mlp = mlp_mats * h * self.ffn_hidden_size
        if self.bias:
            biases = q + 2 * kv + h + self.ffn_hidden_size * (mlp_mats - 1) + h
        else:
            biases = q + 2 * kv if self.qkv_bias else 0
        return attn + mlp + biases + self.norm_params

    @property
    def unique_params(self) -> int:
        """Parameters counted once for the whole model (a tied head adds only its norm)."""
        if self.kind == "head" and self.tied:
            return self.params - self.vocab_size * self.hidden_size
        return self.params


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
    layers: tuple[Layer, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not self.layers:
            object.__setattr__(self, "layers", _standard_layers(self))

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
    block = Layer(kind="block", num_attention_heads=spec.num_attention_heads,
                  num_kv_heads=spec.num_kv_heads, ffn_hidden_size=spec.ffn_hidden_size,
                  mlp=spec.mlp, head_dim=spec.head_dim, qkv_bias=spec.qkv_bias,
                  qk_norm=spec.qk_norm, block_norms=spec.block_norms,
                  rope=spec.rope_theta is not None, **common)
    embedding = Layer(kind="embedding", position_embeddings=spec.position_embeddings,
                      embedding_norm=spec.embedding_norm, **common)
    head = Layer(kind="head", tied=spec.tie_embeddings, **common)
    return (embedding, *([block] * spec.num_layers), head)


# --- loading -------------------------------------------------------------------------------------


