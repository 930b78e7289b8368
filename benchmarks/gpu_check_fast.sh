#!/usr/bin/env bash
# benchmarks/gpu_check.sh's checks in the least wall time on one GPU: the build first, then the CUDA tests, every op's
# kernel cases and the four sanitizers side by side (instances of gpu_check.sh, each with an output directory of its
# own; attention's racecheck, the longest, split by dtype), then the copy bandwidth and the benchmarks alone, as their
# times must be their own. `bash benchmarks/gpu_check_fast.sh --help` prints the usage.
set -u

usage() {
  cat <<'EOF'
usage: bash benchmarks/gpu_check_fast.sh [--out DIR] [--timeout SECONDS] [--budget SECONDS] [--no-bench]

Runs gpu_check.sh's env and build steps into DIR/build, then side by side: the CUDA tests (DIR/test; with pytest-xdist
installed, 10 workers unless PYTEST_ADDOPTS says otherwise), every op's kernel cases (DIR/check), racecheck of
attention one dtype an instance (DIR/racecheck_attention_DTYPE) and of the other ops (DIR/racecheck_others), and
memcheck, synccheck and initcheck (DIR/sanitizers); then bandwidth and bench (DIR/bench) unless --no-bench.
DIR/summary.md gathers the instances' summaries. The side-by-side steps share the GPU and the CPU cores, so their
times are not their own; the benchmarks run alone.

Options:
  -o, --out DIR          where the instances' directories go (default: gpu_check_out/ at the top of the repository)
  -t, --timeout SECONDS  gpu_check.sh's limit for each step (default 0: none)
  -b, --budget SECONDS   gpu_check.sh's limit for each side-by-side instance as a whole (they start together after
                         the build, so they all end within SECONDS of it, each with its summary; default 0: none)
  --no-bench             stop after the side-by-side part
  -h, --help             print this help and exit

Environment: as gpu_check.sh (PYTHON, CUDA_HOME, TORCH_CUDA_ARCH_LIST, MAX_JOBS, PYTEST_ADDOPTS).
Exit status: 0 when every instance passed, 1 when one failed, 2 for bad arguments.
EOF
}

RESULTS_DIR="" TIMEOUT=0 BUDGET=0 BENCH=1
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    -o | --out) [ $# -ge 2 ] && [ -n "$2" ] || { echo "gpu_check_fast.sh: $1 needs a directory" >&2; exit 2; }
      RESULTS_DIR=$2; shift 2 ;;
    -t | --timeout) [ $# -ge 2 ] || { echo "gpu_check_fast.sh: $1 needs a number of seconds" >&2; exit 2; }
      TIMEOUT=$2; shift 2 ;;
    -b | --budget) [ $# -ge 2 ] || { echo "gpu_check_fast.sh: $1 needs a number of seconds" >&2; exit 2; }
      BUDGET=$2; shift 2 ;;
    --no-bench) BENCH=0; shift ;;
    *) echo "gpu_check_fast.sh: unknown argument: $1 (--help for the usage)" >&2; exit 2 ;;
  esac
done
for value in "$TIMEOUT" "$BUDGET"; do
  case $value in
    '' | *[!0-9]*) echo "gpu_check_fast.sh: --timeout and --budget expect a whole number of seconds, got '$value'" >&2
      exit 2 ;;
  esac
done
[ -n "$RESULTS_DIR" ] || RESULTS_DIR=$(cd "$(dirname "$0")/.." && pwd)/gpu_check_out
mkdir -p "$RESULTS_DIR" && RESULTS_DIR=$(cd "$RESULTS_DIR" && pwd) || exit 2
cd "$(dirname "$0")/.." || exit 2
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=$PWD/.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHON

# gpu_check NAME ARG...: an instance of gpu_check.sh into DIR/NAME, its output in DIR/NAME.out.
gpu_check() {
  local name=$1
  shift
  bash benchmarks/gpu_check.sh --out "$RESULTS_DIR/$name" --timeout "$TIMEOUT" "$@" > "$RESULTS_DIR/$name.out" 2>&1
}
# side NAME ARG...: a side-by-side instance, within --budget.
side() {
  local name=$1
  shift
  gpu_check "$name" --budget "$BUDGET" "$@"
}

FAILED=()
names=(test check racecheck_attention_float32 racecheck_attention_float16 racecheck_attention_bfloat16
       racecheck_others sanitizers)  # the side-by-side instances, in the order they start
gpu_check build env build || FAILED+=(build)
if [ ${#FAILED[@]} -eq 0 ]; then
  workers=${PYTEST_ADDOPTS-}
  [ -n "$workers" ] || ! "$PYTHON" -c "import xdist" 2>/dev/null || workers="-n 10"
  others=()
  for op in $("$PYTHON" -c "from pytransformer.check import OPS; print(*OPS)"); do
    [ "$op" = attention ] || others+=(--op "$op")
  done
  PYTEST_ADDOPTS=$workers side test test & pids=($!)
  side check check & pids+=($!)
  for dtype in float32 float16 bfloat16; do
    side "racecheck_attention_$dtype" --op attention --dtype "$dtype" racecheck & pids+=($!)
  done
  side racecheck_others ${others[@]+"${others[@]}"} racecheck & pids+=($!)
  side sanitizers memcheck synccheck initcheck & pids+=($!)
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || FAILED+=("${names[$i]}"); done
  [ "$BENCH" = 0 ] || gpu_check bench bandwidth bench || FAILED+=(bench)
fi

{
  echo "# GPU check, side by side"
  echo
  no_bench=""
  [ "$BENCH" = 1 ] || no_bench=" --no-bench"
  echo "- command: bash benchmarks/gpu_check_fast.sh --out $RESULTS_DIR --timeout $TIMEOUT --budget $BUDGET$no_bench"
  echo "- failed instances: ${FAILED[*]:-none}"
  for name in build "${names[@]}" bench; do
    [ -f "$RESULTS_DIR/$name/summary.md" ] || continue
    echo
    echo "## $name"
    sed -e 1d -e 's/^#/##/' "$RESULTS_DIR/$name/summary.md"
  done
} > "$RESULTS_DIR/summary.md"
cat "$RESULTS_DIR/summary.md"
[ ${#FAILED[@]} -eq 0 ]
