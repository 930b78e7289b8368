"""EncoderModel: BERT import on a padded batch, masks, pooler and MLM head, torch.compile of a training step."""
import pytest
import torch
import torch.nn.functional as F

from pytransformer.models import EncoderModel, bert_base
from tests.helpers import assert_compiled_training_step_matches

V = 64


def tiny(**overrides):
    torch.manual_seed(0)
    return EncoderModel(bert_base(**{"vocab_size": V, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64,
                                     "max_len": 32, "dropout": 0.0, **overrides}), mlm_head=True).eval()


def test_from_hf_reproduces_bert_on_padded_batch():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.BertModel(transformers.BertConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32)).eval()
    ours = EncoderModel.from_hf(hf)
    ids, types = torch.randint(0, V, (3, 9)), torch.randint(0, 2, (3, 9))
    lengths = torch.tensor([9, 4, 6])
    attention_mask = (torch.arange(9)[None] < lengths[:, None]).long()
    with torch.no_grad():
        expected = hf(ids, attention_mask=attention_mask, token_type_ids=types)
        hidden = ours(ids, attention_mask=attention_mask, token_type_ids=types)
        torch.testing.assert_close(hidden, expected.last_hidden_state, atol=1e-5, rtol=1e-5)  # padding rows too
        torch.testing.assert_close(ours(ids, key_lengths=lengths, token_type_ids=types), hidden, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(ours.pool(hidden), expected.pooler_output, atol=1e-5, rtol=1e-5)


def test_padding_does_not_change_real_tokens():
    model = tiny()
    ids = torch.randint(0, V, (1, 5))
    padded = torch.cat([ids, torch.randint(0, V, (1, 3))], 1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, key_lengths=torch.tensor([5]))[:, :5], model(ids),
                                   atol=1e-5, rtol=1e-5)


def test_heads():
    model = tiny()
    assert model.mlm_head.decoder.weight is model.embed.tok.weight
    hidden = model(torch.randint(0, V, (2, 6)))
    assert model.mlm_logits(hidden).shape == (2, 6, V) and model.pool(hidden).shape == (2, 32)
    with pytest.raises(ValueError, match="mlm_head"):
        EncoderModel(bert_base(vocab_size=V, d_model=32, n_heads=4, n_layers=1, d_ff=64)).mlm_logits(hidden)


@pytest.mark.parametrize("norm", ["pre", "sandwich"])
def test_other_norms_have_final_norm(norm):
    model = tiny(norm=norm)
    assert model.embed.norm is None and model.encoder.norm is not None
    assert model(torch.randint(0, V, (2, 6))).shape == (2, 6, 32)


def test_compile_training_step():
    model = tiny(pooler=False).train()
    ids, labels = torch.randint(0, V, (2, 8)), torch.randint(0, V, (2, 8))
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])

    def loss_fn(ids, mask):
        return F.cross_entropy(model.mlm_logits(model(ids, attention_mask=mask)).flatten(0, 1), labels.flatten())
    assert_compiled_training_step_matches(model, loss_fn, ids, mask)


@pytest.mark.parametrize("padding", ["attention_mask", "key_lengths", "left"])
def test_nan_at_padding_does_not_reach_real_tokens(padding):
    """NaN embeddings at the padding positions (right padding by attention_mask or key_lengths, left padding by
    attention_mask) leave the hidden states of the real tokens as those of a batch padded with finite embeddings."""
    model = tiny()
    ids = torch.randint(0, V, (3, 8))
    lengths = torch.tensor([8, 3, 5])
    real = torch.arange(8)[None] < lengths[:, None]  # [B, L]
    if padding == "left":
        real = real.flip(1)
    kwargs = {"key_lengths": lengths} if padding == "key_lengths" else {"attention_mask": real.long()}
    poison = lambda module, inputs, out: out.masked_fill(~real[..., None], float("nan"))  # noqa: E731
    with torch.no_grad():
        clean = model(ids, **kwargs)
        handle = model.embed.register_forward_hook(poison)
        try:
            hidden = model(ids, **kwargs)
        finally:
            handle.remove()
    torch.testing.assert_close(hidden[real], clean[real], atol=1e-5, rtol=1e-5)
    assert hidden[~real].isnan().all()
