"""generate() settings (DecoderLM and Seq2SeqTransformer): bad values raise ValueError naming the argument before any
work; max_new_tokens=0 returns the prompt; top_k=0 and top_p=1 disable their filters, as in Hugging Face."""
import pytest
import torch

from pytransformer.models import DecoderLM, Seq2SeqTransformer, gpt2_small, next_token, transformer_base

V = 32


def lm():
    torch.manual_seed(0)
    return DecoderLM(gpt2_small(vocab_size=V, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=32,
                                dropout=0.0)).eval()


def seq2seq():
    torch.manual_seed(0)
    return Seq2SeqTransformer(transformer_base(vocab_size=V, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1,
                                               n_decoder_layers=1, max_len=32, dropout=0.0)).eval()


def generate(model, **kwargs):
    prompt = torch.randint(3, V, (2, 4))
    with torch.no_grad():
        if isinstance(model, DecoderLM):
            return prompt, model.generate(prompt, **{"max_new_tokens": 3, **kwargs})
        return prompt, model.generate(prompt, **{"max_new_tokens": 3, "bos_id": 1, "eos_id": 2, **kwargs})


MODELS = [lm, seq2seq]
BAD = [
    ("max_new_tokens", {"max_new_tokens": -1}),
    ("max_new_tokens", {"max_new_tokens": 2.5}),
    ("beam_size", {"beam_size": 0}),
    ("top_k", {"top_k": -1, "do_sample": True}),
    ("top_k", {"top_k": 1.5, "do_sample": True}),
    ("top_p", {"top_p": -0.5, "do_sample": True}),
    ("top_p", {"top_p": 0.0, "do_sample": True}),
    ("top_p", {"top_p": 1.5, "do_sample": True}),
    ("temperature", {"temperature": 0.0, "do_sample": True}),
    ("temperature", {"temperature": -1.0, "do_sample": True}),
    ("temperature", {"temperature": float("nan"), "do_sample": True}),
    ("cache_dtype", {"cache_dtype": torch.int32}),
    ("cache_dtype", {"cache_dtype": "bfloat16"}),
    ("cache_dtype", {"cache_dtype": torch.bfloat16, "use_cache": False}),
]


@pytest.mark.parametrize("make", MODELS)
@pytest.mark.parametrize("name,kwargs", BAD)
def test_bad_settings_raise_value_error_naming_the_argument(make, name, kwargs):
    with pytest.raises(ValueError, match=f"^{name}: "):
        generate(make(), **kwargs)


@pytest.mark.parametrize("make", MODELS)
@pytest.mark.parametrize("beam_size", [1, 2])
def test_zero_new_tokens_returns_the_prompt(make, beam_size):
    prompt, out = generate(make(), max_new_tokens=0, beam_size=beam_size)
    bos_only = torch.ones(prompt.shape[0], 1, dtype=torch.long)  # seq2seq: the target starts with bos_id = 1
    assert torch.equal(out, prompt if make is lm else bos_only)


@pytest.mark.parametrize("make", MODELS)
def test_top_k_zero_and_top_p_one_mean_no_filter(make):
    model = make()
    outs = []
    for kwargs in ({}, {"top_k": 0}, {"top_p": 1.0}, {"top_k": 0, "top_p": 1.0}):
        torch.manual_seed(1)
        prompt = torch.randint(3, V, (2, 4))
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            if isinstance(model, DecoderLM):
                outs.append(model.generate(prompt, 5, do_sample=True, generator=g, **kwargs))
            else:
                outs.append(model.generate(prompt, max_new_tokens=5, bos_id=1, eos_id=2, do_sample=True, generator=g,
                                           **kwargs))
    assert all(torch.equal(o, outs[0]) for o in outs[1:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_greedy_pick_is_argmax(dtype):
    """The greedy token of each row is argmax's: the first of equal maxima (bfloat16 rounding makes many), a NaN
    where a row has one."""
    torch.manual_seed(0)
    logits = torch.randn(9, 1000, dtype=torch.float64).mul(3).round().to(dtype)  # ties in every row
    logits[3, 17] = logits[3].max()  # a tie with the row's first maximum, later in the row
    logits[4, 500] = float("nan")
    assert torch.equal(next_token(logits), logits.argmax(-1)) and next_token(logits)[4] == 500


@pytest.mark.parametrize("make", MODELS)
def test_cache_dtype_sets_the_caches_dtype_and_the_tokens_follow_the_model(make, monkeypatch):
    """generate(cache_dtype=torch.bfloat16) decodes through a bfloat16 cache, and each greedy token is the argmax of
    the uncached forward over the tokens before it, up to bfloat16's rounding of the attention inputs."""
    model = make()
    dtypes = []
    new_cache = model.new_cache
    monkeypatch.setattr(model, "new_cache", lambda *a, **k: dtypes.append(k.get("dtype")) or new_cache(*a, **k))
    prompt, out = generate(model, max_new_tokens=6, cache_dtype=torch.bfloat16)
    assert dtypes == [torch.bfloat16]
    with torch.no_grad():
        for t in range(out.shape[1] - (4 if make is lm else 1)):
            if make is lm:
                logits = model(out[:, :4 + t])[:, -1]
            else:
                logits = model(prompt, out[:, :1 + t])[:, -1]
            chosen = logits.gather(1, out[:, -6 + t, None])[:, 0]
            assert (chosen >= logits.max(1).values - 0.05).all(), t
