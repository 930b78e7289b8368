"""The host emulator's racecheck of the tensor-core pipeline (tools/cuda_emulator/prelude.h): cp.async writes and
ldmatrix reads of shared memory by different threads in one barrier interval, and reads before the issuing thread's
wait, raise a RuntimeError naming the race, the threads and the kernel; each detector against a planted bug."""
import pytest

pytestmark = pytest.mark.cuda


def test_correct_pipeline_passes(emu):
    for _ in range(8):  # the schedule differs from launch to launch
        emu.probe_race(0)  # cp.async, wait, barrier, then another warp's ldmatrix


# Whichever order the schedule gives the two accesses of a race, one of these reports names it.
ANY_RACE = (r"racecheck: (cp.async over bytes another thread read with no barrier between|read of bytes another "
            r"thread's cp.async (is still writing|wrote with no barrier between))")


@pytest.mark.parametrize("variant, report", [
    (1, ANY_RACE),
    (2, r"racecheck: read of bytes whose cp.async has not been waited for"),
    (3, ANY_RACE),
])
def test_planted_races_are_reported(emu, variant, report):
    # 1: the barrier between the wait and the other warp's read removed; 2: a read before the wait (a skipped wait);
    # 3: a stage overwritten while another warp still reads it.
    for _ in range(8):  # the schedule differs from launch to launch: reported in every order of the accesses
        with pytest.raises(RuntimeError, match=report) as e:
            emu.probe_race(variant)
        assert "in emu_race_kernel(long, uint4 const*)" in str(e.value) and "threads" in str(e.value)
