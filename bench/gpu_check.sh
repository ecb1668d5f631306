#!/usr/bin/env bash
# On a GPU machine, from a copy of the repository: the Triton tests, then the ops benchmark (≈ 6 min on an H100).
#   OUT=/path/to/results bash bench/gpu_check.sh     (OUT defaults to bench/results)
# Writes into $OUT: gpu_tests.log, triton_aot_shared_memory.json, bench_ops.log, ops_gpu.json.
# Each step has a hard time limit so the whole script fits a short GPU loan; the exit status is non-zero if
# any step failed or timed out. The tests compile the benchmark's kernels first (same shapes: triton's cache).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
status=0

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv 2>&1 \
    | tee "$OUT/gpu_tests.log"
PE_FAST_AOT_RECORD="$OUT/triton_aot_shared_memory.json" timeout 200 python3 -m pytest -q -rs --durations=15 \
    tests/test_triton_attention.py tests/test_triton_compile.py tests/test_ops_reference.py 2>&1 \
    | tee -a "$OUT/gpu_tests.log" || status=1

timeout 150 python3 bench/bench_ops.py --out "$OUT/ops_gpu.json" --budget-s 90 2>&1 \
    | tee "$OUT/bench_ops.log" || status=1
exit $status
