#!/usr/bin/env bash
# gpu_check.sh: build, test, sanitize and benchmark the CUDA kernels on a machine with an NVIDIA GPU.
# Run `bash benchmarks/gpu_check.sh --help` for the usage. Each step logs to DIR/<step>.log; a failing step is
# reported and the next one still runs (steps that need the extension are skipped when the build failed);
# DIR/summary.md collects the results and is printed last.
set -u

usage() {
  cat <<'EOF'
Usage: bash benchmarks/gpu_check.sh [--out DIR] [STEP ...]

Builds the CUDA extension in place, runs the CUDA tests, runs them under compute-sanitizer, measures the device copy
bandwidth and runs the op benchmarks. With no STEP, runs every step in this order:

  env         nvidia-smi, nvcc, torch and compute-sanitizer versions, CUDA_HOME
  build       MAX_JOBS=... TORCH_CUDA_ARCH_LIST=... python setup.py build_ext --inplace (FORCE_CUDA=1),
              then checks that the extension has the CUDA kernels
  test        python -m pytest tests -m cuda -q
  sanitizers  compute-sanitizer memcheck, racecheck, synccheck and initcheck, each over
              python -m pytest tests/ops -m cuda -q -x  (also runnable alone: memcheck racecheck synccheck initcheck)
  bandwidth   device-to-device copy bandwidth (the ceiling the memory-bound kernels are compared with)
  bench       benchmarks/bench_{norm,softmax,decode}.py (float32, bfloat16), bench_attention.py (bfloat16),
              bench_quantize.py, each recorded as DIR/bench_<op>_<dtype>.md

Options:
  --out DIR   where logs, records and summary.md go (default: gpu_check_out/ in the repository root)
  -h, --help  print this help and exit

Environment: PYTHON (python3), MAX_JOBS (number of CPUs), TORCH_CUDA_ARCH_LIST (default: the compute capability
of the visible GPU, e.g. 9.0; 8.0;9.0 when it cannot be read), CUDA_HOME (default: the toolkit of the nvcc on PATH,
else /usr/local/cuda, whichever has lib64/libcudart.so).

Exit status: 0 when every step passed, 1 when a step failed, 2 for bad arguments.
EOF
}

bad_usage() {
  echo "gpu_check.sh: $1" >&2
  echo "Run 'bash benchmarks/gpu_check.sh --help' for the usage." >&2
  exit 2
}

ALL_STEPS=(env build test sanitizers bandwidth bench)
SANITIZERS=(memcheck racecheck synccheck initcheck)
DEST_ARG=""
STEPS=()
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --out)
      [ $# -ge 2 ] && [ -n "$2" ] || bad_usage "--out needs a directory"
      DEST_ARG=$2
      shift 2
      ;;
    --out=*)
      DEST_ARG=${1#--out=}
      [ -n "$DEST_ARG" ] || bad_usage "--out needs a directory"
      shift
      ;;
    -*) bad_usage "unknown option: $1" ;;
    *)
      case " ${ALL_STEPS[*]} ${SANITIZERS[*]} " in
        *" $1 "*) STEPS+=("$1") ;;
        *) bad_usage "unknown step: $1 (steps: ${ALL_STEPS[*]} ${SANITIZERS[*]})" ;;
      esac
      shift
      ;;
  esac
done
[ ${#STEPS[@]} -gt 0 ] || STEPS=("${ALL_STEPS[@]}")

# Relative --out paths are taken from the directory the script was started in.
START_DIR=$PWD
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
case $DEST_ARG in
  "") DEST_DIR=$ROOT/gpu_check_out ;;
  /*) DEST_DIR=$DEST_ARG ;;
  *) DEST_DIR=$START_DIR/$DEST_ARG ;;
esac
mkdir -p "$DEST_DIR" || bad_usage "cannot create $DEST_DIR"

PYTHON=${PYTHON:-python3}
export MAX_JOBS=${MAX_JOBS:-$(nproc 2>/dev/null || echo 4)} FORCE_CUDA=1
if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
  TORCH_CUDA_ARCH_LIST=$("$PYTHON" -c \
    "import torch; print('%d.%d' % torch.cuda.get_device_capability())" 2>/dev/null) || TORCH_CUDA_ARCH_LIST="8.0;9.0"
fi
export TORCH_CUDA_ARCH_LIST
# CUDA_HOME, when unset: the first of (the toolkit of the nvcc on PATH, links resolved; /usr/local/cuda) that has
# lib64/libcudart.so. torch would take the directory above `which nvcc`, and a wrapper script such as
# /usr/local/bin/nvcc would then send the link step to /usr/local/lib64, where libcudart is not.
if [ -z "${CUDA_HOME:-}" ]; then
  for home in "$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /none/bin/nvcc)")")")" /usr/local/cuda; do
    if [ -x "$home/bin/nvcc" ] && [ -e "$home/lib64/libcudart.so" ]; then
      export CUDA_HOME=$home
      break
    fi
  done
fi
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

SUMMARY=$DEST_DIR/summary.md
FAILED=0
RAN=" "  # the steps run this time (DIR may hold logs of earlier runs)
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
  echo "- TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS CUDA_HOME=${CUDA_HOME:-unset}"
  echo
  echo "| step | result | seconds | log |"
  echo "|---|---|---|---|"
} > "$SUMMARY"

# run_step NAME CMD...: runs CMD, output to the terminal and DIR/NAME.log; records the result in the summary.
run_step() {
  local name=$1 log=$DEST_DIR/$1.log start=$SECONDS rc result
  shift
  RAN="$RAN$name "
  echo "=== $name: $*"
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ]; then result=ok; else result="FAILED (exit $rc)"; FAILED=$((FAILED + 1)); fi
  echo "| $name | $result | $((SECONDS - start)) | $name.log |" >> "$SUMMARY"
  echo "=== $name: $result"
  return "$rc"
}

skip_step() {
  echo "| $1 | skipped: $2 | 0 | |" >> "$SUMMARY"
  echo "=== $1: skipped ($2)"
}

# Every allocation exact under the sanitizers (no caching allocator), so that an out-of-bounds access is not hidden
# inside a larger cached block.
sanitize() {
  local tool=$1 extra=()
  [ "$tool" = racecheck ] && extra=(--racecheck-report analysis)
  run_step "$tool" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool "$tool" --error-exitcode 1 \
    ${extra[@]+"${extra[@]}"} "$PYTHON" -m pytest tests/ops -m cuda -q -x
}

bench() {
  local name dtype
  for name in norm softmax decode; do
    for dtype in float32 bfloat16; do
      run_step "bench_${name}_$dtype" "$PYTHON" "benchmarks/bench_$name.py" --device cuda --dtype "$dtype" \
        --record "$DEST_DIR/bench_${name}_$dtype.md"
    done
  done
  # Attention in bfloat16 (head dims 64 and 128, L 512..16k) against SDPA's flash and cuDNN backends.
  run_step bench_attention_bfloat16 "$PYTHON" benchmarks/bench_attention.py --device cuda --dtype bfloat16 --runs 10 \
    --record "$DEST_DIR/bench_attention_bfloat16.md"
  run_step bench_quantize "$PYTHON" benchmarks/bench_quantize.py --device cuda --record "$DEST_DIR/bench_quantize.md"
}

bandwidth() {
  "$PYTHON" - <<'PYEOF'
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
moved = 2 * src.numel() * 4
print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
print(f"copy {moved / 2**30:.1f} GiB moved: median {t * 1e3:.3f} ms (min {min(times) * 1e3:.3f}, "
      f"max {max(times) * 1e3:.3f}) -> {moved / t / 1e9:.1f} GB/s")
PYEOF
}

for step in "${STEPS[@]}"; do
  case $step in
    env)
      run_step env bash -c "nvidia-smi; nvcc --version; echo CUDA_HOME=${CUDA_HOME:-unset}; \"$PYTHON\" -c \
'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())'; \
compute-sanitizer --version | head -3"
      ;;
    build)
      run_step build "$PYTHON" setup.py build_ext --inplace || BUILD_OK=0
      [ $BUILD_OK -eq 0 ] || run_step with_cuda "$PYTHON" -c \
        "import pytransformer as pt; assert pt.with_cuda(), 'the extension was built without CUDA'; print('with_cuda: True')" \
        || BUILD_OK=0
      ;;
    bandwidth) run_step bandwidth bandwidth ;;
    *)
      if [ $BUILD_OK -eq 0 ]; then skip_step "$step" "build failed"; continue; fi
      case $step in
        test) run_step test "$PYTHON" -m pytest tests -m cuda -q -rfE --junitxml="$DEST_DIR/test.xml" ;;
        sanitizers) for tool in "${SANITIZERS[@]}"; do sanitize "$tool"; done ;;
        memcheck | racecheck | synccheck | initcheck) sanitize "$step" ;;
        bench) bench ;;
      esac
      ;;
  esac
done

{
  echo
  echo "## Highlights"
  echo
  # highlight STEP PATTERN: the last line of the step's log matching PATTERN
  highlight() {
    case $RAN in *" $1 "*) ;; *) return 0 ;; esac
    echo "- $1: $(grep -E "$2" "$DEST_DIR/$1.log" | tail -1 | grep . || echo '(no result line; see the log)')"
  }
  highlight test '(passed|failed|error)'
  for tool in "${SANITIZERS[@]}"; do highlight "$tool" 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed'; done
  highlight bandwidth 'GB/s'
  for f in "$DEST_DIR"/bench_*.md; do
    case $RAN in *" $(basename "$f" .md) "*) ;; *) continue ;; esac
    [ -f "$f" ] && { echo; echo "### $(basename "$f")"; echo; cat "$f"; }
  done
  echo
  echo "$FAILED failed step(s)."
} >> "$SUMMARY"
echo
cat "$SUMMARY"
[ "$FAILED" -eq 0 ]
