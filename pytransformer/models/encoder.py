"""EncoderModel: a BERT-like encoder (token types, learned positions, post-LN, GELU), optional pooler and MLM head."""
import torch
from torch import Tensor, nn

from ..nn import LayerNorm, Linear, TransformerEncoder
from .common import Embeddings, init_normal, rotary_for
from .configs import EncoderConfig
from . import checkpoint


class MLMHead(nn.Module):
    """BERT's masked-LM head: dense, GELU, LayerNorm, then the (tied) vocabulary projection with a bias."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.dense = Linear(config.d_model, config.d_model)
        self.norm = LayerNorm(config.d_model, eps=config.eps)
        self.decoder = Linear(config.d_model, config.vocab_size)

    def forward(self, hidden: Tensor) -> Tensor:
        """hidden [B, L, d_model] -> logits [B, L, vocab]."""
        return self.decoder(self.norm(nn.functional.gelu(self.dense(hidden))))


class EncoderModel(nn.Module):
    """Embeddings (+ LayerNorm for post-norm), a TransformerEncoder, a tanh pooler of the first token (config.pooler)
    and an optional MLM head."""

    def __init__(self, config: EncoderConfig, mlm_head: bool = False):
        super().__init__()
        self.config = config
        post = config.norm == "post"
        self.embed = Embeddings(config, type_vocab_size=config.type_vocab_size, norm=post)
        self.encoder = TransformerEncoder(config.n_layers, rotary=rotary_for(config), **config.layer_kwargs())
        self.pooler = Linear(config.d_model, config.d_model) if config.pooler else None
        self.mlm_head = MLMHead(config) if mlm_head else None
        init_normal(self)
        if self.mlm_head is not None and config.tie_embeddings:
            self.mlm_head.decoder.weight = self.embed.tok.weight

    def forward(self, input_ids: Tensor, *, attention_mask: Tensor | None = None, key_lengths: Tensor | None = None,
                token_type_ids: Tensor | None = None) -> Tensor:
        """input_ids [B, L] -> hidden states [B, L, d_model]; attention_mask [B, L] is 1/True for real tokens,
        key_lengths [B] marks right padding."""
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]  # [B, 1, 1, L]
        x = self.embed(input_ids, torch.arange(input_ids.shape[1], device=input_ids.device), token_type_ids)
        return self.encoder(x, mask=mask, key_lengths=key_lengths)

    def pool(self, hidden: Tensor) -> Tensor:
        """BERT pooler output tanh(W h[:, 0] + b) [B, d_model] of hidden states [B, L, d_model]."""
        if self.pooler is None:
            raise ValueError("pooler: this model was built with config.pooler=False")
        return torch.tanh(self.pooler(hidden[:, 0]))

    def mlm_logits(self, hidden: Tensor) -> Tensor:
        """Masked-LM logits [B, L, vocab] of hidden states [B, L, d_model]."""
        if self.mlm_head is None:
            raise ValueError("mlm_head: this model was built with mlm_head=False")
        return self.mlm_head(hidden)

    @classmethod
    def from_hf(cls, model) -> "EncoderModel":
        """An EncoderModel with the config and weights of a Hugging Face BertModel object (pooler included when it has
        one; on its device, in its dtype and train/eval mode)."""
        return checkpoint.from_hf(cls, EncoderConfig, model)

    @classmethod
    def from_pretrained(cls, path, dtype: torch.dtype = torch.float32, *, device=None,
                        mmap: bool = True) -> "EncoderModel":
        """An EncoderModel (eval mode) from a local save_pretrained directory of a BERT model (config.json with
        model_type bert; safetensors weights of BertModel, or the encoder and pooler of a BertFor* model, whose task
        heads cls.*, classifier.* and qa_outputs.* are skipped), in `dtype` on `device` (default CPU), without
        importing transformers. A broken directory raises ValueError (FileNotFoundError for a missing path) naming
        the file and the field or tensor, before anything is allocated. mmap: as DecoderLM.from_pretrained's
        (models/checkpoint.py)."""
        return checkpoint.from_pretrained(cls, EncoderConfig, path, dtype=dtype, device=device, mmap=mmap)
