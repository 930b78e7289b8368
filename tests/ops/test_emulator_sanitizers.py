"""The host emulator's sanitizers (tools/cuda_emulator/sanitizer.cpp, prelude.h), each against a planted bug in a probe
kernel (tools/cuda_emulator/probes.cpp): racecheck (plain shared-memory stores and loads with a barrier removed,
__syncwarp taken for a block barrier, the cp.async pipeline), initcheck, memcheck (out of bounds, misaligned) and
synccheck. Each report is a RuntimeError raised by the launch, naming the detector, the place and the kernel; the same
kernels without the bug pass. Two bugs that no detector reports are made to give loud wrong values, as they would on a
GPU: an output element that no thread writes (fresh memory is poisoned) and a local read before it is written (a
garbage pattern)."""
import pytest
import torch

pytestmark = pytest.mark.cuda

BUG_KERNEL = "in emu_bug_kernel(long, bool, float const*, float*)"
# bug (probes.cpp: enum Bug) -> what its report says
BUGS = {
    "barrier": (0, r"racecheck: .* at byte \d+ of shared array s, threads \d+ and \d+"),
    "dynamic_barrier": (1, r"racecheck: .* at byte \d+ of dynamic shared memory, threads \d+ and \d+"),
    "warp_barrier": (2, r"racecheck: .* at byte \d+ of shared array s, threads \d+ and \d+"),
    "padding": (3, r"initcheck: read of byte 256 of shared array s, not written in this block, by thread 63"),
    "read_past_row": (4, r"memcheck: out-of-bounds global read of 4 bytes at 0x[0-9a-f]+ by thread 63, 4 bytes past "
                         r"the end of a 256-byte tensor"),
    "write_past_row": (5, r"memcheck: out-of-bounds global write of 4 bytes at 0x[0-9a-f]+ by thread 63, 4 bytes "
                          r"past the end of a 256-byte tensor"),
    "divergent_barrier": (6, r"synccheck: divergent __syncthreads: thread \d+ waits at .*probes.cpp:\d+, thread \d+ "
                             r"at .*probes.cpp:\d+"),
    "exited_before_barrier": (7, r"synccheck: __syncthreads at .*probes.cpp:\d+ reached by 32 of the 64 threads of "
                                 r"block \(0, 0, 0\); the others exited"),
    "past_shared_array": (8, r"memcheck: out-of-bounds shared-memory \(past the end of a __shared__ array\) read of 4 "
                             r"bytes at 0x[0-9a-f]+ by thread 63"),
    "misaligned_global": (11, r"memcheck: misaligned global load of 'const struct float2' at 0x[0-9a-f]+ \(4 bytes "
                              r"past a 8-byte boundary\) by thread \d+ at .*probes.cpp:\d+"),
    "misaligned_shared": (12, r"memcheck: misaligned shared-memory load of 'const struct float2' at 0x[0-9a-f]+ \(4 "
                              r"bytes past a 8-byte boundary\) by thread \d+ at .*probes.cpp:\d+"),
}


@pytest.mark.parametrize("name", BUGS)
def test_correct_kernel_passes(emu, name):
    x = torch.randn(64)
    for _ in range(4):  # the schedule differs from launch to launch
        emu.probe_bug(BUGS[name][0], False, x)


@pytest.mark.parametrize("name", BUGS)
def test_planted_bug_is_reported(emu, name):
    bug, report = BUGS[name]
    for _ in range(4):  # reported in every schedule
        with pytest.raises(RuntimeError, match=report) as e:
            emu.probe_bug(bug, True, torch.randn(64))
        assert BUG_KERNEL in str(e.value)


# bug (probes.cpp: enum Bug) -> whether the output of the planted kernel shows it
GARBAGE = {
    # Every CPU allocation is filled with 0xFF bytes while the emulator is loaded (stubs.cpp): on a GPU a new tensor
    # holds an earlier one's values, not the zeros of fresh pages; an element no thread wrote reads NaN.
    "unwritten_output": (9, lambda out, x: torch.isnan(out[63]) and torch.equal(out[:63], x[:63])),
    # The kernels compile with -ftrivial-auto-var-init=pattern (build.py): a local read before it is written holds
    # 0xFE bytes (about -1.7e38 as a float32), as a GPU register holds whatever it held, not the zeros of a fresh stack.
    "uninitialized_local": (10, lambda out, x: bool((out.abs() > 1e37).all())),
}


@pytest.mark.parametrize("name", GARBAGE)
def test_planted_garbage_shows(emu, name):
    bug, shows = GARBAGE[name]
    x = torch.randn(64)
    assert torch.equal(emu.probe_bug(bug, False, x), x)
    out = emu.probe_bug(bug, True, x)
    assert shows(out, x), out


def test_fresh_memory_is_poisoned(emu):
    assert torch.isnan(torch.empty(1000)).all() and torch.isnan(torch.empty(10, dtype=torch.bfloat16)).all()
    assert (torch.empty(10, dtype=torch.int64) == -1).all()


def test_correct_pipeline_passes(emu):
    for _ in range(8):
        emu.probe_race(0)  # cp.async, wait, barrier, then another warp's ldmatrix


# Whichever order the schedule gives the two accesses of a race, one of these reports names it.
ANY_RACE = (r"racecheck: (write over bytes another thread read with no barrier between|read of bytes another "
            r"thread(.s cp.async is still writing| wrote with no barrier between))")


@pytest.mark.parametrize("variant, report", [
    (1, ANY_RACE),
    (2, r"racecheck: read of bytes whose cp.async has not been waited for"),
    (3, ANY_RACE),
])
def test_planted_pipeline_races_are_reported(emu, variant, report):
    # 1: the barrier between the wait and the other warp's read removed; 2: a read before the wait (a skipped wait);
    # 3: a stage overwritten while another warp still reads it.
    for _ in range(8):
        with pytest.raises(RuntimeError, match=report) as e:
            emu.probe_race(variant)
        assert "in emu_race_kernel(long, uint4 const*)" in str(e.value) and "threads" in str(e.value)
