"""Model specs: what is being trained, as a sequence of layers the planner can split.

A model comes from our model.json, a HuggingFace ``config.json`` or a preset name, and always becomes
the same thing: a :class:`ModelSpec` whose ``layers`` are an embedding, the transformer blocks and the
output head (final norm + projection + loss), or any explicit sequence of such layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from planner.core.errors import PlanInputError
from planner.core.files import read_json
from planner.model.huggingface import PLANNING_SEQ_CAP, huggingface_fields

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
    # learned or ALiBi positions. Carried for exporters: step time and memory do not depend on them.
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
            if seq_length < 1:
                raise PlanInputError(f"--seq-len must be positive, got {seq_length}")
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
                  qk_norm=spec.qk_norm, block_norms=spec.block_norms, **common)
    embedding = Layer(kind="embedding", position_embeddings=spec.position_embeddings,
                      embedding_norm=spec.embedding_norm, **common)
    head = Layer(kind="head", tied=spec.tie_embeddings, **common)
    return (embedding, *([block] * spec.num_layers), head)


# --- presets -------------------------------------------------------------------------------------
# Shapes from the papers / released configs named beside each entry.

def _gpt(name: str, layers: int, hidden: int, heads: int, vocab: int = 51200, seq: int = 2048,
         ffn: int | None = None) -> ModelSpec:
    # GPT-style as trained by Megatron-LM: GeLU MLP 4h, LayerNorm with biases, learned positions,
    # tied input/output embeddings, vocabulary padded to 51,200 (Narayanan et al. 2021, Table 1).
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     num_kv_heads=heads, ffn_hidden_size=ffn or 4 * hidden, vocab_size=vocab,
                     seq_length=seq, mlp="gelu", norm="layernorm", bias=True, tie_embeddings=True,
                     position_embeddings=seq)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int,
           seq: int) -> ModelSpec:
    # Llama family: SwiGLU, RMSNorm, no biases, RoPE, untied embeddings, no dropout (Touvron et
    # al. 2023; Meta Llama 3 model card / config.json: attention_dropout 0.0). RoPE base: 10,000
    # for Llama 2 and 500,000 for Llama 3 (their config.json "rope_theta").
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     num_kv_heads=kv, ffn_hidden_size=ffn, vocab_size=vocab, seq_length=seq,
                     mlp="swiglu", norm="rmsnorm", bias=False, tie_embeddings=False,
                     dropout=False, rope_theta=500000.0 if name.startswith("llama3") else 10000.0)


PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
        _gpt("gpt3-175b", 96, 12288, 96),  # Brown et al. 2020, Table 2.1
        # BLOOM: ALiBi (no position table), 250,880-token vocabulary, tied, a LayerNorm after the
        # embedding (Le Scao et al. 2022, §3.2.3): 176,247,271,424 parameters.
        ModelSpec(name="bloom-176b", num_layers=70, hidden_size=14336, num_attention_heads=112,
                  num_kv_heads=112, ffn_hidden_size=4 * 14336, vocab_size=250880, seq_length=2048,
                  mlp="gelu", norm="layernorm", bias=True, tie_embeddings=True,
                  embedding_norm=True),
        _gpt("mt-nlg-530b", 105, 20480, 128),  # Smith et al. 2022, §3
        # Megatron-LM 2021 GPT family (Narayanan et al. 2021, Table 1).
        _gpt("megatron-1.7b", 24, 2304, 24),
        _gpt("megatron-3.6b", 30, 3072, 32),
        _gpt("megatron-7.5b", 36, 4096, 32),
        _gpt("megatron-18.4b", 40, 6144, 48),
        _gpt("megatron-39.1b", 48, 8192, 64),
        _gpt("megatron-76.1b", 60, 10240, 80),
        _gpt("megatron-145.6b", 80, 12288, 96),
        _gpt("megatron-310.1b", 96, 16384, 128),
        _gpt("megatron-529.6b", 105, 20480, 128),
        _gpt("megatron-1t", 128, 25600, 160),
    )
}

ALIASES = {
    "gpt3": "gpt3-175b", "gpt-3": "gpt3-175b", "gpt-3-175b": "gpt3-175b",
    "bloom": "bloom-176b", "mt-nlg": "mt-nlg-530b", "mtnlg-530b": "mt-nlg-530b",
    "megatron-1008b": "megatron-1t", "megatron-1008.0b": "megatron-1t",
    "llama-2-7b": "llama2-7b", "llama-2-13b": "llama2-13b", "llama-2-70b": "llama2-70b",
    "llama-3-8b": "llama3-8b", "llama-3-70b": "llama3-70b", "llama-3-405b": "llama3-405b",
    "llama3.1-405b": "llama3-405b", "llama-3.1-405b": "llama3-405b",
}

DEFAULT_MODEL = "llama3-8b"


# --- loading -------------------------------------------------------------------------------------

_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
             "num_experts_per_tok", "moe_intermediate_size")


def load_model(source: str | Path | None) -> ModelSpec:
    """A preset name, our model.json, or a HuggingFace config.json -> ModelSpec."""
    if source is None:
        return PRESETS[DEFAULT_MODEL]
    text = str(source)
    key = text.lower().strip()
    if key in PRESETS or key in ALIASES:
        return PRESETS[ALIASES.get(key, key)]
    path = Path(text)
    if not path.exists():
        raise PlanInputError(
            f"unknown model '{text}': not a file and not a preset; `plan models` lists the presets")
    data = read_json(path, "model file")
    if not isinstance(data, dict):
        raise PlanInputError(f"{path}: expected a JSON object describing the model")
    return model_from_dict(data, origin=str(path))


def model_from_dict(data: dict, origin: str = "model") -> ModelSpec:
    """Recognise our model.json or a HuggingFace config.json and build the spec."""
    moe = [k for k in _MOE_KEYS if data.get(k) not in (None, 0, 1)]
    if moe:
        raise PlanInputError(
            f"{origin}: a mixture-of-experts model ({moe[0]}={data[moe[0]]}); plan3d plans dense "
            "models only and will not plan it as dense")
    if "model_type" in data or "architectures" in data:
        return _checked(ModelSpec(**huggingface_fields(data, origin)), origin)
    return _from_ours(data, origin)


def _require(data: dict, origin: str, *keys: str):
    for key in keys:
        if key in data and data[key] is not None:
            return data[key]
    raise PlanInputError(f"{origin}: missing '{keys[0]}'; add it to the model file")


def _positive(origin: str, **values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise PlanInputError(f"{origin}: '{name}' must be a positive integer, got {value!r}")


def _checked(spec: ModelSpec, origin: str, explicit: bool = False) -> ModelSpec:
    if not explicit:
        _positive(origin, num_layers=spec.num_layers)
    _positive(origin, hidden_size=spec.hidden_size,
              num_attention_heads=spec.num_attention_heads, num_kv_heads=spec.num_kv_heads,
              ffn_hidden_size=spec.ffn_hidden_size, vocab_size=spec.vocab_size,
              seq_length=spec.seq_length)
    if not spec.head_dim and spec.hidden_size % spec.num_attention_heads:
        raise PlanInputError(f"{origin}: hidden_size {spec.hidden_size} is not divisible by "
                             f"num_attention_heads {spec.num_attention_heads}")
    if spec.num_attention_heads % spec.num_kv_heads:
        raise PlanInputError(f"{origin}: num_attention_heads {spec.num_attention_heads} is not a "
                             f"multiple of num_kv_heads {spec.num_kv_heads}")
    if spec.mlp not in MLP_KINDS:
        raise PlanInputError(f"{origin}: mlp must be one of {', '.join(MLP_KINDS)}, got {spec.mlp!r}")
    if spec.norm not in NORM_KINDS:
        raise PlanInputError(f"{origin}: norm must be one of {', '.join(NORM_KINDS)}, "
                             f"got {spec.norm!r}")
    if spec.qk_norm not in QK_NORM_KINDS:
        raise PlanInputError(f"{origin}: qk_norm must be one of "
                             f"{', '.join(repr(k) for k in QK_NORM_KINDS)}, got {spec.qk_norm!r}")
    _positive(origin, block_norms=spec.block_norms,
              make_vocab_size_divisible_by=spec.make_vocab_size_divisible_by)
    for name in ("head_dim", "sliding_window", "max_position_embeddings"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PlanInputError(f"{origin}: '{name}' must be a non-negative integer (0: none), "
                                 f"got {value!r}")
    if spec.rope_theta is not None and (isinstance(spec.rope_theta, bool) or not isinstance(
            spec.rope_theta, (int, float)) or spec.rope_theta <= 0):
        raise PlanInputError(f"{origin}: 'rope_theta' must be a positive number or null, "
                             f"got {spec.rope_theta!r}")
    if spec.rope_scaling is not None and not isinstance(spec.rope_scaling, dict):
        raise PlanInputError(f"{origin}: 'rope_scaling' must be an object or null, "
                             f"got {spec.rope_scaling!r}")
    return spec


def _from_ours(data: dict, origin: str) -> ModelSpec:
    heads = _require(data, origin, "num_attention_heads")
    hidden = _require(data, origin, "hidden_size")
    mlp = data.get("mlp", "gelu")
    seq = _require(data, origin, "seq_length")
    base = dict(
        name=str(data.get("name", Path(origin).stem)),
        num_layers=0 if "layers" in data else _require(data, origin, "num_layers"),
        hidden_size=hidden, num_attention_heads=heads,
        num_kv_heads=data.get("num_kv_heads", heads),
        ffn_hidden_size=data.get("ffn_hidden_size", 4 * hidden if isinstance(hidden, int) else 0),
        vocab_size=_require(data, origin, "vocab_size"), seq_length=seq, mlp=mlp,
        norm=data.get("norm", "rmsnorm" if mlp == "swiglu" else "layernorm"),
        bias=bool(data.get("bias", mlp != "swiglu")),
        tie_embeddings=bool(data.get("tie_embeddings", False)),
        position_embeddings=int(data.get("position_embeddings", 0)),
        # unless the file says otherwise dropout is on: the conservative choice (its masks cost
        # memory)
        dropout=bool(data.get("dropout", True)),
        embedding_norm=bool(data.get("embedding_norm", False)),
        head_dim=data.get("head_dim", 0), qkv_bias=bool(data.get("qkv_bias", False)),
        qk_norm=data.get("qk_norm", ""), block_norms=data.get("block_norms", 2),
        rope_theta=data.get("rope_theta"), rope_scaling=data.get("rope_scaling"),
        max_position_embeddings=data.get("max_position_embeddings", 0),
        sliding_window=data.get("sliding_window", 0),
        make_vocab_size_divisible_by=data.get("make_vocab_size_divisible_by", 128),
    )
    if "layers" not in data:
        return _checked(ModelSpec(**base), origin)
    layers = _explicit_layers(data["layers"], base, origin)
    base["num_layers"] = sum(1 for layer in layers if layer.kind == "block")
    return _checked(ModelSpec(**base, layers=layers), origin, explicit=True)


def _explicit_layers(entries, base: dict, origin: str) -> tuple[Layer, ...]:
    """An explicit sequential model: [{"kind": "block", "repeat": 24, ...overrides}, ...]."""
    if not isinstance(entries, list) or not entries:
        raise PlanInputError(f"{origin}: 'layers' must be a non-empty list of layer objects")
    defaults = dict(hidden_size=base["hidden_size"], num_attention_heads=base["num_attention_heads"],
                    num_kv_heads=base["num_kv_heads"], ffn_hidden_size=base["ffn_hidden_size"],
                    mlp=base["mlp"], vocab_size=base["vocab_size"], norm=base["norm"],
                    bias=base["bias"], dropout=base["dropout"], head_dim=base["head_dim"],
                    qkv_bias=base["qkv_bias"], qk_norm=base["qk_norm"],
                    block_norms=base["block_norms"],
                    make_vocab_size_divisible_by=base["make_vocab_size_divisible_by"])
    known = set(Layer.__dataclass_fields__) | {"repeat"}
    layers: list[Layer] = []
    for n, entry in enumerate(entries):
        where = f"{origin}: layers[{n}]"
        if not isinstance(entry, dict) or entry.get("kind") not in LAYER_KINDS:
            raise PlanInputError(f"{where}: needs 'kind', one of {', '.join(LAYER_KINDS)}")
        unknown = sorted(set(entry) - known)
        if unknown:
            raise PlanInputError(f"{where}: unknown field '{unknown[0]}'")
        repeat = entry.get("repeat", 1)
        _positive(where, repeat=repeat)
        fields = {**defaults, **{k: v for k, v in entry.items() if k != "repeat"}}
        if fields["kind"] == "linear":
            _positive(where, out_features=fields.get("out_features"))
        layers.extend([Layer(**fields)] * repeat)
    return tuple(layers)
