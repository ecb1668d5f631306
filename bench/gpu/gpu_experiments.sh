#!/usr/bin/env bash
# On a GPU machine, from a copy of the repository with what bench/gpu/gpu_carry.sh prepared: the science runs that need
# a GPU, side by side (small packs leave the GPU idle between launches, so several sweeps share it well):
#   lst_lr_adam     issue 14: LST paper configuration, learned σ 0.2 / 2.0 × AdamW lr 3e-5, 1e-4 (the paper's), 3e-4
#                   × 3 seeds, 8,000 steps, one 18-model pack with per-model rates
#   lst_lr_sgd      the same with SGD + momentum 0.9 at 100× those rates (3e-3, 1e-2, 3e-2; on fMRI SGD needed about
#                   100× Adam's rate to leave the lazy regime, docs/reproduction-fmri.md)
#   glasser         issue 17 item 4: fMRI on the Glasser-360 surrogate, the default σ grid, --preset converged
#   glasser_none, glasser_sin1d, glasser_random, glasser_sinnd
#                   the rest of --preset all-pes at the converged preset's steps, one sweep per PE kind: the local
#                   executor trains a sweep's packs (one per PE kind) one after the other, separate sweeps at once
#   lst_e200_sin2d, lst_e200_sin2d_no_dropout
#                   issue 17 item 3: the 2D sinusoidal PE at the authors' epoch 200 (--preset paper-e200, their 15
#                   seeds), with their sinusoidal modules' dropout 0.1 on x + PE (the preset's) and without it
#                   (--pe-dropout 0), for python -m pe_fast.compare_lst_logs
#   lst_e200_learned_dropout
#                   the fair comparison: the learned PE (σ 0.2 and 1.0, their 15 seeds) with the same dropout on x + PE
#                   that their sinusoidal modules get (--pe-dropout-on learned); against lst_e200_sin2d and against
#                   their learned PE without it
#   OUT=/path/to/results bash bench/gpu/gpu_experiments.sh      (OUT defaults to bench/results/gpu-experiments)
# GPU_EXPERIMENTS="lst_lr_adam glasser" runs those only; GPU_EXPERIMENTS_LIMIT_S (500) caps each one; LST_STEPS
# (8000) sets the LST runs' steps.
# Writes into $OUT: env.log, one NAME.log per run (its progress and summary), steps.tsv (name, exit code, seconds)
# and runs.tar.gz: every run folder without its checkpoints (packs/), so that the report can be rebuilt here.
set -u
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '/^#!/d; /^#/!q; s/^# \{0,1\}//p' "$0"; exit 0; }  # the header above
cd "$(dirname "$0")/../.."
source bench/gpu/gpu_env.sh
OUT=${OUT:-bench/results/gpu-experiments}
RUNS=${RUNS:-/tmp/gpu-experiment-runs}
LIMIT_S=${GPU_EXPERIMENTS_LIMIT_S:-500}
mkdir -p "$OUT" "$RUNS"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1
} > "$OUT/env.log"

lst_paper="--task lst --preset paper --pe learned --sigmas 0.2,2.0 --seeds 3 --steps ${LST_STEPS:-8000}"
lst_paper+=" --eval-every 2000"
declare -A COMMANDS=(
    [lst_lr_adam]="$lst_paper --lr 3e-5,1e-4,3e-4"
    [lst_lr_sgd]="$lst_paper --optimizer sgd --momentum 0.9 --lr 3e-3,1e-2,3e-2"
    [glasser]="--task fmri --atlas glasser360 --preset converged"
    [lst_e200_sin2d]="--task lst --preset paper-e200 --pe sin2d"
    [lst_e200_sin2d_no_dropout]="--task lst --preset paper-e200 --pe sin2d --pe-dropout 0"
    [lst_e200_learned_dropout]="--task lst --preset paper-e200 --pe learned --sigmas 0.2,1.0 --pe-dropout-on learned"
)
for pe in none sin1d random sinnd; do
    COMMANDS[glasser_$pe]="${COMMANDS[glasser]} --pe $pe"
done
names=${GPU_EXPERIMENTS:-lst_lr_adam lst_lr_sgd glasser glasser_none glasser_sin1d glasser_random glasser_sinnd}
# Each sweep takes its share of the cores: with 16 threads each, seven sweeps on 16 cores spent their time waiting
# on each other's host threads (2026-11-27, H200: the two LST packs ran at about 200 model-steps/s, the Glasser ones
# at 60-117; alone, a 90-model LST pack runs at 2,066).
count=$(wc -w <<< "$names")
threads=$(( $(nproc) / count > 0 ? $(nproc) / count : 1 ))
printf 'name\texit_code\tseconds\n' > "$OUT/steps.tsv"
for name in $names; do
    [[ -n ${COMMANDS[$name]:-} ]] || { echo "unknown experiment $name" >&2; exit 2; }
    (
        t0=$SECONDS
        command="python -m pe_fast.sweep ${COMMANDS[$name]} --threads $threads --out $RUNS/$name"
        echo "== $name: $command" > "$OUT/$name.log"
        # shellcheck disable=SC2086  # the command is a list of flags
        timeout -k 10 "$LIMIT_S" python3 -m pe_fast.sweep ${COMMANDS[$name]} --threads "$threads" --out "$RUNS/$name" \
            >> "$OUT/$name.log" 2>&1
        rc=$?
        printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$OUT/steps.tsv"
        echo "== $name: exit $rc after $((SECONDS - t0))s"
    ) &
done
wait
tar -czf "$OUT/runs.tar.gz" -C "$RUNS" --exclude=packs . 2>/dev/null
cat "$OUT/steps.tsv"
