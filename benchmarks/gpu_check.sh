#!/usr/bin/env bash
# One command for the GPU machine: build the CUDA extension for sm_90, run the CUDA tests and the kernel path check,
# run compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on a small run of every CUDA op, measure the
# device copy bandwidth, and run the op benchmarks. Each step logs to $OUT/<step>.log; a failing step is reported and
# the next one still runs; $OUT/summary.md collects the results and is printed last. Exit status: failed steps.
#
#   bash benchmarks/gpu_check.sh                 # every step
#   bash benchmarks/gpu_check.sh test bench      # only these steps (the build is kept between runs on a warm machine)
#
# Steps: env build test opscheck memcheck racecheck synccheck initcheck bandwidth bench alltests, and `attention` (not
# in the default list: the attention cases of the path check and the CUDA attention tests alone, for iterating on it).
# Everything takes longer than one 10-minute device call: run it in parts, e.g. `env build test opscheck`, then
# `memcheck racecheck synccheck initcheck`, then `bandwidth bench alltests`. Steps stop at TIME_BUDGET seconds from the
# start (default 570, inside a 600-second call) so that the summary is always written; later steps are skipped.
# A device machine goes back 30 s after a call, so each call starts bare: `build` copies the built extension
# (pytransformer/_C*.so) into $OUT; put it back into pytransformer/ of the checkout, name it in the next call's `carry`
# and leave `build` out of that call's steps to skip the rebuild (only while csrc/ is unchanged).
# Environment: OUT (default ./gpu_check_out), PYTHON (python3), MAX_JOBS (16), TORCH_CUDA_ARCH_LIST (9.0),
# TIME_BUDGET (570), TEST_WORKERS (8: pytest-xdist processes for the CUDA tests, when it is installed).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu_check_out}
PYTHON=${PYTHON:-python3}
TIME_BUDGET=${TIME_BUDGET:-570}
export MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} FORCE_CUDA=1
# CUDA_HOME, when unset: the first of (the toolkit of the nvcc on PATH, links resolved; /usr/local/cuda) that has
# lib64/libcudart.so. torch would take the directory above `which nvcc`, and a wrapper script /usr/local/bin/nvcc
# (seen on a CPU machine here) then sends the link step to /usr/local/lib64, where libcudart is not.
if [ -z "${CUDA_HOME:-}" ]; then
  for home in "$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /none/bin/nvcc)")")")" /usr/local/cuda; do
    if [ -x "$home/bin/nvcc" ] && [ -e "$home/lib64/libcudart.so" ]; then
      export CUDA_HOME=$home
      break
    fi
  done
fi
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
SUMMARY=$OUT/summary.md
ALL_STEPS=(env build test opscheck memcheck racecheck synccheck initcheck bandwidth bench alltests)
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=("${ALL_STEPS[@]}")
FAILED=0
BUILD_OK=1
{
  echo "# GPU check"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  if commit=$(git rev-parse --short HEAD 2>/dev/null); then
    git diff --quiet HEAD 2>/dev/null || commit="$commit (with local changes)"
  else
    commit="unknown (no git checkout)"
  fi
  echo "- commit: $commit"
  echo "- steps: ${STEPS[*]}"
  echo
  echo "| step | result | seconds | log |"
  echo "|---|---|---|---|"
} > "$SUMMARY"

# run_step NAME CMD...: runs CMD within the time left, output to the terminal and $OUT/NAME.log; records the result.
run_step() {
  local name=$1 log=$OUT/$1.log start=$SECONDS left=$((TIME_BUDGET - SECONDS - 10)) rc result
  shift
  if [ "$left" -lt 20 ]; then
    skip_step "$name" "out of time"
    FAILED=$((FAILED + 1))
    return 1
  fi
  echo "=== $name: $*"
  timeout --kill-after=5 "$left" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) result=ok ;;
    124|137) result="TIMEOUT (after $left s)" ;;
    *) result="FAILED (exit $rc)" ;;
  esac
  [ "$rc" -eq 0 ] || FAILED=$((FAILED + 1))
  echo "| $name | $result | $((SECONDS - start)) | $name.log |" >> "$SUMMARY"
  echo "=== $name: $result"
  return "$rc"
}

skip_step() {
  echo "| $1 | skipped: $2 | 0 | |" >> "$SUMMARY"
  echo "=== $1: skipped ($2)"
}

# Sanitizer runs of the quick path check: every allocation exact (no caching allocator), so out-of-bounds accesses
# are not hidden inside a larger cached block.
SANITIZE=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --error-exitcode 1)
OPS_QUICK=("$PYTHON" benchmarks/gpu_ops_check.py --quick)
XDIST=()
"$PYTHON" -c "import xdist" 2>/dev/null && XDIST=(-n "${TEST_WORKERS:-8}")

for step in "${STEPS[@]}"; do
  case $step in
    env)
      run_step env bash -c "nvidia-smi; nvcc --version; echo CUDA_HOME=${CUDA_HOME:-unset}; \"$PYTHON\" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())'; compute-sanitizer --version | head -3"
      ;;
    build)
      run_step build "$PYTHON" setup.py build_ext --inplace || BUILD_OK=0
      [ $BUILD_OK -eq 0 ] || run_step with_cuda "$PYTHON" -c \
        "import pytransformer as pt; assert pt.with_cuda(), 'the extension was built without CUDA'; print('with_cuda: True')" \
        || BUILD_OK=0
      [ $BUILD_OK -eq 0 ] || cp pytransformer/_C*.so "$OUT"/  # for the next call's carry (see the header)
      ;;
    test | opscheck | attention | memcheck | racecheck | synccheck | initcheck | bench | alltests)
      if [ $BUILD_OK -eq 0 ]; then skip_step "$step" "build failed"; continue; fi
      case $step in
        test) run_step test "$PYTHON" -m pytest -q -m cuda tests -rfE "${XDIST[@]}" --junitxml="$OUT/test.xml" ;;
        opscheck) run_step opscheck "$PYTHON" benchmarks/gpu_ops_check.py ;;
        attention)
          run_step attention_opscheck "$PYTHON" benchmarks/gpu_ops_check.py --ops attention
          run_step attention_test "$PYTHON" -m pytest -q -m cuda tests/test_attention.py -rfE
          ;;
        memcheck) run_step memcheck "${SANITIZE[@]}" --tool memcheck "${OPS_QUICK[@]}" ;;
        racecheck) run_step racecheck "${SANITIZE[@]}" --tool racecheck --racecheck-report analysis "${OPS_QUICK[@]}" ;;
        synccheck) run_step synccheck "${SANITIZE[@]}" --tool synccheck "${OPS_QUICK[@]}" ;;
        initcheck) run_step initcheck "${SANITIZE[@]}" --tool initcheck "${OPS_QUICK[@]}" ;;
        bench)
          # The benchmark scripts are others'; their --dtype and --record options are used when they have them.
          for name in norm softmax decode quantize; do
            script=benchmarks/bench_$name.py
            if [ ! -f "$script" ]; then skip_step "bench_$name" "$script not present"; continue; fi
            usage=$("$PYTHON" "$script" --help 2>/dev/null)
            dtypes=(default)
            grep -q -- --dtype <<< "$usage" && dtypes=(float32 bfloat16)
            for dtype in "${dtypes[@]}"; do
              args=(--device cuda)
              [ "$dtype" = default ] || args+=(--dtype "$dtype")
              grep -q -- --record <<< "$usage" && args+=(--record "$OUT/bench_${name}_$dtype.md")
              run_step "bench_${name}_$dtype" "$PYTHON" "$script" "${args[@]}"
            done
          done
          # attention in bf16 only (head dims 64 and 128, L 512..16k, vs SDPA flash and cuDNN)
          run_step bench_attention_bfloat16 "$PYTHON" benchmarks/bench_attention.py --device cuda --dtype bfloat16 \
            --runs 10 --record "$OUT/bench_attention_bfloat16.md"
          ;;
        alltests) run_step alltests "$PYTHON" -m pytest -q tests -rfE --junitxml="$OUT/alltests.xml" ;;
      esac
      ;;
    bandwidth)
      run_step bandwidth "$PYTHON" - <<'EOF'
"""Device copy ceiling: a 2 GiB device-to-device copy, bytes read + written, median of 30 after warm-up."""
import statistics
import torch

n = 1 << 29  # float32 elements: 2 GiB
src = torch.randn(n, device="cuda")
dst = torch.empty_like(src)
for _ in range(5):
    dst.copy_(src)
times = []
for _ in range(30):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    dst.copy_(src)
    end.record()
    end.synchronize()
    times.append(start.elapsed_time(end) / 1e3)
t = statistics.median(times)
print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
print(f"copy {2 * src.numel() * 4 / 2**30:.1f} GiB moved: median {t * 1e3:.3f} ms "
      f"(min {min(times) * 1e3:.3f}, max {max(times) * 1e3:.3f}) -> {2 * src.numel() * 4 / t / 1e9:.1f} GB/s")
EOF
      ;;
    *)
      skip_step "$step" "unknown step (known: ${ALL_STEPS[*]})"
      FAILED=$((FAILED + 1))
      ;;
  esac
done

{
  echo
  echo "## Highlights"
  echo
  # highlight STEP PATTERN: the last line of the step's log matching PATTERN
  highlight() {
    [ -f "$OUT/$1.log" ] || return 0
    echo "- $1: $(grep -E "$2" "$OUT/$1.log" | tail -1 | grep . || echo '(no result line; see the log)')"
  }
  highlight test '(passed|failed|error)'
  highlight alltests '(passed|failed|error)'
  highlight opscheck '^[0-9]+ failures'
  for tool in memcheck racecheck synccheck initcheck; do highlight $tool 'ERROR SUMMARY|RACECHECK SUMMARY'; done
  highlight bandwidth 'GB/s'
  for f in "$OUT"/bench_*.md; do
    [ -f "$f" ] && { echo; echo "### $(basename "$f")"; echo; cat "$f"; }
  done
  echo
  echo "$FAILED failed step(s)."
} >> "$SUMMARY"
echo
cat "$SUMMARY"
exit "$FAILED"
