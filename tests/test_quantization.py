"""pytransformer.quantize (weight-only int8): per-channel error bounds, QuantizedLinear against a float64 reference,
whole models (tied heads, cross-attention, dtypes), size reduction, torch.compile, state-dict round trip."""
import copy
import io

import pytest
import torch
import torch.nn.functional as F

import pytransformer
from pytransformer import ops
from pytransformer.models import (DecoderLM, EncoderModel, Seq2SeqTransformer, bert_base, gpt2_small,
                                  transformer_base)
from pytransformer.nn import QuantizedEmbedding, QuantizedLinear
from pytransformer.nn.quantized import quantize_per_channel
from pytransformer.ops import reference
from pytransformer.quantization import state_dict_bytes
from tests.helpers import varied

V = 96


def tiny_lm(**overrides):
    return DecoderLM(gpt2_small(**{"vocab_size": V, "d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 128,
                                   "max_len": 64, "dropout": 0.0, **overrides})).eval()


def test_quantize_per_channel_error_bound():
    w = torch.randn(33, 70) * torch.logspace(-3, 1, 33)[:, None]  # rows of very different ranges
    w[5] = 0.0
    q, scale = quantize_per_channel(w)
    assert q.dtype == torch.int8 and scale.shape == (33,) and scale.dtype == w.dtype
    assert q.abs().max() <= 127 and (q.abs().amax(1)[torch.arange(33) != 5] == 127).all()
    assert (q[5] == 0).all()
    err = (q.float() * scale[:, None] - w).abs()
    assert (err <= scale[:, None] / 2 * (1 + 1e-5)).all()  # round to nearest: half a step per element


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 48), (2, 3, 48), (1, 1, 48)])
def test_quantized_linear(device, bias, shape):
    linear = torch.nn.Linear(48, 40, bias=bias, device=device)
    q = QuantizedLinear.from_linear(linear)
    assert q.weight.dtype == torch.int8 and q.weight.shape == (40, 48) and q.scale.shape == (40,)
    x = torch.randn(shape, device=device)
    x64 = reference.int8_linear_x(x).to(device)  # x as the op's path on this processor sees it
    with torch.no_grad():
        y = q(x)
        y_float = F.linear(x64, linear.weight.double(), linear.bias.double() if bias else None)
    # Against the product of x with the dequantized weight, computed in float64.
    want = F.linear(x64, q.weight.double() * q.scale.double()[:, None], linear.bias.double() if bias else None)
    assert y.shape == (*shape[:-1], 40) and y.dtype == torch.float32
    assert ((y.double() - want).abs() <= 1e-5 + 1e-5 * want.abs()).all()
    # Against the float layer: each weight is off by at most half a step, so |error| <= sum_k |x_k| * scale / 2.
    bound = x64.abs().sum(-1, keepdim=True) * q.scale.double() / 2
    assert ((y.double() - y_float).abs() <= bound * 1.001 + 1e-6).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_quantized_linear_dtypes(dtype):
    linear = torch.nn.Linear(32, 24, dtype=dtype)
    q = QuantizedLinear.from_linear(linear)
    assert q.scale.dtype == dtype and q.bias.dtype == dtype
    x = torch.randn(4, 32, dtype=dtype)
    y = q(x)
    assert y.dtype == dtype
    want = x.double() @ (q.weight.double() * q.scale.double()[:, None]).T + q.bias.double()
    tol = {torch.bfloat16: 3e-2, torch.float16: 3e-3, torch.float64: 1e-12}[dtype]
    torch.testing.assert_close(y.double(), want, atol=tol, rtol=tol)


def test_quantize_decoder_lm(device):
    model = tiny_lm().to(device)
    ids = torch.randint(0, V, (2, 12), device=device)
    with torch.no_grad():
        want = model(ids)
    q = pytransformer.quantize(copy.deepcopy(model))
    assert not any(isinstance(m, torch.nn.Linear) for m in q.modules())
    assert isinstance(q.embed.tok, QuantizedEmbedding) and q.embed.tok.head is q.lm_head  # the tied table stays one
    with torch.no_grad():
        got = q(ids)
    err = (got - want).abs()
    assert err.max() < 0.03 * want.abs().max() and err.mean() < 0.03 * want.abs().mean()  # about 1% measured
    varied_q = pytransformer.quantize(varied(tiny_lm()).to(device))  # tokens that vary from step to step
    assert torch.equal(varied_q.generate(ids[:, :5], 6), varied_q.generate(ids[:, :5], 6, use_cache=False))
    assert pytransformer.quantize(q) is q  # idempotent: nothing left to replace


def test_untied_head_and_other_models():
    torch.manual_seed(0)
    model = tiny_lm(tie_embeddings=False)
    q = pytransformer.quantize(copy.deepcopy(model))
    assert isinstance(q.embed.tok, QuantizedEmbedding) and isinstance(q.lm_head, QuantizedLinear)
    assert q.embed.tok.head is not q.lm_head  # an untied table of its own, each row within half a step of the float
    table, steps = q.embed.tok(torch.arange(V)).double(), q.embed.tok.head.scale.double()[:, None]
    assert ((table - model.embed.tok.weight.double()).abs() <= steps / 2 + 1e-6 * steps).all()
    ids = torch.randint(0, V, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(q(ids), model(ids), atol=0.02 * model(ids).abs().max().item(), rtol=0)
    # Cross-attention projects slices of the fused Q|K|V weight; the shared embedding is tied to the output head.
    s2s = Seq2SeqTransformer(transformer_base(vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=1,
                                              n_decoder_layers=2, dropout=0.0)).eval()
    src, tgt = torch.randint(0, V, (2, 7)), torch.randint(0, V, (2, 5))
    with torch.no_grad():
        want = s2s(src, tgt)
        qs = pytransformer.quantize(copy.deepcopy(s2s))
        torch.testing.assert_close(qs(src, tgt), want, atol=0.02 * want.abs().max().item(), rtol=0)
    out = qs.generate(src, max_new_tokens=4, bos_id=1, eos_id=2)
    assert torch.equal(out, qs.generate(src, max_new_tokens=4, bos_id=1, eos_id=2, use_cache=False))
    bert = EncoderModel(bert_base(vocab_size=V, d_model=32, n_heads=4, n_layers=1, d_ff=64, max_len=16, dropout=0.0),
                        mlm_head=True).eval()
    with torch.no_grad():
        h = bert(src)
        want = bert.mlm_logits(h)
        qb = pytransformer.quantize(copy.deepcopy(bert))
        torch.testing.assert_close(qb.mlm_logits(qb(src)), want, atol=0.03 * want.abs().max().item(), rtol=0)
    assert qb.embed.tok.head is qb.mlm_head.decoder


def test_size_reduction():
    model = tiny_lm(d_model=128, d_ff=512, vocab_size=512)
    before = state_dict_bytes(model)
    q = pytransformer.quantize(copy.deepcopy(model))
    after = state_dict_bytes(q)
    linear_elems = sum(m.weight.numel() for m in q.modules() if isinstance(m, QuantizedLinear))
    float_elems = sum(t.numel() for t in [*q.parameters(), *q.buffers()] if t.is_floating_point())
    assert after == linear_elems + 4 * float_elems  # int8 weights; scales, biases, norms and positions in float32
    assert after < 0.3 * before
    buf = io.BytesIO()
    torch.save(q.state_dict(), buf)
    assert len(buf.getvalue()) < after + 64 * 1024  # torch.save stores the tied table once as well


def test_state_dict_round_trip():
    torch.manual_seed(0)
    q = pytransformer.quantize(tiny_lm())
    buf = io.BytesIO()
    torch.save(q.state_dict(), buf)
    torch.manual_seed(1)
    fresh = pytransformer.quantize(tiny_lm())  # other weights, same structure
    fresh.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    ids = torch.randint(0, V, (2, 10))
    with torch.no_grad():
        assert torch.equal(fresh(ids), q(ids))
    assert fresh.embed.tok.head is fresh.lm_head


def test_dtype_and_device_moves_keep_the_tie():
    q = pytransformer.quantize(tiny_lm()).to(torch.bfloat16)
    assert q.lm_head.weight.dtype == torch.int8 and q.lm_head.scale.dtype == torch.bfloat16
    assert q.embed.tok.head is q.lm_head
    ids = torch.randint(0, V, (2, 6))
    with torch.no_grad():
        assert q(ids).dtype == torch.bfloat16
    assert q.generate(ids, 3).shape == (2, 9)


def test_compile(device):
    q = pytransformer.quantize(tiny_lm(positional="rotary", n_kv_heads=2)).to(device)
    ids = torch.randint(0, V, (2, 8), device=device)
    compiled = torch.compile(q, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), q(ids))
        # A cached decode step.
        cache, ref_cache = q.new_cache(2, 16), q.new_cache(2, 16)
        compiled(ids, cache=cache)
        q(ids, cache=ref_cache)
        step = torch.compile(lambda t: q(t, cache=cache), fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(step(ids[:, :1]), q(ids[:, :1], cache=ref_cache))


def test_compile_inductor():
    q = pytransformer.quantize(tiny_lm())
    ids = torch.randint(0, V, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(q, fullgraph=True)(ids), q(ids), atol=1e-4, rtol=1e-4)


def test_tied_embedding_with_max_norm_is_refused():
    emb = torch.nn.Embedding(10, 4, max_norm=1.0)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    with pytest.raises(ValueError, match="max_norm"):
        pytransformer.quantize(torch.nn.ModuleDict({"emb": emb, "head": head}))


def test_single_linear():
    linear = torch.nn.Linear(8, 6)
    q = pytransformer.quantize(linear)
    assert isinstance(q, QuantizedLinear)
    x = torch.randn(3, 8)
    want = F.linear(reference.int8_linear_x(x), q.dequantized_weight().double(), q.bias.double())
    assert ((q(x).double() - want).abs() <= 1e-5 + 1e-5 * want.abs()).all()


def test_x_bits_8(device):
    """quantize(model, x_bits=8) sets every QuantizedLinear, new or already quantized, to quantize x to 8 bits too: a
    layer then equals int8_linear with x_bits=8, and the model stays close to the float one (W8A8: about 1% more
    error than weight-only), cached generation equal to uncached, compiled with no graph break."""
    model = tiny_lm().to(device)
    ids = torch.randint(0, V, (2, 12), device=device)
    with torch.no_grad():
        want = model(ids)
    q = pytransformer.quantize(copy.deepcopy(model), x_bits=8)
    layers = [m for m in q.modules() if isinstance(m, QuantizedLinear)]
    assert layers and all(m.x_bits == 8 for m in layers) and "x_bits=8" in repr(layers[0])
    x = torch.randn(3, layers[0].in_features, device=device)
    with torch.no_grad():
        assert torch.equal(layers[0](x), ops.int8_linear(x, layers[0].weight, layers[0].scale, layers[0].bias,
                                                         x_bits=8))
        got = q(ids)
    err = (got - want).abs()
    assert err.max() < 0.06 * want.abs().max() and err.mean() < 0.06 * want.abs().mean()
    varied_q = pytransformer.quantize(varied(tiny_lm()).to(device), x_bits=8)  # tokens that vary from step to step
    assert torch.equal(varied_q.generate(ids[:, :5], 6), varied_q.generate(ids[:, :5], 6, use_cache=False))
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(q, fullgraph=True, backend="aot_eager")(ids), got)
    assert all(m.x_bits == 16 for m in pytransformer.quantize(q).modules() if isinstance(m, QuantizedLinear))
    with pytest.raises(ValueError, match="x_bits: expected 8 or 16, got 4"):  # the op's own check and message
        pytransformer.quantize(q, x_bits=4)
    fresh = copy.deepcopy(model)
    with pytest.raises(ValueError, match="x_bits"):
        pytransformer.quantize(fresh, x_bits=4)
    assert not any(isinstance(m, QuantizedLinear) for m in fresh.modules())  # checked before the model changes
    with pytest.raises(ValueError, match="x_bits"):
        QuantizedLinear(4, 4, x_bits=12)
    with pytest.raises(ValueError, match="x_bits"):
        layers[0].x_bits = 4

