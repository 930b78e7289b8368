#!/usr/bin/env bash
# Compile-checks the CUDA sources against the headers of the torch installed for $PYTHON (default python3; a CPU wheel
# is enough): the glue, csrc/cuda/*.cpp, with the C++ compiler and the extension's C++ flags (unoptimised), and the
# kernel units, csrc/cuda/*.cu, with nvcc (compile only, no libraries): to sm_90 machine code (ptxas included; its PTX
# takes every code path a build for sm_80 or later takes, as the only arch switch in the sources is mma.cuh's
# __CUDA_ARCH__ >= 800) and to sm_75 machine code (the default arch list has 7.5: a build for a 7.x GPU must get through
# ptxas, with the sm_80-only PTX of the tensor-core code, mma.sync bf16 and cp.async, compiled out there). The sm_75
# pass is device code alone, unoptimised (cicc and ptxas at -O0): what it shows, that every instruction is one sm_75
# has, does not depend on optimisation, and optimised, the int8 GEMV's unrolled loops alone take minutes. Five gates,
# each failing the check:
# - tools/host_calls_gate.py, first: each unit through nvcc's device front end without --expt-relaxed-constexpr, so
#   that device code calling a host library function (std::copy, which nvcc compiles to nothing) is reported;
# - tools/ptxas_gate.py: ptxas reports every kernel's resources (-Xptxas -v, logs in build/cuda_check/); local memory
#   in an attention, decode or append kernel, or more registers than tools/cuda_registers.txt records, fails;
# - tools/mma_operands_gate.py: in the sm_90 PTX of the tensor-core attention units (kept in build/cuda_check/),
#   every mma.sync reads fragments loaded by ldmatrix or packed by cvt, and a forward's P V products read P;
# - tools/link_gate.py: the glue's objects and the kernel units' sm_90 objects linked together leave no pytransformer
#   symbol undefined (every launch function the glue calls is instantiated under the name the glue's compiler uses);
# - tools/check_host_objects.py on the same objects: no host code of ours compiled by both compilers into one copy,
#   no weak symbol that the two compile with different visibility.
# Exits non-zero if any compile or gate fails.
# NVCC (default $CUDA_HOME/bin/nvcc or /usr/local/cuda/bin/nvcc), NVCC_EXTRA (e.g. "-Xptxas -v") and CXX (default
# g++) are honoured.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
NVCC=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
PTXAS=$(dirname "$NVCC")/ptxas
TORCH_INC=$("$PYTHON" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'include'))") || {
  echo "check_cuda: cannot import torch with $PYTHON" >&2; exit 2; }
PY_INC=$("$PYTHON" -c "import sysconfig; print(sysconfig.get_paths()['include'])") || exit 2
# The extension's nvcc flags (tools/build_config.py: torch's common ones and ours), and the CPU-wheel switch.
mapfile -t BUILD_FLAGS < <("$PYTHON" tools/build_config.py nvcc-flags)
[ ${#BUILD_FLAGS[@]} -gt 0 ] || { echo "check_cuda: tools/build_config.py nvcc-flags failed" >&2; exit 2; }
mapfile -t CXX_FLAGS < <("$PYTHON" tools/build_config.py cxx-flags)
INCLUDES=(-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE -I"$TORCH_INC" -I"$TORCH_INC/torch/csrc/api/include" -I"$PY_INC" -Icsrc)
FLAGS=("${BUILD_FLAGS[@]}" "${INCLUDES[@]}")
# The glue as the extension compiles it, unoptimised (its objects serve the link gate alone).
GLUE_FLAGS=("${CXX_FLAGS[@]}" -O0 -fPIC -D"$("$PYTHON" -c 'from tools import build_config as c; print(c.CUDA_MACRO)')"
            "${INCLUDES[@]}" -I"$(dirname "$NVCC")/../include")
shopt -s nullglob
files=()  # the slowest units first, so that no job is left with one at the end
for f in csrc/cuda/int8_linear_kernel.cu csrc/cuda/attention_simt.cu csrc/cuda/*.cu; do
  [ -e "$f" ] && [[ " ${files[*]} " != *" $f "* ]] && files+=("$f")
done
glue=(csrc/cuda/*.cpp)
LOGS=build/cuda_check
rm -rf "$LOGS" && mkdir -p "$LOGS/sm_75"
[ ${#files[@]} -gt 0 ] || { echo "check_cuda: no csrc/cuda/*.cu files"; exit 0; }
jobs=${CHECK_JOBS:-$(nproc)}
failed=0
# The sm_90 PTX stands for sm_80's only while no source switches on an arch other than 8.0.
if grep -rnE "__CUDA_ARCH__ *[<>=!]+ *[0-9]+" csrc/cuda | grep -vE "__CUDA_ARCH__ >= 800\b"; then
  echo "check_cuda: an arch switch other than __CUDA_ARCH__ >= 800: compile its other side too"; failed=1
fi
"$PYTHON" tools/host_calls_gate.py --nvcc "$NVCC" --jobs "$jobs" "${files[@]}" || failed=1
# Prints a unit's log (warnings, if any; not ptxas's resource lines, which tools/ptxas_gate.py reads) and its result:
# report STATUS LOG WHAT START.
report() {
  grep -v "^ptxas info\|bytes stack frame" "$2"
  if [ "$1" = 0 ]; then echo "ok    $3 ($((SECONDS - $4)) s)"; else echo "FAIL  $3"; return 1; fi
}
# A glue unit: compiled by the C++ compiler with the extension's flags, to an object for the link gate.
check_glue() {
  local f=$1 start=$SECONDS name
  name=$(basename "$f" .cpp)
  "${CXX:-g++}" "${GLUE_FLAGS[@]}" -c -o "$LOGS/$name.glue.o" "$f" >"$LOGS/$name.glue.log" 2>&1
  report $? "$LOGS/$name.glue.log" "glue $f" "$start"
}
# Per kernel unit, the host side and sm_90, then sm_75's device code; files compile in parallel, the slowest first.
check() {
  local f=$1 start=$SECONDS name keep=()
  name=$(basename "$f" .cu)
  if grep -q '#include "attention_mma.cuh"' "$f"; then  # keep the PTX for the operand gate
    keep=(--keep --keep-dir "$LOGS/$name.keep") && mkdir -p "$LOGS/$name.keep"
  fi
  local sm75=$LOGS/sm_75/$name.ptx
  # shellcheck disable=SC2086
  "$NVCC" -c -o "$LOGS/$name.o" "${FLAGS[@]}" -Xcompiler=-fPIC ${NVCC_EXTRA:-} -Xptxas -v "${keep[@]}" \
    -gencode arch=compute_90,code=sm_90 "$f" >"$LOGS/$name.log" 2>&1 &&
    "$NVCC" --ptx -o "$sm75" "${FLAGS[@]}" -arch=compute_75 -Xcicc -O0 "$f" >>"$LOGS/$name.log" 2>&1 &&
    "$PTXAS" -arch=sm_75 -O0 -o /dev/null "$sm75" >>"$LOGS/$name.log" 2>&1
  report $? "$LOGS/$name.log" "sm_90 sm_75 $f" "$start" || return 1
  rm -f "$sm75"
  if [ ${#keep[@]} -gt 0 ]; then
    mv "$LOGS/$name.keep/$name.ptx" "$LOGS/$name.compute_90.ptx" && rm -rf "$LOGS/$name.keep"
  fi
}
pids=()
for f in "${files[@]}" "${glue[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
  if [[ $f == *.cpp ]]; then check_glue "$f" & else check "$f" & fi
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ $failed = 0 ] && { "$PYTHON" tools/ptxas_gate.py "$LOGS"/*.log || failed=1; }
[ $failed = 0 ] && { "$PYTHON" tools/mma_operands_gate.py "$LOGS"/*.ptx || failed=1; }
[ $failed = 0 ] && { "$PYTHON" tools/link_gate.py "$LOGS"/*.o || failed=1; }
[ $failed = 0 ] && { "$PYTHON" tools/check_host_objects.py "$LOGS" || failed=1; }
exit $failed
