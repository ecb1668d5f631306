#!/usr/bin/env bash
# On a GPU machine, from a copy of the repository (no network needed): every PE kind on CUDA, the precision check
# of the science, the sweep's own training path, the CUDA tests, profiles, the op's benchmarks and the tile tuning.
# The steps' time limits add up to about 25 minutes, and GPU_CHECK_BUDGET_S (500 s) caps one run: choose steps.
# One 8-minute call fitted pe_kinds (in a second run, in the background), science, stacked_optimizer, sweep and
# profile_sweep on an H200 (2026-11-27: 470 s).
#   OUT=/path/to/results bash bench/gpu/gpu_check.sh        (OUT defaults to bench/results/gpu)
# The device tool brings back only a handful of files from its $OUT: there, write elsewhere and bring back one archive,
#   OUT=/tmp/gc bash bench/gpu/gpu_check.sh; tar -czf "$OUT/gpu_check.tar.gz" -C /tmp/gc .
# GPU_CHECK_STEPS="pe_kinds science sweep" runs those steps only (default: all, in the order below).
# Writes into $OUT:
#   env.log                       GPU, driver, clocks, torch / triton / nvidia-ml-py versions
#   pe_kinds.log                  a few CUDA steps of every PE kind of lst --preset paper, netsim and fmri --preset all-pes
#                                 (fmri needs what bench/gpu/gpu_carry.sh prepares)
#   science.log, science/         lst paper configuration, learned σ 0.2 / 2.0 and sin2d, 5 seeds (SCIENCE_SEEDS),
#                                 8,000 steps, in fp32 and bf16 (SCIENCE_PRECISIONS="fp32 bf16 fp16" adds fp16,
#                                 whose attention runs on the reference until the Triton kernels take fp16),
#                                 side by side in $SCIENCE_RUNS: each one's summary.txt and results.parquet
#   science_check.md              bench/science/precision_check.py on them: the table and a verdict per precision
#   science_paths.log, science_paths/, science_paths_check.md   the same grid through the unfused Triton step and the
#                                 fused sublayers in tf32 (SCIENCE_PATHS, SCIENCE_PATHS_PRECISION), one folder
#                                 per path, and precision_check.py --by folder's verdict (issue 54)
#   sweep.log, sweep_gpu*.json    bench/training/bench_sweep_gpu.py: the sweep's training path at the paper's LST
#                                 configuration, 90 models per precision compiled (fp16 too), each record with the
#                                 byte ledger's bytes_per_model_step; 18 and 90 in fp32 with CUDA
#                                 graphs against compiled alone (tf32 also with the kernels' TF32
#                                 dots), 315 compiled tf32, then 90 eager
#   fused.log, sweep_gpu_{fused,unfused}{,_tf32}.json   issue 45: the fused sublayers (--backend fused,
#                                 eager) against the unfused step (eager and compiled), 90 models, bf16, fp32, tf32
#   profile_sweep*.txt            bench/training/profile_sweep_step.py: the compiled tf32 step's kernels by GPU time
#   stacked_optimizer_gpu.json    bench/training/bench_stacked_optimizer.py on cuda (issue 14's per-model learning
#                                 rates)
#   gpu_tests.log, gpu_tests.xml  pytest tests/test_triton_attention.py tests/test_op_transforms.py
#                                 tests/test_fused_sublayers.py tests/test_open_models.py (CUDA)
#   profile_n16.log/.json         bench/op/profile_op.py: kernels, launches, host vs GPU time at the LST shape
#   profile_fmri.log/.json        the same at N = 360 (bf16, tf32)
#   op_overhead.log/.json         bench/op/bench_op_overhead.py: host µs per call, direct eager path vs the custom op
#   bench_ops.log, ops_gpu.json   bench/op/bench_ops.py: fused op vs reference, SDPA+stats, FlexAttention+stats
#   training_gpu.log/.json        bench/training/bench_training.py on cuda (default backend: triton)
#   training_gpu_reference.log/.json   the same with --backend reference
#   tune.log, tune_gpu.json       bench/op/tune_triton.py: the kernels' tiles varied against kernel_config's choice
#   steps.tsv                     step, exit code (124 = hit its time limit), seconds
# Every step runs whatever the previous ones did, under its own time limit (never past the overall budget);
# the exit status is 1 if any step failed. The ahead-of-time compile test needs no GPU and runs in CI instead.
set -u
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '/^#!/d; /^#/!q; s/^# \{0,1\}//p' "$0"; exit 0; }  # the header above
cd "$(dirname "$0")/../.."
source bench/gpu/gpu_env.sh
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
BUDGET_S=${GPU_CHECK_BUDGET_S:-500}  # all steps together
START=$SECONDS
status=0
printf 'step\texit_code\tseconds\n' > "$OUT/steps.tsv"

# step NAME LIMIT_S LOG COMMAND...: run COMMAND with output to $OUT/LOG (and the console), time-limited
step() {
    local name=$1 limit=$2 log=$3
    shift 3
    local left=$((BUDGET_S - (SECONDS - START)))
    if ((left < 20)); then
        echo "== $name: skipped, overall budget of ${BUDGET_S}s spent" | tee "$OUT/$log"
        printf '%s\tskipped\t0\n' "$name" >> "$OUT/steps.tsv"
        status=1
        return
    fi
    ((limit > left)) && limit=$left
    echo "== $name (limit ${limit}s): $*" | tee "$OUT/$log"
    local t0=$SECONDS
    timeout -k 10 "$limit" "$@" >> "$OUT/$log" 2>&1
    local rc=$?
    tail -n 25 "$OUT/$log"
    echo "== $name: exit $rc after $((SECONDS - t0))s"
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$OUT/steps.tsv"
    ((rc != 0)) && status=1
}

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,memory.total,power.limit \
        --format=csv 2>&1
    python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'triton', triton.__version__, 'gpu', torch.cuda.get_device_name() if torch.cuda.is_available() else None)" 2>&1
    python3 -c "import pynvml; print('nvidia-ml-py', getattr(pynvml, '__version__', 'present'))" 2>&1
} > "$OUT/env.log"
cat "$OUT/env.log"

STEPS=${GPU_CHECK_STEPS:-pe_kinds science science_paths stacked_optimizer sweep fused profile_sweep tests profile_n16 profile_fmri
op_overhead bench_ops training training_reference tune}
wanted() { [[ " ${STEPS//$'\n'/ } " == *" $1 "* ]]; }

# Every PE kind moves to the GPU and trains (issue 13: the random PE's tables once stayed on the CPU).
if wanted pe_kinds; then
    step pe_kinds 150 pe_kinds.log bash -c "set -e
        python3 -m pe_fast.sweep --task lst --preset paper --seeds 1 --sigmas 0.5 --steps 20 --eval-every 10 \
            --eval-items 64 --out /tmp/pe_kinds_lst --no-report
        python3 -m pe_fast.sweep --task netsim --preset all-pes --seeds 1 --sigmas 0.5 --steps 20 --eval-every 10 \
            --eval-items 64 --out /tmp/pe_kinds_netsim --no-report
        python3 -m pe_fast.sweep --task fmri --preset all-pes --seeds 1 --sigmas 0.5 --steps 20 --eval-every 10 \
            --out /tmp/pe_kinds_fmri --no-report"
fi

# The speed must not change the science: the same sweeps in fp32 and the faster precisions, side by side on the one
# GPU, each with its share of the host's cores (they are host-bound small packs), then
# bench/science/precision_check.py's verdict. tf32 is left out by default: nothing on its path changed after its
# check of 2026-11-27.
science() {
    local pids=() rc=0 precisions=(${SCIENCE_PRECISIONS:-fp32 bf16})
    local threads=$(( $(nproc) / (2 * ${#precisions[@]}) ))
    ((threads > 0)) || threads=1
    rm -rf "$SCIENCE_RUNS"
    for precision in "${precisions[@]}"; do
        # sin2d without the preset's dropout, as in the earlier checks: with it, sin2d and σ 0.2 generalise
        # alike (docs/reproduction-lst.md, epoch 200); the verdict's ranking test would follow the noise between them
        for pe in learned "sin2d --pe-dropout 0"; do
            # shellcheck disable=SC2086  # $pe carries its flag
            python3 -m pe_fast.sweep --task lst --preset paper --pe $pe --sigmas 0.2,2.0 --seeds ${SCIENCE_SEEDS:-5} \
                --steps ${SCIENCE_STEPS:-8000} --eval-every 2000 --precision $precision --threads $threads \
                --out "$SCIENCE_RUNS/$precision-${pe%% *}" --no-report &
            pids+=($!)
        done
    done
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    # Two files per run come back (a device call returns only so many): the summary and the per-model results.
    mkdir -p "$OUT/science"
    for run in "$SCIENCE_RUNS"/*/; do
        name=$(basename "$run")
        echo "== $name"; cat "$run/summary.txt"
        cp "$run/summary.txt" "$OUT/science/$name-summary.txt"
        cp "$run/results.parquet" "$OUT/science/$name-results.parquet"
    done
    python3 bench/science/precision_check.py "$OUT/science" --verdicts "$OUT/science_check.json" \
        | tee "$OUT/science_check.md" || rc=1
    return $rc
}
export -f science
export OUT SCIENCE_RUNS=${SCIENCE_RUNS:-/tmp/pe_fast_science}
wanted science && step science 300 science.log bash -c science

# The fused sublayers must not change the science either (issue 54): the same grid through the unfused Triton step
# and the fused sublayers (SCIENCE_PATHS, first the reference) in one precision (SCIENCE_PATHS_PRECISION: tf32, the
# fastest that passed its check), eager (the fused sublayers are one kernel each already), side by side, then
# precision_check.py --by folder. On a CPU it runs as a dry run of the step itself, e.g.
#   SCIENCE_PATHS="reference cpp" SCIENCE_PATHS_PRECISION=fp32 SCIENCE_STEPS=20 GPU_CHECK_STEPS=science_paths ...
science_paths() {
    local pids=() rc=0 paths=(${SCIENCE_PATHS:-triton fused}) precision=${SCIENCE_PATHS_PRECISION:-tf32}
    local threads=$(( $(nproc) / (2 * ${#paths[@]}) ))
    ((threads > 0)) || threads=1
    rm -rf "$SCIENCE_RUNS"
    for path in "${paths[@]}"; do
        for pe in learned "sin2d --pe-dropout 0"; do  # sin2d without dropout: as the science step, for the same reason
            # shellcheck disable=SC2086  # $pe carries its flag
            python3 -m pe_fast.sweep --task lst --preset paper --pe $pe --sigmas 0.2,2.0 --seeds ${SCIENCE_SEEDS:-5} \
                --steps ${SCIENCE_STEPS:-8000} --eval-every 2000 --precision $precision --backend $path \
                --compile off --threads $threads --out "$SCIENCE_RUNS/$path-${pe%% *}" --no-report --no-weights &
            pids+=($!)
        done
    done
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    # one folder per compute path: precision_check.py --by folder compares them
    for run in "$SCIENCE_RUNS"/*/; do
        name=$(basename "$run")
        echo "== $name"; cat "$run/summary.txt"
        mkdir -p "$OUT/science_paths/${name%%-*}"
        cp "$run/summary.txt" "$OUT/science_paths/${name%%-*}/${name#*-}-summary.txt"
        cp "$run/results.parquet" "$OUT/science_paths/${name%%-*}/${name#*-}-results.parquet"
    done
    python3 bench/science/precision_check.py "$OUT/science_paths" --by folder --reference "${paths[0]}" \
        | tee "$OUT/science_paths_check.md" || rc=1
    return $rc
}
export -f science_paths
wanted science_paths && step science_paths 300 science_paths.log bash -c science_paths

# Issue 14: one learning rate per model (pe_fast.stacked_optim) against torch's fused optimizer, on the GPU.
wanted stacked_optimizer && step stacked_optimizer 60 stacked_optimizer.log \
    python3 bench/training/bench_stacked_optimizer.py --device cuda --repeats 5 --out "$OUT/stacked_optimizer_gpu.json"

if wanted sweep; then
    # The most telling configurations first (compiled is the CUDA default): a time limit keeps what ran.
    step sweep 240 sweep.log bash -c "python3 bench/training/bench_sweep_gpu.py --models 90 \
            --precisions fp32,tf32,bf16,fp16 --compile on --steps 10 --warmup 3 --out $OUT/sweep_gpu_compiled.json \
            \$([ -f $OUT/science_check.json ] && echo --science-check $OUT/science_check.json)
        python3 bench/training/bench_sweep_gpu.py --models 18,90 --precisions fp32 --compile on,graphs --steps 10 \
            --warmup 3 --out $OUT/sweep_gpu_graphs.json
        PE_FAST_TF32=1 python3 bench/training/bench_sweep_gpu.py --models 90 --precisions tf32 --compile on --steps 10 \
            --warmup 3 --out $OUT/sweep_gpu_compiled_kernel_tf32.json
        python3 bench/training/bench_sweep_gpu.py --models 315 --precisions tf32 --compile on --steps 10 --warmup 3 \
            --out $OUT/sweep_gpu_compiled_315.json
        python3 bench/training/bench_sweep_gpu.py --models 90 --precisions bf16,tf32,fp32 --compile off --steps 10 \
            --warmup 3 --out $OUT/sweep_gpu_eager.json"
fi

# Issue 45: model-steps/s of the fused sublayers (eager: each sublayer is one kernel already) against the unfused
# Triton step, eager and compiled, in one run, fused first (a time limit keeps what ran); TF32 with the kernels' dots
# in TF32 too (PE_FAST_TF32=1, which would also turn fp32's). Alone:
#   OUT=... GPU_CHECK_STEPS=fused bash bench/gpu/gpu_check.sh
wanted fused && step fused 300 fused.log bash -c "set -e
        run() { python3 bench/training/bench_sweep_gpu.py --models 90 --steps 10 --warmup 3 --baseline-steps 5 \
            --eval-items 256 \"\$@\"; }
        run --backend fused --precisions bf16,fp32 --compile off --out $OUT/sweep_gpu_fused.json
        PE_FAST_TF32=1 run --backend fused --precisions tf32 --compile off --out $OUT/sweep_gpu_fused_tf32.json
        run --backend triton --precisions bf16,fp32 --compile off,on --out $OUT/sweep_gpu_unfused.json
        PE_FAST_TF32=1 run --backend triton --precisions tf32 --compile off,on \
            --out $OUT/sweep_gpu_unfused_tf32.json"

# Where the compiled TF32 step spends GPU time now.
wanted profile_sweep && step profile_sweep 60 profile_sweep.log python3 bench/training/profile_sweep_step.py \
    --models 90 --precision tf32 --compile on --out "$OUT/profile_sweep_tf32_compiled.txt"

# CUDA comparisons against the reference (fp32, TF32, bf16, RoPE), vmap / compile / opcheck on CUDA, trained models
# opened on CUDA (run.model(i, "cuda"), every PE kind); the
# interpreter suite is CPU-only (CI), so it is deselected here.
wanted tests && step tests 180 gpu_tests.log python3 -m pytest -q -rs --durations=10 -p no:cacheprovider \
    --junitxml="$OUT/gpu_tests.xml" \
    --deselect tests/test_triton_attention.py::test_cpu_interpreter_suite_in_a_child_process \
    --deselect tests/test_fused_sublayers.py::test_cpu_interpreter_suite_in_a_child_process \
    tests/test_triton_attention.py tests/test_op_transforms.py tests/test_fused_sublayers.py \
    tests/test_open_models.py

wanted profile_n16 && step profile_n16 100 profile_n16.log python3 bench/op/profile_op.py --iters 10 \
    --out "$OUT/profile_n16.json"

wanted profile_fmri && step profile_fmri 60 profile_fmri.log python3 bench/op/profile_op.py --shape fmri \
    --precisions bf16,tf32 --out "$OUT/profile_fmri.json" --iters 5

wanted op_overhead && step op_overhead 40 op_overhead.log python3 bench/op/bench_op_overhead.py --device cuda \
    --repeats 9 --out "$OUT/op_overhead.json"

wanted bench_ops && step bench_ops 150 bench_ops.log python3 bench/op/bench_ops.py --out "$OUT/ops_gpu.json" \
    --budget-s 110

wanted training && step training 60 training_gpu.log python3 bench/training/bench_training.py --device cuda \
    --models 64 --depth 4 --repeats 5 --shapes 160x128,64x32 --out "$OUT/training_gpu.json"

wanted training_reference && step training_reference 50 training_gpu_reference.log \
    python3 bench/training/bench_training.py --backend reference --device cuda --models 64 --depth 4 --repeats 3 --shapes 160x128 \
    --out "$OUT/training_gpu_reference.json"

wanted tune && step tune 140 tune.log python3 bench/op/tune_triton.py --out "$OUT/tune_gpu.json" --budget-s 110

echo "== done in $((SECONDS - START))s, status $status"
cat "$OUT/steps.tsv"
exit $status
