#!/usr/bin/env bash
# On a GPU machine, from a copy of the repository: the CUDA/Triton tests, the ops benchmark, the stacked
# training benchmark and a short CUDA sweep (≈ 8 min on an H100).
#   OUT=/path/to/results bash bench/gpu_check.sh     (OUT defaults to bench/results)
# Writes into $OUT: gpu_tests.log, bench_ops.log, ops_gpu.json, training_gpu.log, training_gpu.json, sweep_gpu.log.
# Each step has a hard time limit so the whole script fits a short GPU loan; the exit status is non-zero if
# any step failed or timed out. The ahead-of-time compile test needs no GPU and runs in CI instead.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
status=0

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv 2>&1 \
    | tee "$OUT/gpu_tests.log"
timeout 200 python3 -m pytest -q -rs --durations=15 -p no:cacheprovider \
    tests/test_triton_attention.py tests/test_ops_reference.py 2>&1 | tee -a "$OUT/gpu_tests.log" || status=1

timeout 170 python3 bench/bench_ops.py --out "$OUT/ops_gpu.json" --budget-s 140 2>&1 \
    | tee "$OUT/bench_ops.log" || status=1

timeout 80 python3 bench/bench_training.py --device cuda --models 64 --depth 4 --repeats 5 \
    --shapes 160x128,64x32 --out "$OUT/training_gpu.json" 2>&1 | tee "$OUT/training_gpu.log" || status=1

timeout 60 python3 -m pe_fast.sweep --task lst --preset paper --pe learned,sin2d --sigmas 0.2,2 --seeds 2 \
    --steps 300 --eval-every 100 --out /tmp/sweep_gpu 2>&1 | tee "$OUT/sweep_gpu.log" || status=1
exit $status
