"""pytransformer.check on the CPU: int8_linear's cases pass on whatever path this processor takes (x quantized to 16
bits with integer dot products, AVX-512 VNNI or AVX2, as is without them; as is in the CUDA kernels, which the host emulator runs on CPU tensors), and
fail on planted errors of the size of real bugs: a bias dropped, the last product of every dot product dropped (a tail
bug), x quantized to 15 bits instead of 16. The command's table and exit status are tested in test_cli.py."""
import pytest
import torch

import pytransformer
from pytransformer import check
from pytransformer.ops import reference

from tests.helpers import CAPPED_ISA_LEVELS, run_under_isa

# (M, K, N): the few-rows kernel at 3 and 16 rows (K 4096: 16-byte weight loads, several K slices), more rows (with
# AVX-512 VNNI the same kernel 8 rows a call, with AVX2 the GEMM, else dequantized weights and ATen's GEMM).
SHAPES = [(3, 15, 7), (16, 4096, 7), (40, 100, 24)]
OPS = torch.ops.pytransformer


class Planted:
    """torch.ops.pytransformer with int8_linear replaced."""

    def __init__(self, int8_linear):
        self.int8_linear = int8_linear

    def __getattr__(self, name):
        return getattr(OPS, name)


def failed_cases(int8_linear, kernel_device="cpu") -> set[str]:
    """The names of the int8_linear cases of SHAPES that fail with this int8_linear as the kernel of `kernel_device`,
    on CPU tensors, from a fixed seed."""
    torch.manual_seed(0)
    checks = check.KernelChecks(Planted(int8_linear), "cpu", kernel_device)
    checks.check_int8_linear(SHAPES)
    return {f.split(":")[0] for f in checks.failures}


def cases(variants, shapes=SHAPES) -> set[str]:
    """The names of the float32 cases of these variants (check.KernelChecks.check_int8_linear)."""
    return {f"int8_linear [M {m}, K {k}, N {n}] float32 {v}" for m, k, n in shapes for v in variants}


def without_bias(x, weight, scale, bias, x_bits):
    return OPS.int8_linear(x, weight, scale, None, x_bits)


def without_last_product(x, weight, scale, bias, x_bits):
    weight = weight.clone()
    weight[:, -1] = 0
    return OPS.int8_linear(x, weight, scale, bias, x_bits)


def x_on_15_bits(x, weight, scale, bias, x_bits):
    """x_bits=16 with x quantized per row to every other level of the 16-bit grid."""
    if x_bits == 16:
        q, x_scale = reference.quantize_x_rows(x, 16)
        x = (torch.round(q / 2) * (x_scale * 2)).to(x.dtype)
    return OPS.int8_linear(x, weight, scale, bias, x_bits)


def as_cuda_kernels(x, weight, scale, bias, x_bits):
    """What the CUDA kernels compute: x as it is (rounded to 8 bits with x_bits=8), float32 sums."""
    xf = reference.round_x_to_8_bits(x) if x_bits == 8 else x.float()
    return reference.int8_linear(xf, weight, scale.float(), None if bias is None else bias.float()).to(x.dtype)


def test_int8_linear_cases_pass():
    assert failed_cases(OPS.int8_linear) == set()


@pytest.mark.parametrize("isa", CAPPED_ISA_LEVELS)
def test_quick_check_passes_capped(isa):
    """Every op's quick cases (`check --quick`, which CI runs at this processor's best level) with the CPU kernels
    capped at a lower ISA level: each level's copy of every kernel, which a user's processor may run, against the
    float64 references."""
    run_under_isa(isa, "from pytransformer import check\n"
                       "failures = check.run('cpu', quick=True).failures\n"
                       "assert not failures, failures[:5]")


def test_int8_linear_cases_of_cuda_kernels_on_cpu_tensors():
    assert failed_cases(as_cuda_kernels, kernel_device="cuda") == set()


@pytest.mark.parametrize("planted,expected", [
    (without_bias, cases(("bias", "misaligned"))),
    (without_last_product, cases(("bias", "plain", "misaligned", "x8"))),
    (x_on_15_bits, cases(("bias", "plain", "misaligned"))),
], ids=["bias dropped", "last product dropped", "x on 15 bits"])
def test_planted_errors_fail(planted, expected):
    assert expected <= failed_cases(planted)


class WrongDk(Planted):
    """torch.ops.pytransformer with attention's dK 10% off."""

    def __init__(self):
        super().__init__(OPS.int8_linear)

    def attention_backward(self, *args):
        dq, dk, dv = OPS.attention_backward(*args)
        return dq, dk * 1.1, dv


def dump_wrong_dk_case(dump) -> check.KernelChecks:
    """One windowed attention case with WrongDk, its failures saved under `dump`."""
    torch.manual_seed(0)
    checks = check.KernelChecks(WrongDk(), "cpu", dump=dump)
    checks.attention_case((1, 2, 1, 5, 9, 16, 16), torch.float32, "window")
    return checks


def test_a_failing_attention_case_is_saved_with_what_replays_it(tmp_path):
    """check --dump: a planted wrong dK saves the case (operands, mask arguments, grad_out, out, lse) under the dump
    directory, and the saved operands replay it: the real kernel on them gives the saved reference."""
    checks = dump_wrong_dk_case(tmp_path)
    assert [f.split(":")[0] for f in checks.failures] == ["attention bwd dk [1, 2, 1, 5, 9, 16, 16] float32 window "
                                                          "contiguous"]
    saved = torch.load(tmp_path / "000.pt")
    i = saved["inputs"]
    assert saved["name"] == checks.failures[0].split(":")[0] and i["window"] == 5
    dk = OPS.attention_backward(i["grad_out"], i["q"], i["k"], i["v"], i["out"], i["lse"], None, False, i["window"],
                                None, i["scale"])[1]
    assert check.row_err(dk, saved["ref"]) <= check.ROW_TOL[torch.float32]
    assert check.row_err(saved["out"], saved["ref"]) > check.ROW_TOL[torch.float32]


def test_a_saved_case_replays_through_other_kernels(tmp_path):
    """tools/cuda_emulator/replay.py --cpu on the planted dK case: the saved output fails, the CPU kernels' replay and
    their backward of the saved forward pass (the fault was the planted backward's, not the forward's)."""
    from tools.cuda_emulator import replay
    dump_wrong_dk_case(tmp_path)
    rows = {what: ratio for what, ratio, _ in check.replay(torch.load(tmp_path / "000.pt"), OPS)}
    assert rows["saved output"] > 1
    assert rows["replayed forward and backward"] <= 1 and rows["replayed backward of the saved forward"] <= 1
    assert replay.main(["--cpu", str(tmp_path / "000.pt")]) == 0
    torch.save(dict(torch.load(tmp_path / "000.pt"), ref=torch.load(tmp_path / "000.pt")["ref"] * 1.1),
               tmp_path / "001.pt")  # a reference no kernel meets: the replay fails too
    assert replay.main(["--cpu", str(tmp_path / "001.pt")]) == 1


def test_a_deterministic_case_replays_in_deterministic_mode():
    """A case of check_attention_cases' deterministic pass (name ending " deterministic") runs its replay with
    torch.use_deterministic_algorithms on, as it ran, and leaves the mode as it found it."""
    seen = []

    class Recording(Planted):
        def attention(self, *args):
            seen.append(torch.are_deterministic_algorithms_enabled())
            return OPS.attention(*args)

    q = torch.randn(1, 1, 3, 8)
    case = {"name": "attention fwd [1, 1, 1, 3, 3, 8, 8] float32 causal contiguous deterministic", "out": q,
            "ref": q.double(), "inputs": {"q": q, "k": q, "v": q, "causal": True, "scale": 0.5}}
    check.replay(case, Recording(OPS.int8_linear))
    check.replay(dict(case, name=case["name"].removesuffix(" deterministic")), Recording(OPS.int8_linear))
    assert seen == [True, False] and not torch.are_deterministic_algorithms_enabled()


def test_row_floor_is_the_rms_of_rows_with_terms():
    """Rows that are exactly zero in the reference (keys no query sees) do not lower the floor of the row bound: a
    row that cancels to a tenth of the others, off by 3% of their size (bf16's rounding of the terms it cancels, as
    the key gradients of an H200 run showed, SDPA's alike), passes bfloat16's bound with 128 zero rows beside it (the
    tensor's RMS row size, 0.36, would put it at 0.084 > 0.06); a row off by its own size fails."""
    torch.manual_seed(0)
    rows = torch.randn(20, 16)
    rows /= rows.norm(dim=-1, keepdim=True)  # every row of norm 1
    rows[0] *= 0.1  # a row that cancels
    ref = torch.cat([rows, torch.zeros(128, 16)]).double()
    off = torch.zeros_like(ref)
    off[0, 0] = 0.03
    floor = ((19 + 0.01) / 20) ** 0.5
    assert check.row_err(ref + off, ref) == pytest.approx(0.03 / floor, rel=1e-6)
    assert check.row_err(ref + off, ref) < check.ROW_TOL[torch.bfloat16]
    off[0, 0], off[5] = 0, -ref[5]
    assert check.row_err(ref + off, ref) == pytest.approx(1.0)
