"""Model configs (dataclasses), the published configurations, and count_parameters."""
from dataclasses import dataclass

from torch import nn

from ..nn.positional import rope_type

POSITIONALS = ("sinusoidal", "sinusoidal_halves", "learned", "rotary")


@dataclass
class _Config:
    vocab_size: int
    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: int | None = None
    d_ff: int = 2048
    max_len: int = 1024
    dropout: float = 0.1
    activation: str = "relu"  # relu | gelu | gelu_tanh | silu | swiglu | geglu
    norm: str = "post"  # post | pre | sandwich
    norm_type: str = "layernorm"  # layernorm | rmsnorm
    positional: str = "sinusoidal"  # sinusoidal | sinusoidal_halves (sines, then cosines) | learned | rotary
    rope_theta: float = 10000.0  # rotary base
    rope_scaling: dict | None = None  # None or {"rope_type": "llama3", ...} (nn.positional.rope_inv_freq)
    tie_embeddings: bool = True
    eps: float = 1e-5
    bias: bool = True  # biases of the linear layers and LayerNorms
    qkv_bias: bool | None = None  # the Q|K|V projection's bias (None: `bias`)
    d_head: int | None = None  # each head's width (None: d_model // n_heads); head_dim is the width in use
    qk_norm: bool = False  # RMSNorm over each head of q and of k before rotary (Qwen3)

    def __post_init__(self):
        if self.positional not in POSITIONALS:
            raise ValueError(f"positional: expected one of {POSITIONALS}, got {self.positional!r}")
        rope_type(self.rope_scaling)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads if self.d_head is None else self.d_head

    def layer_kwargs(self) -> dict:
        """Keyword arguments shared by every encoder/decoder layer of the model."""
        return {"d_model": self.d_model, "n_heads": self.n_heads, "d_ff": self.d_ff, "dropout": self.dropout,
                "activation": self.activation, "norm": self.norm, "eps": self.eps, "bias": self.bias,
                "n_kv_heads": self.n_kv_heads, "norm_type": self.norm_type, "qkv_bias": self.qkv_bias,
                "d_head": self.d_head, "qk_norm": self.qk_norm}


@dataclass
class DecoderConfig(_Config):
    """DecoderLM: GPT-like decoder-only LM; `window` makes self-attention sliding-window, in every layer but
    `global_layers` (indices of layers that attend to every earlier position, as Gemma 3's every sixth), whose rotary
    base is rope_theta while the windowed layers' is `local_rope_theta` (None: rope_theta). `scale_embeddings`
    multiplies the token embeddings by sqrt(d_model) (Gemma)."""
    n_layers: int = 12
    window: int | None = None
    global_layers: tuple[int, ...] = ()
    local_rope_theta: float | None = None
    scale_embeddings: bool = False

    def __post_init__(self):
        super().__post_init__()
        self.global_layers = tuple(self.global_layers)
        if self.global_layers and self.window is None:
            raise ValueError("global_layers: only with a window (the other layers' sliding window)")
        if any(not isinstance(i, int) or not 0 <= i < self.n_layers for i in self.global_layers):
            raise ValueError(f"global_layers: expected layer indices in [0, {self.n_layers}), got {self.global_layers}")

    def layer_window(self, i: int) -> int | None:
        """Layer i's sliding window (None: every earlier position)."""
        return None if i in self.global_layers else self.window


@dataclass
class EncoderConfig(_Config):
    """EncoderModel: BERT-like encoder with token types and an optional pooler."""
    n_layers: int = 12
    type_vocab_size: int = 2
    pooler: bool = True


@dataclass
class Seq2SeqConfig(_Config):
    """Seq2SeqTransformer: encoder-decoder; one vocabulary shared by source and target."""
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6


def transformer_base(vocab_size: int = 37000, **overrides) -> Seq2SeqConfig:
    """Vaswani et al. 2017 base: 6+6 layers, d_model 512, 8 heads, d_ff 2048, dropout 0.1, tied embeddings."""
    return Seq2SeqConfig(vocab_size=vocab_size, **overrides)


def transformer_big(vocab_size: int = 37000, **overrides) -> Seq2SeqConfig:
    """Vaswani et al. 2017 big: 6+6 layers, d_model 1024, 16 heads, d_ff 4096, dropout 0.3, tied embeddings."""
    return Seq2SeqConfig(**{"vocab_size": vocab_size, "d_model": 1024, "n_heads": 16, "d_ff": 4096, "dropout": 0.3,
                            **overrides})


def gpt2_small(**overrides) -> DecoderConfig:
    """GPT-2 small: 12 layers, d_model 768, 12 heads, learned positions, pre-norm, tanh-GELU, tied LM head."""
    return DecoderConfig(**{"vocab_size": 50257, "d_model": 768, "n_heads": 12, "n_layers": 12, "d_ff": 3072,
                            "max_len": 1024, "dropout": 0.1, "activation": "gelu_tanh", "norm": "pre",
                            "positional": "learned", **overrides})


def bert_base(**overrides) -> EncoderConfig:
    """BERT-base: 12 layers, d_model 768, 12 heads, learned positions, 2 token types, post-norm, GELU, pooler."""
    return EncoderConfig(**{"vocab_size": 30522, "d_model": 768, "n_heads": 12, "n_layers": 12, "d_ff": 3072,
                            "max_len": 512, "dropout": 0.1, "activation": "gelu", "norm": "post",
                            "positional": "learned", "eps": 1e-12, **overrides})


CONFIGS = {"transformer_base": transformer_base, "transformer_big": transformer_big, "gpt2_small": gpt2_small,
           "bert_base": bert_base}


def count_parameters(model: nn.Module) -> int:
    """Number of parameter elements, each (tied) parameter counted once."""
    return sum(p.numel() for p in model.parameters())

