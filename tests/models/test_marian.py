"""Marian translation checkpoints (MarianMTModel, the Helsinki-NLP opus-mt models) without a download: a tiny random
model built with transformers and saved with save_pretrained, loaded by Seq2SeqTransformer.from_hf and
from_pretrained: logits (source padded), cached decoding step by step, greedy and beam-search tokens equal Hugging
Face's; bfloat16 and int8 loads; what is refused."""
import json

import pytest
import torch

from pytransformer.models import Seq2SeqTransformer
from pytransformer.nn import QuantizedLinear

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

V, PAD, EOS = 99, 98, 0
CONFIG = {"vocab_size": V, "d_model": 32, "encoder_layers": 2, "decoder_layers": 3, "encoder_attention_heads": 4,
          "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "max_position_embeddings": 64,
          "pad_token_id": PAD, "decoder_start_token_id": PAD, "eos_token_id": EOS, "forced_eos_token_id": EOS,
          "scale_embedding": True, "activation_function": "swish"}  # as the opus-mt models' configs
SRC = torch.randint(1, PAD, (3, 11), generator=torch.Generator().manual_seed(0))
LENS = torch.tensor([11, 6, 1])  # source rows padded on the right
MASK = (torch.arange(11)[None] < LENS[:, None]).long()


def build():
    """A random MarianMTModel whose weights and norms are redrawn, so that a wrong mapping shows (its sinusoidal
    tables, which transformers computes, stay)."""
    torch.manual_seed(0)
    model = transformers.MarianMTModel(transformers.MarianConfig(**CONFIG)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:
                continue
            if p.dim() > 1:
                p.normal_(0, 0.3)
            else:
                p.uniform_(0.5, 1.5) if name.endswith("weight") else p.uniform_(-0.5, 0.5)
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = build()
    path = tmp_path_factory.mktemp("marian")
    model.save_pretrained(path)
    return model, path


def _hf_logits(hf, tgt):
    with torch.no_grad():
        return hf(input_ids=SRC, attention_mask=MASK, decoder_input_ids=tgt).logits


def test_logits_match(saved):
    hf, path = saved
    tgt = torch.randint(1, PAD, (3, 9))
    expected = _hf_logits(hf, tgt)
    for ours in (Seq2SeqTransformer.from_hf(hf), Seq2SeqTransformer.from_pretrained(path)):
        assert not ours.training and ours.config.positional == "sinusoidal_halves"
        with torch.no_grad():
            torch.testing.assert_close(ours(SRC, tgt, src_key_lengths=LENS), expected, atol=1e-4, rtol=1e-4)


def test_cached_decoding_matches_teacher_forcing(saved):
    """One target token at a time through the KV cache (positions after the cache's rows, cross-attention K/V cached
    once) gives Hugging Face's teacher-forced logits at every position."""
    hf, path = saved
    ours = Seq2SeqTransformer.from_pretrained(path)
    tgt = torch.randint(1, PAD, (3, 9))
    expected = _hf_logits(hf, tgt)
    with torch.no_grad():
        cache = ours.new_cache(3, tgt.shape[1], SRC.shape[1])
        ours.decoder.cache_memory(cache, ours.encode(SRC, LENS), LENS)
        for t in range(tgt.shape[1]):
            torch.testing.assert_close(ours.decode(tgt[:, t:t + 1], cache=cache)[:, -1], expected[:, t], atol=1e-4,
                                       rtol=1e-4)


def _until_eos(row: list[int]) -> list[int]:
    """A generated row up to its first EOS (Hugging Face pads a finished row, ours repeats EOS)."""
    return row[:row.index(EOS) + 1] if EOS in row else row


@pytest.mark.parametrize("beams", [1, 4])
@pytest.mark.parametrize("banned", [0, 3])
def test_generation_matches(saved, beams, banned):
    """Greedy and beam-search tokens equal transformers' generate with Marian's settings: decoding starts at the pad
    id, which is never generated (the opus-mt models' bad_words_ids; ours suppress_ids). transformers also forces EOS
    as the last of max_new_tokens, so it runs one token longer. With the `banned` tokens the model prefers suppressed
    too, beam search scores the suppressed distribution as transformers does (log-probabilities of the whole
    vocabulary, the suppressed ones -inf, not renormalised)."""
    hf, path = saved
    ours = Seq2SeqTransformer.from_pretrained(path)
    n, kwargs = 12, {"bos_id": PAD, "eos_id": EOS}
    free = ours.generate(SRC, LENS, max_new_tokens=n, **kwargs, suppress_ids=[PAD])[:, 1:].flatten().tolist()
    suppressed = [PAD] + sorted(set(free), key=free.count)[-banned:] if banned else [PAD]
    expected = hf.generate(input_ids=SRC, attention_mask=MASK, max_new_tokens=n + 1, num_beams=beams,
                           bad_words_ids=[[i] for i in suppressed])[:, :n + 1]
    got = ours.generate(SRC, LENS, max_new_tokens=n, beam_size=beams, suppress_ids=suppressed, **kwargs)
    assert got[:, 0].eq(PAD).all() and not torch.isin(got[:, 1:], torch.tensor(suppressed)).any()
    assert [_until_eos(r) for r in got.tolist()] == [_until_eos(r) for r in expected.tolist()]


def test_suppress_ids(saved):
    ours = Seq2SeqTransformer.from_hf(saved[0])
    kwargs = {"max_new_tokens": 6, "bos_id": PAD, "eos_id": EOS}
    free = ours.generate(SRC, LENS, **kwargs)
    banned = sorted(set(free[:, 1:].flatten().tolist()))
    held = ours.generate(SRC, LENS, **kwargs, suppress_ids=banned)
    assert not torch.isin(held[:, 1:], torch.tensor(banned)).any()
    for bad in ([V], [-1], [1.0], 3, [True]):
        with pytest.raises(ValueError, match=r"suppress_ids: expected None or a list of token ids in \[0, 99\)"):
            ours.generate(SRC, LENS, **kwargs, suppress_ids=bad)


def test_bfloat16_and_int8(saved):
    hf, path = saved
    tgt = torch.randint(1, PAD, (3, 9))
    expected = _hf_logits(hf, tgt)
    bf16 = Seq2SeqTransformer.from_pretrained(path, dtype=torch.bfloat16)
    int8 = Seq2SeqTransformer.from_pretrained(path, quantize=True)
    assert bf16.lm_head.weight.dtype == torch.bfloat16
    assert isinstance(int8.encoder.layers[0].ff.fc1, QuantizedLinear)
    scale = expected.abs().max()
    with torch.no_grad():
        for model, bound in ((bf16, 0.05), (int8, 0.05)):
            assert (model(SRC, tgt, src_key_lengths=LENS).float() - expected).abs().max() < bound * scale
            model.generate(SRC, LENS, max_new_tokens=4, bos_id=PAD, eos_id=EOS, suppress_ids=[PAD])


def _copy(saved, tmp_path, **config):
    """The saved folder copied to tmp_path with config.json's fields replaced by `config`."""
    hf, path = saved
    d = {**json.loads((path / "config.json").read_text()), **config}
    (tmp_path / "config.json").write_text(json.dumps(d))
    (tmp_path / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())
    return tmp_path


@pytest.mark.parametrize("field,value", [
    ("share_encoder_decoder_embeddings", False), ("tie_word_embeddings", False), ("scale_embedding", False),
    ("decoder_attention_heads", 2), ("decoder_ffn_dim", 32), ("decoder_vocab_size", 50), ("attention_dropout", 0.1),
    ("activation_dropout", 0.1), ("decoder_layerdrop", 0.1), ("activation_function", "gelu_fast")])
def test_what_marian_config_is_refused(saved, tmp_path, field, value):
    """A config field whose value makes transformers compute what our model does not is refused, naming it."""
    with pytest.raises(ValueError, match=rf"config.json: {field}: .*{value!r}.* not supported"):
        Seq2SeqTransformer.from_pretrained(_copy(saved, tmp_path, **{field: value}))


def test_nonzero_final_logits_bias_is_refused(saved, tmp_path):
    path = _copy(saved, tmp_path)
    tensors = safetensors_torch.load_file(path / "model.safetensors")
    for bias in (tensors["final_logits_bias"].index_fill(1, torch.tensor([5]), 1.0), torch.zeros(1, V + 1)):
        tensors["final_logits_bias"] = bias
        safetensors_torch.save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
        with pytest.raises(ValueError, match=rf"model.safetensors: final_logits_bias: expected zeros of shape "
                                             rf"\[1, {V}\]"):
            Seq2SeqTransformer.from_pretrained(path)


@pytest.mark.parametrize("copy", ["model.encoder.embed_tokens.weight", "lm_head.weight"])
def test_tied_copy_that_differs_is_refused(saved, tmp_path, copy):
    """A copy of the shared embedding (as state_dict() holds them) is skipped when equal, refused when not."""
    path = _copy(saved, tmp_path)
    tensors = safetensors_torch.load_file(path / "model.safetensors")
    tensors[copy] = tensors["model.shared.weight"].clone()
    safetensors_torch.save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    Seq2SeqTransformer.from_pretrained(path)
    tensors[copy][3, 1] += 1.0
    safetensors_torch.save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"{copy}: differs from the embedding model.shared.weight while "
                                         r"tie_word_embeddings is true"):
        Seq2SeqTransformer.from_pretrained(path)


def test_not_a_seq2seq_architecture(saved, tmp_path):
    with pytest.raises(ValueError, match=r"model_type: 'llama' is not a Seq2SeqTransformer architecture \(those are "
                                         r"\['marian'\]\)"):
        Seq2SeqTransformer.from_pretrained(_copy(saved, tmp_path, model_type="llama"))


def test_more_target_tokens_than_positions_is_refused(saved):
    """Marian's sinusoidal table has max_position_embeddings rows (64 here): bos_id + 63 new tokens fit."""
    ours = Seq2SeqTransformer.from_hf(saved[0])
    assert ours.generate(SRC[:1], max_new_tokens=63, bos_id=PAD, eos_id=None).shape == (1, 64)
    with pytest.raises(ValueError, match=r"max_new_tokens: bos_id \+ 64 new tokens exceed the model's 64 target "
                                         r"positions \(max_len\)"):
        ours.generate(SRC[:1], max_new_tokens=64, bos_id=PAD, eos_id=EOS)


def test_legacy_fields_of_the_published_configs(saved, tmp_path):
    """The opus-mt models' config.json files (converted with transformers 4.x) carry BART-era fields that
    transformers' Marian ignores; so does the loader, and the logits stay Hugging Face's."""
    hf, _ = saved
    legacy = {"normalize_before": False, "normalize_embedding": False, "static_position_embeddings": True,
              "add_bias_logits": False, "add_final_layer_norm": False, "extra_pos_embeddings": V,
              "bad_words_ids": [[PAD]], "num_beams": 4, "max_length": 512, "bos_token_id": 0,
              "classif_dropout": 0.0, "id2label": {"0": "LABEL_0"}, "transformers_version": "4.22.0.dev0"}
    tgt = torch.randint(1, PAD, (3, 5))
    with torch.no_grad():
        got = Seq2SeqTransformer.from_pretrained(_copy(saved, tmp_path, **legacy))(SRC, tgt, src_key_lengths=LENS)
    torch.testing.assert_close(got, _hf_logits(hf, tgt), atol=1e-4, rtol=1e-4)
