"""FeedForward against plain PyTorch (float64) for every activation."""
import pytest
import torch
import torch.nn.functional as F

from pytransformer.nn import FeedForward


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu"])
def test_matches_reference(activation):
    ff = FeedForward(16, 24, activation).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    h = F.linear(x, ff.fc1.weight, ff.fc1.bias)
    act = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
           "silu": lambda t: t * torch.sigmoid(t)}
    gated = {"swiglu": act["silu"], "geglu": act["gelu_tanh"]}
    h = gated[activation](h[..., :24]) * h[..., 24:] if activation in gated else act[activation](h)
    torch.testing.assert_close(ff(x), F.linear(h, ff.fc2.weight, ff.fc2.bias))
    assert ff.fc1.out_features == (48 if activation in gated else 24)


def test_dropout_only_in_training():
    ff = FeedForward(8, 16, dropout=0.5)
    x = torch.randn(4, 8)
    assert torch.equal(ff.eval()(x), ff(x))
    assert not torch.equal(ff.train()(x), ff.eval()(x))


def test_bad_activation():
    with pytest.raises(ValueError, match="activation"):
        FeedForward(8, 16, "tanh")
