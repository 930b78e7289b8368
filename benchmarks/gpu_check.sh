#!/usr/bin/env bash
# Checks pytransformer's CUDA kernels on a machine with an NVIDIA GPU: builds the extension with its CUDA kernels, runs
# the CUDA tests, runs them again under compute-sanitizer, measures the device's copy bandwidth and runs the op
# benchmarks. Logs and records go to one directory. `bash benchmarks/gpu_check.sh --help` prints the usage.
set -u

usage() {
  cat <<'EOF'
usage: bash benchmarks/gpu_check.sh [--out DIR] [--timeout SECONDS] [--budget SECONDS] [--probes DIR] [--op OP ...]
       [--dtype DTYPE ...] [STEP ...]

Builds pytransformer with its CUDA kernels and checks them on this machine's GPU. Run it from a checkout of the
repository, with a CUDA build of torch, nvcc and pytest installed (compute-sanitizer for the sanitizer steps).
With little GPU time, run `env build triage` first: the triage answers the open questions in about 3 minutes.

Steps (default: env build triage ptx check test sanitizers bandwidth bench):
  env         the GPU, driver, nvcc, torch and compute-sanitizer versions, and those of the Python packages the
              other steps use (pytest, pytest-xdist, transformers, ...) or that they are missing
  build       build the extension in place with the CUDA kernels (setup.py build_ext --inplace, FORCE_CUDA=1) and
              check that pytransformer.with_cuda() is True
  triage      one probe a hypothesis about where the GPU and the host emulator disagree, each with a verdict
              (tools/gpu_probes/triage.py; DIR/triage/triage.md): the standalone probes of --probes DIR first; the
              kernels' sentinel, float64 and NaN-poisoned-shared-memory checks of the forward and of the backward's
              debug tiles (S, P, dS, dP of one block), built with and without --use_fast_math; the parameter structs
              as the device sees them; the fragment layouts; the kernels the glue picks; host functions compiled by
              both nvcc and g++ in the build; decode_attention and kv_cache_append, each in a process of its own
  ptx         the instruction primitives of the tensor-core kernels (ldmatrix, mma.sync, cp.async) against the PTX
              ISA's fragment tables, on this GPU: python -m pytest tests/ops/test_ptx_layouts.py (builds a small probe
              extension, tools/ptx_probes.cu)
  check       every op's kernel cases on the GPU, one process an op (python -m pytransformer check --device cuda
              --quick --op OP, step check_OP), so that a crash in one op leaves the others checked; an op whose
              process dies of a signal runs again under cuda-gdb or gdb, whichever is on PATH, for a native
              backtrace (step check_OP_backtrace). Then the CPU kernels of the same build (step check_cpu).
              A failing case's tensors go to DIR/cases/STEP/NNN.pt (check --dump), to replay it elsewhere
  test        the CUDA tests: python -m pytest tests -m cuda -v (a line a test as it ends, so that a run stopped
              by --timeout still names the tests that failed or crashed)
  sanitizers  memcheck, racecheck, synccheck and initcheck, each a step of its own that can also be named alone:
              compute-sanitizer --tool TOOL over each op's kernel cases as in `check` (steps TOOL_OP), with
              PyTorch's caching allocator off so that every allocation has its exact size; racecheck instruments
              only pytransformer's kernels (the shared-memory hazards of torch's kernels are not ours to check)
  bandwidth   the device-to-device copy bandwidth (2 GiB), the ceiling of the memory-bound kernels
  bench       the benchmarks on CUDA, each recorded as DIR/bench_*.md: attention against SDPA, decode_attention,
              generation (a Llama shape against Hugging Face, needs transformers) first, then norms,
              masked_softmax, append, int8
  alltests    the whole test suite, CPU and CUDA: python -m pytest tests -q (not in the default list)

Every step runs with PYTHONFAULTHANDLER=1, so that a crashed process prints its Python frames.

Options:
  -o, --out DIR          where logs and records go (default: gpu_check_out/ at the top of the repository, which git
                         ignores); created if needed
  -t, --timeout SECONDS  stop a step that runs longer than SECONDS (default 0: no limit)
  -b, --budget SECONDS   the whole run's limit: a step is stopped when SECONDS have passed since the start, and the
                         steps left are skipped as out of time (they fail the run); the summary is still written
                         (default 0: no limit)
  -p, --probes DIR       standalone probe executables that the triage step runs first (each prints its own result)
  --op OP                only this op's cases in the check and sanitizer steps (repeatable; default: every op of
                         python -m pytransformer check)
  --dtype DTYPE          only this dtype's cases (float32, float16, bfloat16) in the check and sanitizer steps
                         (repeatable; default: every dtype), e.g. to split attention's racecheck across instances
  -h, --help             print this help and exit

Environment:
  PYTHON                the interpreter (default: .venv/bin/python of the repository if there is one, else python3)
  CUDA_HOME             the CUDA toolkit (default: the toolkit of the nvcc on PATH, or /usr/local/cuda, whichever
                        has lib64/libcudart.so)
  TORCH_CUDA_ARCH_LIST  architectures to build for (default: the compute capability of GPU 0, e.g. 9.0 on an H100)
  MAX_JOBS              parallel compile jobs (default: the number of cores)
  PYTEST_ADDOPTS        extra pytest options for the test steps, e.g. "-k attention" or "-n 8" (pytest-xdist)

Each step writes DIR/STEP.log. DIR/summary.md lists every step's result with the date, commit, GPU and torch version,
followed by the key lines of the logs and the benchmark tables; it is printed at the end. A failing step does not stop
the next ones (the steps that need the build are skipped when it fails). Exit status: 0 when every step passed, 1 when
one failed, 2 for bad arguments.
EOF
}

ALL_STEPS=(env build triage ptx check test memcheck racecheck synccheck initcheck bandwidth bench alltests)
DEFAULT_STEPS=(env build triage ptx check test sanitizers bandwidth bench)
SANITIZER_TOOLS=(memcheck racecheck synccheck initcheck)

bad_usage() {
  echo "gpu_check.sh: $1" >&2
  echo "usage: bash benchmarks/gpu_check.sh [--out DIR] [--timeout SECONDS] [--probes DIR] [--op OP ...]" \
    "[--dtype DTYPE ...] [STEP ...] (--help for more)" >&2
  exit 2
}

is_step() {
  local s
  for s in "${ALL_STEPS[@]}" sanitizers; do [ "$1" = "$s" ] && return 0; done
  return 1
}

DIR_ARG=""
PROBES_ARG=""
TIMEOUT=0
BUDGET=0
REQUESTED=()
OPS_ARG=()
DTYPES_ARG=()
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    -o | --out)
      [ $# -ge 2 ] && [ -n "$2" ] || bad_usage "$1 needs a directory"
      DIR_ARG=$2
      shift 2
      ;;
    --out=*)
      DIR_ARG=${1#--out=}
      [ -n "$DIR_ARG" ] || bad_usage "--out needs a directory"
      shift
      ;;
    -t | --timeout)
      [ $# -ge 2 ] || bad_usage "$1 needs a number of seconds"
      TIMEOUT=$2
      shift 2
      ;;
    --timeout=*)
      TIMEOUT=${1#--timeout=}
      shift
      ;;
    -b | --budget)
      [ $# -ge 2 ] || bad_usage "$1 needs a number of seconds"
      BUDGET=$2
      shift 2
      ;;
    --budget=*)
      BUDGET=${1#--budget=}
      shift
      ;;
    -p | --probes)
      [ $# -ge 2 ] && [ -n "$2" ] || bad_usage "$1 needs a directory"
      PROBES_ARG=$2
      shift 2
      ;;
    --probes=*)
      PROBES_ARG=${1#--probes=}
      [ -n "$PROBES_ARG" ] || bad_usage "--probes needs a directory"
      shift
      ;;
    --op)
      [ $# -ge 2 ] && [ -n "$2" ] || bad_usage "$1 needs an op"
      OPS_ARG+=("$2")
      shift 2
      ;;
    --op=*)
      OPS_ARG+=("${1#--op=}")
      [ -n "${1#--op=}" ] || bad_usage "--op needs an op"
      shift
      ;;
    --dtype)
      [ $# -ge 2 ] && [ -n "$2" ] || bad_usage "$1 needs a dtype"
      DTYPES_ARG+=("$2")
      shift 2
      ;;
    --dtype=*)
      DTYPES_ARG+=("${1#--dtype=}")
      shift
      ;;
    --)
      shift
      REQUESTED+=("$@")
      break
      ;;
    -*) bad_usage "unknown option: $1" ;;
    *)
      REQUESTED+=("$1")
      shift
      ;;
  esac
done
case $TIMEOUT in
  '' | *[!0-9]*) bad_usage "--timeout expects a whole number of seconds, got '$TIMEOUT'" ;;
esac
case $BUDGET in
  '' | *[!0-9]*) bad_usage "--budget expects a whole number of seconds, got '$BUDGET'" ;;
esac
for dtype in ${DTYPES_ARG[@]+"${DTYPES_ARG[@]}"}; do
  case $dtype in
    float32 | float16 | bfloat16) ;;
    *) bad_usage "unknown dtype: '$dtype' (dtypes: float32 float16 bfloat16)" ;;
  esac
done
for step in ${REQUESTED[@]+"${REQUESTED[@]}"}; do
  is_step "$step" || bad_usage "unknown step: $step (steps: ${ALL_STEPS[*]} sanitizers)"
done
[ ${#REQUESTED[@]} -gt 0 ] || REQUESTED=("${DEFAULT_STEPS[@]}")
STEPS=()  # `sanitizers` expanded into its four tools
for step in "${REQUESTED[@]}"; do
  if [ "$step" = sanitizers ]; then STEPS+=("${SANITIZER_TOOLS[@]}"); else STEPS+=("$step"); fi
done

# DIR relative to where the script was called from; the steps run from the top of the repository.
CALLER_DIR=$PWD
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
if [ -z "$DIR_ARG" ]; then
  LOG_DIR=$ROOT/gpu_check_out
else
  case $DIR_ARG in
    /*) LOG_DIR=$DIR_ARG ;;
    *) LOG_DIR=$CALLER_DIR/$DIR_ARG ;;
  esac
fi
if [ -n "$PROBES_ARG" ]; then
  case $PROBES_ARG in /*) ;; *) PROBES_ARG=$CALLER_DIR/$PROBES_ARG ;; esac
  [ -d "$PROBES_ARG" ] || bad_usage "--probes: not a directory: $PROBES_ARG"
fi
mkdir -p "$LOG_DIR" || bad_usage "cannot create the output directory $LOG_DIR"
LOG_DIR=$(cd "$LOG_DIR" && pwd)

if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi
# The ops of `python -m pytransformer check` (pytransformer/check.py's OPS), one a line: those of --op if given.
all_ops() {
  "$PYTHON" -c "from pytransformer.check import OPS; print(*OPS, sep='\n')"
}
check_ops() {
  if [ ${#OPS_ARG[@]} -gt 0 ]; then printf '%s\n' "${OPS_ARG[@]}"; else all_ops; fi
}
# --op checked here where the package imports (before a build it may not: the check steps then refuse a bad one).
if [ ${#OPS_ARG[@]} -gt 0 ] && known_ops=$(all_ops 2>/dev/null); then
  for op in "${OPS_ARG[@]}"; do
    grep -qx -- "$op" <<< "$known_ops" || bad_usage "unknown op: $op (ops: $(tr '\n' ' ' <<< "$known_ops"))"
  done
fi
# CUDA_HOME, when unset: the first of (the toolkit of the nvcc on PATH, links resolved; /usr/local/cuda) that has
# lib64/libcudart.so. torch.utils.cpp_extension would take the directory above `which nvcc`, and a wrapper script
# such as /usr/local/bin/nvcc would then send the link step to /usr/local/lib64, where libcudart is not.
if [ -z "${CUDA_HOME:-}" ]; then
  for home in "$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /none/bin/nvcc)")")")" /usr/local/cuda; do
    if [ -x "$home/bin/nvcc" ] && [ -e "$home/lib64/libcudart.so" ]; then
      export CUDA_HOME=$home
      break
    fi
  done
fi
# Build for the GPU that is here unless told otherwise.
if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
  TORCH_CUDA_ARCH_LIST=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
  [ -n "$TORCH_CUDA_ARCH_LIST" ] || TORCH_CUDA_ARCH_LIST="8.0;9.0"
fi
export TORCH_CUDA_ARCH_LIST MAX_JOBS=${MAX_JOBS:-$(nproc)} FORCE_CUDA=1
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1

SUMMARY=$LOG_DIR/summary.md
FAILED=0
BUILD_STATE=unknown  # ok | failed | unknown (no build step run yet: an existing build is checked when needed)
BENCH_RECORDS=()

gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
torch_version=$("$PYTHON" -c "import torch; print(torch.__version__)" 2>/dev/null)
if commit=$(git rev-parse --short HEAD 2>/dev/null); then
  git diff --quiet HEAD 2>/dev/null || commit="$commit (with local changes)"
else
  commit="unknown (not a git checkout)"
fi
{
  echo "# GPU check"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- commit: $commit"
  echo "- GPU: ${gpu_name:-unknown (nvidia-smi failed)}"
  echo "- torch: ${torch_version:-unknown (cannot import torch with $PYTHON)}"
  echo "- CUDA_HOME: ${CUDA_HOME:-unset}; TORCH_CUDA_ARCH_LIST: $TORCH_CUDA_ARCH_LIST"
  timeout_arg=""
  [ "$TIMEOUT" -eq 0 ] || timeout_arg=" --timeout $TIMEOUT"
  [ "$BUDGET" -eq 0 ] || timeout_arg="$timeout_arg --budget $BUDGET"
  filter_args=""
  for op in ${OPS_ARG[@]+"${OPS_ARG[@]}"}; do filter_args="$filter_args --op $op"; done
  for dtype in ${DTYPES_ARG[@]+"${DTYPES_ARG[@]}"}; do filter_args="$filter_args --dtype $dtype"; done
  echo "- command: bash benchmarks/gpu_check.sh --out $LOG_DIR$timeout_arg$filter_args ${REQUESTED[*]}"
  echo
  echo "| step | result | seconds | log |"
  echo "|---|---|---|---|"
} > "$SUMMARY"

# run_step NAME CMD...: runs CMD with its output on the terminal and in DIR/NAME.log, and records the result; within
# --timeout and what is left of --budget (SECONDS counts from the script's start), or skipped when nothing is left.
run_step() {
  local name=$1 log=$LOG_DIR/$1.log start=$SECONDS limit=$TIMEOUT rc result cmd
  shift
  if [ "$BUDGET" -gt 0 ]; then
    if [ $((BUDGET - SECONDS)) -le 0 ]; then
      skip_step "$name" "out of time (--budget $BUDGET)"
      FAILED=$((FAILED + 1))
      return 124
    fi
    [ "$limit" -gt 0 ] && [ "$limit" -le $((BUDGET - SECONDS)) ] || limit=$((BUDGET - SECONDS))
  fi
  cmd="$*"
  cmd=${cmd//$'\n'/ }
  echo "=== $name: ${cmd:0:200}"
  if [ "$limit" -gt 0 ]; then
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
  else
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
  fi
  if [ "$rc" -eq 0 ]; then
    result=ok
  elif [ "$limit" -gt 0 ] && { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; }; then
    result="TIMEOUT (after $limit s)"
  else
    result="FAILED (exit $rc)"
  fi
  [ "$rc" -eq 0 ] || FAILED=$((FAILED + 1))
  echo "| $name | $result | $((SECONDS - start)) | $name.log |" >> "$SUMMARY"
  echo "=== $name: $result"
  return "$rc"
}

skip_step() {
  echo "| $1 | skipped: $2 | 0 | |" >> "$SUMMARY"
  echo "=== $1: skipped ($2)"
}

# Whether the extension importable from the checkout has the CUDA kernels (checked once when no build step ran).
have_cuda_build() {
  if [ "$BUILD_STATE" = unknown ]; then
    if "$PYTHON" -c "import sys, pytransformer; sys.exit(0 if pytransformer.with_cuda() else 1)" >/dev/null 2>&1; then
      BUILD_STATE=ok
    else
      BUILD_STATE=missing
    fi
  fi
  [ "$BUILD_STATE" = ok ]
}

# check_op STEP OP [PREFIX...]: the op's quick kernel cases on the GPU as step STEP, run through PREFIX (a sanitizer).
check_op() {
  local step=$1 op=$2
  shift 2
  local dtype dtype_args=()
  for dtype in ${DTYPES_ARG[@]+"${DTYPES_ARG[@]}"}; do dtype_args+=(--dtype "$dtype"); done
  run_step "$step" "$@" "$PYTHON" -m pytransformer check --device cuda --quick --op "$op" \
    ${dtype_args[@]+"${dtype_args[@]}"} --dump "$LOG_DIR/cases/$step"
}

# The reason the steps that need the CUDA build cannot run.
no_build_reason() {
  case $BUILD_STATE in
    failed) echo "the build failed" ;;
    *) echo "no CUDA build of pytransformer in this checkout (run the build step)" ;;
  esac
}

BANDWIDTH_PY='
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
moved = 2 * src.numel() * src.element_size()
print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
print(f"copy {moved / 2**30:.1f} GiB moved: median {t * 1e3:.3f} ms (min {min(times) * 1e3:.3f}, "
      f"max {max(times) * 1e3:.3f}) -> {moved / t / 1e9:.1f} GB/s")
'

# Run by `bash -c`: the variables expand in that shell.
# shellcheck disable=SC2016
ENV_SH='
nvidia-smi || exit 1
echo
nvcc --version || echo "nvcc: not found on PATH"
echo "CUDA_HOME=${CUDA_HOME:-unset} TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"
"$PYTHON" -c "
import torch
print(\"torch\", torch.__version__, \"CUDA\", torch.version.cuda)
assert torch.cuda.is_available(), \"torch sees no GPU (a CPU-only torch, or no driver)\"
print(torch.cuda.get_device_name(), \"compute capability\", torch.cuda.get_device_capability())
" || exit 1
"$PYTHON" -c "
from importlib import metadata
for name in (\"pytest\", \"pytest-xdist\", \"transformers\", \"tokenizers\", \"safetensors\", \"matplotlib\"):
    try:
        print(name, metadata.version(name))
    except metadata.PackageNotFoundError:
        print(name, \"not installed\")
"
compute-sanitizer --version 2>/dev/null | head -3 || true
command -v compute-sanitizer >/dev/null || echo "compute-sanitizer: not found on PATH (the sanitizer steps need it)"
'

# The bench scripts with the dtypes recorded for each (bench_int8_linear and bench_quantization have no --dtype):
# attention against SDPA, decode against the copy bandwidth and generation against Hugging Face first, so that a run
# cut short by --budget has those.
BENCHES=("attention bfloat16" "decode_attention bfloat16" "generate default" "decode_attention float32"
         "norm float32" "norm bfloat16" "masked_softmax float32" "masked_softmax bfloat16" "kv_cache_append bfloat16"
         "int8_linear default" "quantization default")

for step in "${STEPS[@]}"; do
  case $step in
    env)
      run_step env env PYTHON="$PYTHON" bash -c "$ENV_SH"
      ;;
    build)
      if run_step build "$PYTHON" setup.py build_ext --inplace &&
         run_step with_cuda "$PYTHON" -c "import pytransformer as pt; assert pt.with_cuda(), \
'the extension was built without its CUDA kernels (see build.log)'; print('with_cuda: True')"; then
        BUILD_STATE=ok
      else
        BUILD_STATE=failed
      fi
      ;;
    bandwidth)
      run_step bandwidth "$PYTHON" -c "$BANDWIDTH_PY"
      ;;
    triage)
      triage_args=(--out "$LOG_DIR/triage" --arch "sm_$(echo "${TORCH_CUDA_ARCH_LIST%%[;+ ]*}" | tr -d .)")
      [ -z "$PROBES_ARG" ] || triage_args+=(--prebuilt "$PROBES_ARG")
      run_step triage "$PYTHON" tools/gpu_probes/triage.py "${triage_args[@]}"
      ;;
    *)
      if ! have_cuda_build; then
        skip_step "$step" "$(no_build_reason)"
        FAILED=$((FAILED + 1))
        continue
      fi
      case $step in
        check)
          for op in $(check_ops); do
            check_op "check_$op" "$op"
            rc=$?
            # Killed by a signal (128 + its number), not by the step timeout: a native backtrace of the crash.
            if [ "$rc" -gt 128 ] && [ "$rc" -ne 137 ]; then
              if debugger=$(command -v cuda-gdb || command -v gdb); then
                check_op "check_${op}_backtrace" "$op" "$debugger" -q -batch -ex run -ex bt --args
              else
                skip_step "check_${op}_backtrace" "no cuda-gdb or gdb on PATH"
              fi
            fi
          done
          run_step check_cpu "$PYTHON" -m pytransformer check --device cpu --quick
          ;;
        ptx)
          run_step ptx "$PYTHON" -m pytest tests/ops/test_ptx_layouts.py -q -rfE
          ;;
        test)
          run_step test "$PYTHON" -m pytest tests -m cuda -v -rfE --junitxml="$LOG_DIR/test.xml"
          ;;
        memcheck | racecheck | synccheck | initcheck)
          extra=()
          # racecheck instruments only pytransformer's kernels (namespace pytransformer::cuda, which
          # tools/ptxas_gate.py holds every kernel to): torch's kernels around the cases run unpatched, and theirs are
          # not this check's hazards.
          [ "$step" = racecheck ] && extra=(--racecheck-report analysis --kernel-name kns=13pytransformer4cuda)
          for op in $(check_ops); do
            check_op "${step}_$op" "$op" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
              compute-sanitizer --error-exitcode 1 --tool "$step" ${extra[@]+"${extra[@]}"}
          done
          ;;
        bench)
          for spec in "${BENCHES[@]}"; do
            read -r name dtype <<< "$spec"
            record=$LOG_DIR/bench_${name}_$dtype.md
            args=(--device cuda --record "$record")
            [ "$dtype" = default ] || args+=(--dtype "$dtype")
            [ "$name" = attention ] && args+=(--runs 10)
            [ "$name" = generate ] && args+=(--model llama --dtypes float32 bfloat16 int8 --new-tokens 128 --runs 3)
            run_step "bench_${name}_$dtype" "$PYTHON" "benchmarks/bench_$name.py" "${args[@]}" &&
              BENCH_RECORDS+=("$record")
          done
          ;;
        alltests)
          run_step alltests "$PYTHON" -m pytest tests -q -rfE --junitxml="$LOG_DIR/alltests.xml"
          ;;
      esac
      ;;
  esac
done

{
  echo
  echo "## Key lines"
  echo
  # key_line STEP PATTERN: the last line of the step's log matching PATTERN.
  key_line() {
    [ -f "$LOG_DIR/$1.log" ] || return 0
    echo "- $1: $(grep -E "$2" "$LOG_DIR/$1.log" | tail -1 | grep . || echo '(no result line; see the log)')"
  }
  for step in "${STEPS[@]}"; do
    case $step in
      check)
        for log in "$LOG_DIR"/check_*.log; do
          name=$(basename "$log" .log)
          case $name in
            *_backtrace) echo "- $name: $(grep -m1 -E '^#0 ' "$log" | grep . || echo '(no frame; see the log)')" ;;
            *) key_line "$name" 'cases pass|failures:|Fatal Python error' ;;
          esac
        done
        ;;
      ptx | test | alltests)
        key_line "$step" '(passed|failed|error|no tests ran)'
        # The tests that failed or crashed, also from a run stopped before its summary (-v: a line a test).
        [ -f "$LOG_DIR/$step.log" ] && grep -E '(FAILED|ERROR) tests/|crashed while running' "$LOG_DIR/$step.log" |
          sed 's/^/  - /' | sort -u | head -40
        ;;
      memcheck | racecheck | synccheck | initcheck)
        for log in "$LOG_DIR/$step"_*.log; do
          [ -f "$log" ] && key_line "$(basename "$log" .log)" 'ERROR SUMMARY|RACECHECK SUMMARY'
        done
        ;;
      bandwidth) key_line bandwidth 'GB/s' ;;
      triage) [ -f "$LOG_DIR/triage/triage.md" ] && { echo; sed 1,2d "$LOG_DIR/triage/triage.md"; echo; } ;;
    esac
  done
  for record in ${BENCH_RECORDS[@]+"${BENCH_RECORDS[@]}"}; do
    [ -f "$record" ] && { echo; echo "### $(basename "$record")"; echo; cat "$record"; }
  done
  echo
  echo "$FAILED failed step(s)."
} >> "$SUMMARY"
echo
cat "$SUMMARY"
[ "$FAILED" -eq 0 ] || exit 1
exit 0
