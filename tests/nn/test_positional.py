"""Positional encodings: sinusoidal formula, learned table, rotary against a complex-number reference."""
import math

import pytest
import torch

from pytransformer.nn import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding


def test_sinusoidal_formula():
    pe = SinusoidalPositionalEncoding(10, max_len=50)
    p, i = 17, 3
    assert math.isclose(pe(torch.tensor(p))[2 * i].item(), math.sin(p / 10000 ** (2 * i / 10)), abs_tol=1e-6)
    assert math.isclose(pe(torch.tensor(p))[2 * i + 1].item(), math.cos(p / 10000 ** (2 * i / 10)), abs_tol=1e-6)
    assert pe(torch.arange(4)[None].expand(2, 4)).shape == (2, 4, 10)
    assert len(pe.state_dict()) == 0


@pytest.mark.parametrize("d", [10, 11])
def test_sinusoidal_halves_formula(d):
    """halves=True: the sines of every frequency, then the cosines (ceil(d/2) sines for an odd d, as Marian's
    table has)."""
    pe = SinusoidalPositionalEncoding(d, max_len=50, halves=True)
    p, n_sin = 17, (d + 1) // 2
    for i in range(n_sin):
        assert math.isclose(pe(torch.tensor(p))[i].item(), math.sin(p / 10000 ** (2 * i / d)), abs_tol=1e-6)
    for i in range(d // 2):
        assert math.isclose(pe(torch.tensor(p))[n_sin + i].item(), math.cos(p / 10000 ** (2 * i / d)), abs_tol=1e-6)
    interleaved = SinusoidalPositionalEncoding(d, max_len=50).pe
    assert torch.equal(pe.pe, torch.cat([interleaved[:, 0::2], interleaved[:, 1::2]], 1))


def test_learned_is_a_table():
    pe = LearnedPositionalEmbedding(12, 6)
    assert torch.equal(pe(torch.tensor([3, 0])), pe.weight[[3, 0]])


def test_rotary_matches_complex_reference():
    rope = RotaryEmbedding(8, max_len=32).double()
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    z = torch.complex(x[..., :4], x[..., 4:])  # pairs (i, i + D/2)
    angle = positions[:, None, :, None] * 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    rz = z * torch.polar(torch.ones_like(angle), angle)
    torch.testing.assert_close(rope(x, positions), torch.cat([rz.real, rz.imag], -1))
    torch.testing.assert_close(rope(x), rope(x, torch.arange(5)))


def test_rotary_scores_depend_on_relative_position():
    rope = RotaryEmbedding(8).double()
    q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64)
    s = lambda i, j: (rope(q, torch.tensor([i])) * rope(k, torch.tensor([j]))).sum()  # noqa: E731
    torch.testing.assert_close(s(5, 2), s(13, 10))


def test_rotary_odd_head_dim():
    with pytest.raises(ValueError, match="head_dim"):
        RotaryEmbedding(7)


@pytest.mark.parametrize("make", [lambda: RotaryEmbedding(8, base=500.0), lambda: SinusoidalPositionalEncoding(10, 50)])
def test_buffers_are_recomputed_after_the_meta_device(make):
    """Built on the meta device and materialised with to_empty, the derived tables equal a CPU build's."""
    with torch.device("meta"):
        lazy = make()
    lazy.to_empty(device="cpu")
    for (name, a), b in zip(lazy.named_buffers(), make().buffers()):
        assert torch.equal(a, b), name


def test_rotary_frequencies_stay_float32_when_cast_down():
    rope = RotaryEmbedding(8).to(torch.bfloat16)
    assert rope.inv_freq.dtype == torch.float32 and torch.equal(rope.inv_freq, RotaryEmbedding(8).inv_freq)
    x = torch.randn(1, 2, 3, 8, dtype=torch.bfloat16)
    assert rope(x, torch.tensor([100, 2000, 30000])).dtype == torch.bfloat16


def test_rotary_has_no_position_limit():
    rope = RotaryEmbedding(8, max_len=4).double()
    x = torch.randn(1, 1, 1, 8, dtype=torch.float64)
    assert torch.isfinite(rope(x, torch.tensor([10 ** 6]))).all()


def test_unsupported_rope_scaling():
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        RotaryEmbedding(8, scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="needs .*low_freq_factor"):
        RotaryEmbedding(8, scaling={"rope_type": "llama3", "factor": 8.0})
