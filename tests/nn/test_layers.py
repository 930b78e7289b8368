"""Encoder/decoder layers and stacks: from_torch reproduces torch.nn layers; norm placements against plain PyTorch."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pytransformer.nn import (Residual, TransformerDecoder, TransformerDecoderLayer, TransformerEncoder,
                              TransformerEncoderLayer)

D, H, FF = 32, 4, 64


def _padding(lengths, length):
    return torch.arange(length)[None, :] >= lengths[:, None]  # [B, L] True = padding (torch.nn convention)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("masking", ["causal", "padding"])
def test_encoder_layer_from_torch(norm_first, activation, masking):
    ref = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, activation=activation, batch_first=True,
                                     norm_first=norm_first).eval()
    ours = TransformerEncoderLayer.from_torch(ref).eval()
    x, lengths = torch.randn(3, 6, D), torch.tensor([6, 2, 4])
    with torch.no_grad():
        if masking == "causal":
            expected = ref(x, src_mask=nn.Transformer.generate_square_subsequent_mask(6), is_causal=True)
            out = ours(x, causal=True)
        else:
            expected = ref(x, src_key_padding_mask=_padding(lengths, 6))
            out = ours(x, key_lengths=lengths)
    real = ~_padding(lengths, 6) if masking == "padding" else torch.ones(3, 6, dtype=torch.bool)
    torch.testing.assert_close(out[real], expected[real], atol=1e-5, rtol=1e-5)  # torch zeroes padded rows


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_decoder_layer_from_torch(norm_first, activation):
    ref = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, activation=activation, batch_first=True,
                                     norm_first=norm_first).eval()
    ours = TransformerDecoderLayer.from_torch(ref).eval()
    x, mem = torch.randn(3, 5, D), torch.randn(3, 7, D)
    tgt_len, mem_len = torch.tensor([5, 3, 4]), torch.tensor([7, 2, 5])
    with torch.no_grad():
        expected = ref(x, mem, tgt_mask=torch.ones(5, 5, dtype=torch.bool).triu(1), tgt_is_causal=True,
                       tgt_key_padding_mask=_padding(tgt_len, 5), memory_key_padding_mask=_padding(mem_len, 7))
        out = ours(x, mem, causal=True, key_lengths=tgt_len, memory_key_lengths=mem_len)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_from_torch_keeps_training_mode_and_dropout():
    ours = TransformerEncoderLayer.from_torch(nn.TransformerEncoderLayer(D, H, FF, dropout=0.2, batch_first=True))
    assert ours.training and ours.ff.dropout.p == 0.2 and ours.self_attn.dropout == 0.2


def _block(x, f, norm, eps=1e-5):
    ln = lambda t: F.layer_norm(t, t.shape[-1:], eps=eps)  # noqa: E731  fresh LayerNorms are identity-affine
    if norm == "post":
        return ln(x + f(x))
    if norm == "pre":
        return x + f(ln(x))
    return x + ln(f(ln(x)))


@pytest.mark.parametrize("norm", ["post", "pre", "sandwich"])
def test_norm_placement(norm):
    res = Residual(8, norm).double()
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    torch.testing.assert_close(res(x, torch.tanh), _block(x, torch.tanh, norm))


@pytest.mark.parametrize("norm", ["post", "pre", "sandwich"])
def test_stacks(norm):
    enc = TransformerEncoder(2, D, H, FF, norm=norm, dropout=0.0).double()
    dec = TransformerDecoder(2, D, H, FF, norm=norm, dropout=0.0).double()
    assert (enc.norm is None) == (norm == "post") and (dec.norm is None) == (norm == "post")
    x, y = torch.randn(2, 6, D, dtype=torch.float64), torch.randn(2, 4, D, dtype=torch.float64)
    lengths = torch.tensor([6, 3])
    h = x
    for layer in enc.layers:
        h = layer(h, key_lengths=lengths)
    h = h if enc.norm is None else enc.norm(h)
    memory = enc(x, key_lengths=lengths)
    torch.testing.assert_close(memory, h)
    out = dec(y, memory, memory_key_lengths=lengths)
    assert out.shape == y.shape
    out.sum().backward()
    assert all(p.grad is not None for p in dec.parameters())


@pytest.mark.parametrize("norm", ["post", "pre", "sandwich"])
@pytest.mark.parametrize("cross", [False, True])
def test_keep_gives_the_kept_positions_of_every_row(norm, cross):
    """keep [B]: the last layer's rest runs on one row each; every row's kept output equals the full forward's."""
    dec = TransformerDecoder(3, D, H, FF, norm=norm, dropout=0.0, cross_attention=cross).double()
    y, memory = torch.randn(3, 5, D, dtype=torch.float64), torch.randn(3, 4, D, dtype=torch.float64)
    keep = torch.tensor([4, 0, 2])
    full = dec(y, memory if cross else None)
    out = dec(y, memory if cross else None, keep=keep)
    assert out.shape == (3, 1, D)
    for b in range(3):
        torch.testing.assert_close(out[b, 0], full[b, keep[b]])
    with pytest.raises(ValueError, match="keep"):
        dec.layers[0](y, memory, memory_mask=torch.zeros(5, 4, dtype=torch.bool), keep=keep)


def test_residual_dropout_only_in_training():
    layer = TransformerEncoderLayer(D, H, FF, dropout=0.5)
    x = torch.randn(2, 4, D)
    assert torch.equal(layer.eval()(x), layer(x))
    assert not torch.equal(layer.train()(x), layer.eval()(x))


def test_bad_arguments():
    with pytest.raises(ValueError, match="norm"):
        TransformerEncoderLayer(D, H, FF, norm="middle")
    with pytest.raises(ValueError, match="memory"):
        TransformerDecoderLayer(D, H, FF)(torch.randn(1, 2, D))
