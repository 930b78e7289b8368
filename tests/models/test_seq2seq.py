"""Seq2SeqTransformer: shapes and tying, cached/uncached and beam decoding, padded sources, torch.compile of a
training step, and a copy task learned on the CPU."""
import time

import pytest
import torch
import torch.nn.functional as F

from pytransformer.models import Seq2SeqTransformer, count_parameters, transformer_base
from tests.helpers import assert_compiled_training_step_matches

V, BOS, EOS = 16, 1, 2


def tiny(**overrides):
    torch.manual_seed(0)
    return Seq2SeqTransformer(transformer_base(**{"vocab_size": V, "d_model": 32, "n_heads": 4, "d_ff": 64,
                                                  "n_encoder_layers": 2, "n_decoder_layers": 2, "dropout": 0.0,
                                                  "max_len": 64, **overrides})).eval()


def test_forward_and_tying():
    model = tiny()
    assert model.lm_head.weight is model.src_embed.tok.weight and model.tgt_embed is model.src_embed
    src, tgt = torch.randint(0, V, (2, 7)), torch.randint(0, V, (2, 5))
    assert model(src, tgt, src_key_lengths=torch.tensor([7, 3])).shape == (2, 5, V)
    untied = tiny(tie_embeddings=False)
    assert count_parameters(untied) - count_parameters(model) == 2 * V * 32


def test_embeddings_are_scaled():
    model = tiny()
    ids = torch.tensor([[5]])
    expected = model.src_embed.tok.weight[5] * 32 ** 0.5 + model.src_embed.pos(torch.tensor(0))
    torch.testing.assert_close(model.src_embed(ids, torch.arange(1))[0, 0], expected)


@pytest.mark.parametrize("norm,n_kv_heads", [("post", None), ("pre", 2), ("sandwich", 1)])
def test_cached_decoding_equals_uncached(norm, n_kv_heads):
    model = tiny(norm=norm, n_kv_heads=n_kv_heads)
    src, lengths = torch.randint(3, V, (3, 6)), torch.tensor([6, 2, 4])
    for kw in ({}, {"beam_size": 3, "length_penalty": 0.6}):
        cached = model.generate(src, lengths, max_new_tokens=7, bos_id=BOS, eos_id=EOS, **kw)
        assert torch.equal(cached, model.generate(src, lengths, max_new_tokens=7, bos_id=BOS, eos_id=EOS,
                                                  use_cache=False, **kw))
    assert cached.shape[0] == 3 and (cached[:, 0] == BOS).all()


def test_beam_size_one_is_greedy_and_padding_is_ignored():
    model = tiny()
    src, lengths = torch.randint(3, V, (3, 6)), torch.tensor([6, 2, 4])
    greedy = model.generate(src, lengths, max_new_tokens=7, bos_id=BOS, eos_id=EOS)
    assert torch.equal(model.generate(src, lengths, max_new_tokens=7, bos_id=BOS, eos_id=EOS, beam_size=1), greedy)
    for b, n in enumerate(lengths.tolist()):
        alone = model.generate(src[b:b + 1, :n], max_new_tokens=7, bos_id=BOS, eos_id=EOS)
        assert torch.equal(alone[0], greedy[b, :alone.shape[1]])


@pytest.mark.parametrize("lengths, match", [
    (torch.tensor([6, 0]), r"src_key_lengths: expected each in \[1, 6\]"),
    (torch.tensor([6, 7]), r"src_key_lengths: expected each in \[1, 6\]"),
    (torch.tensor([6, 2, 4]), r"src_key_lengths: expected an integer tensor of shape \[2\]"),
    (torch.tensor([6.0, 2.0]), r"src_key_lengths: expected an integer tensor"),
])
def test_generate_checks_src_key_lengths(lengths, match):
    with pytest.raises(ValueError, match=match):
        tiny().generate(torch.randint(3, V, (2, 6)), lengths, max_new_tokens=2, bos_id=BOS, eos_id=EOS)


def test_compile_training_step():
    model = tiny(n_kv_heads=2).train()
    src, tgt = torch.randint(3, V, (2, 6)), torch.randint(3, V, (2, 5))

    def loss_fn(src, tgt):
        return F.cross_entropy(model(src, tgt[:, :-1], src_key_lengths=torch.tensor([6, 4])).flatten(0, 1),
                               tgt[:, 1:].flatten())
    assert_compiled_training_step_matches(model, loss_fn, src, tgt)


@torch.no_grad()
def test_compile_decode_step_with_static_cache():
    model = tiny()
    src = torch.randint(3, V, (2, 6))
    cache = model.new_cache(2, 8, 6)
    model.decoder.cache_memory(cache, model.encode(src))
    step = torch.compile(lambda tok: model.decode(tok, cache=cache)[:, -1], fullgraph=True, backend="aot_eager")
    tok, out = torch.full((2, 1), BOS), []
    for _ in range(8):
        out.append(tok)
        tok = step(tok).argmax(-1, keepdim=True)
    assert torch.equal(torch.cat(out, 1), model.generate(src, max_new_tokens=7, bos_id=BOS, eos_id=-1))


def test_copy_task_learns():
    torch.manual_seed(0)
    length = 8
    model = Seq2SeqTransformer(transformer_base(vocab_size=V, d_model=64, n_heads=4, d_ff=128, n_encoder_layers=2,
                                                n_decoder_layers=2, dropout=0.0, norm="pre", max_len=32))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 30))

    def batch(n):
        src = torch.randint(3, V, (n, length))
        return src, torch.cat([torch.full((n, 1), BOS), src, torch.full((n, 1), EOS)], 1)
    start = time.perf_counter()
    # Stops when the mean loss of the last 5 batches is below 0.01: one batch below it stopped some runs early, their
    # accuracy 0.988-1.0 over seeds 0-3 and shifted by the rounding of the float32 GEMM alone; with the mean of 5, seeds
    # 0-5 reached 0.993-1.0 with ATen's GEMM and with ours.
    recent = []
    for step in range(300):
        src, tgt = batch(64)
        loss = F.cross_entropy(model(src, tgt[:, :-1]).flatten(0, 1), tgt[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        warmup.step()
        recent = (recent + [loss.item()])[-5:]
        if len(recent) == 5 and sum(recent) / 5 < 0.01:
            break
    src, tgt = batch(256)
    out = model.eval().generate(src, max_new_tokens=length + 1, bos_id=BOS, eos_id=EOS)
    accuracy = (out[:, 1:] == tgt[:, 1:]).float().mean().item()
    print(f"copy task: {step + 1} steps, {time.perf_counter() - start:.1f} s, token accuracy {accuracy:.4f}")
    assert accuracy >= 0.99
    # A trained model's tokens vary from step to step (a tiny random one repeats one token): cached decoding, greedy
    # and beam search, equals uncached decoding here, where a stale token or cache row would show.
    kw = dict(max_new_tokens=length + 1, bos_id=BOS, eos_id=EOS)
    assert torch.equal(out, model.generate(src, use_cache=False, **kw))
    beams = model.generate(src[:16], beam_size=3, **kw)
    assert torch.equal(beams, model.generate(src[:16], beam_size=3, use_cache=False, **kw))
