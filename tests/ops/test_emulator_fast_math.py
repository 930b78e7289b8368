"""The emulator's model of the CUDA build's --use_fast_math float32 numerics (tools/cuda_emulator/fast_math.h), as
kernel code gets them (probe_fast_math: the calls rewritten by build.py, inside a launch): each approximate instruction
within the error bound the PTX ISA documents for it and, for most inputs, not the correctly rounded result (its error
is modeled, not left out); subnormal inputs and results flushed to zero."""
import pytest
import torch

pytestmark = pytest.mark.cuda

EXP2F, EXPF, LOG2F, LOGF, RSQRTF, MUL_2_POW_MINUS_100, RECIPROCAL = range(7)


def ulps(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|out - ref| in float32 ulps of ref."""
    r = ref.float().abs()
    return (out.double() - ref).abs() / (torch.nextafter(r, torch.tensor(float("inf"))) - r).double()


def test_exp2f_is_ex2_approx(emu):
    x = torch.linspace(-30, 30, 4099)
    out, ref = emu.probe_fast_math(EXP2F, x), torch.exp2(x.double())
    err = ulps(out, ref)
    assert err.max() <= 2.5  # 2 ulp from the correctly rounded result
    assert (out != ref.float()).float().mean() > 0.5


def test_expf_is_ex2_approx_of_a_rounded_product(emu):
    x = torch.linspace(-40, 40, 4099)
    out, ref = emu.probe_fast_math(EXPF, x), torch.exp(x.double())
    assert (ulps(out, ref) <= 2.5 + 1.173 * x.double().abs()).all()  # the CUDA guide's bound for __expf
    assert (out != ref.float()).float().mean() > 0.5


def test_log2f_and_logf_are_lg2_approx(emu):
    x = torch.logspace(-6, 6, 4099)
    near_one = (x > 0.5) & (x < 2)
    out, ref = emu.probe_fast_math(LOG2F, x).double(), torch.log2(x.double())
    err = torch.where(near_one, (out - ref).abs(), ((out - ref) / ref).abs())
    assert err.max() <= 2 ** -22 + 2 ** -24  # absolute in (0.5, 2), relative elsewhere, plus float32 rounding
    assert (out != ref.float().double()).double().mean() > 0.5
    out = emu.probe_fast_math(LOGF, x).double()
    assert ((out - torch.log(x.double())).abs() <= 0.6931 * (2 ** -22 + 2 ** -23) * ref.abs().clamp(min=1)).all()


def test_rsqrtf_is_rsqrt_approx(emu):
    x = torch.logspace(-30, 30, 4099)
    out, ref = emu.probe_fast_math(RSQRTF, x).double(), x.double().rsqrt()
    assert ((out - ref) / ref).abs().max() <= 2 ** -22.9 + 2 ** -24
    assert (out != ref.float().double()).double().mean() > 0.5


def test_reciprocal_is_rcp_approx(emu):
    x = torch.cat([torch.logspace(-30, 30, 4099), -torch.logspace(-30, 30, 4099)])
    out, ref = emu.probe_fast_math(RECIPROCAL, x), 1 / x.double()
    assert ulps(out, ref).max() <= 1.0 + 1e-6  # within 1 ulp of the exact reciprocal
    assert (out != ref.float()).float().mean() > 0.15  # not the correctly rounded result for many inputs


def test_denormals_are_flushed(emu):
    subnormal = torch.tensor([1e-40, -1e-40])
    assert emu.probe_fast_math(EXP2F, subnormal).tolist() == [1.0, 1.0]  # a subnormal input reads as zero
    assert emu.probe_fast_math(EXP2F, torch.tensor([-130.0, -100.0]))[0] == 0  # 2^-130: a subnormal result
    out = emu.probe_fast_math(MUL_2_POW_MINUS_100, torch.tensor([1e-10, 1.0]))
    assert out[0] == 0 and out[1] == 2.0 ** -100  # plain float32 arithmetic: flushed too
    assert torch.tensor(1e-10) * 2.0 ** -100 != 0  # (outside a launch, the host's arithmetic keeps denormals)
