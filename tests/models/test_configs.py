"""Configs: published parameter counts, keyword overrides, validation."""
import pytest
import torch

from pytransformer.models import (DecoderLM, EncoderModel, Seq2SeqTransformer, bert_base, count_parameters, gpt2_small,
                                  transformer_base, transformer_big)


@pytest.mark.parametrize("factory,model,expected", [
    (transformer_base, Seq2SeqTransformer, 63_082_496),  # "about 63.1M"
    (transformer_big, Seq2SeqTransformer, 214_245_376),  # "about 214.2M"
    (gpt2_small, DecoderLM, 124_439_808),
    (bert_base, EncoderModel, 109_482_240),
])
def test_published_parameter_counts(factory, model, expected):
    with torch.device("meta"):
        assert count_parameters(model(factory())) == expected


def test_untied_and_mlm_counts():
    with torch.device("meta"):
        tied = count_parameters(Seq2SeqTransformer(transformer_base()))
        untied = count_parameters(Seq2SeqTransformer(transformer_base(tie_embeddings=False)))
        mlm = count_parameters(EncoderModel(bert_base(), mlm_head=True))
    assert untied - tied == 2 * 37000 * 512  # separate target embedding and output projection
    assert mlm - 109_482_240 == 768 * 768 + 768 + 2 * 768 + 30522  # transform + LayerNorm + decoder bias (tied weight)


def test_overrides():
    c = gpt2_small(n_layers=2, d_model=64)
    assert (c.n_layers, c.d_model, c.n_heads, c.vocab_size) == (2, 64, 12, 50257)
    assert transformer_base(vocab_size=100).vocab_size == 100 and transformer_big().d_model == 1024
    assert bert_base().eps == 1e-12 and bert_base(pooler=False).pooler is False


def test_bad_config():
    with pytest.raises(ValueError, match="positional"):
        gpt2_small(positional="alibi")
