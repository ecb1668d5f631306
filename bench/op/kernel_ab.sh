#!/usr/bin/env bash
# The C++ attention kernels of the working tree against those of a git revision, side by side in one process
# (bench/op/kernel_ab.cpp): the way to measure a kernel change on a shared, noisy machine.
#   bash bench/op/kernel_ab.sh REV [N D_HEAD PROBES PROBLEMS REPEATS]   (default: 100 32 2 288 15, the fMRI default)
set -u
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '/^#!/d; /^#/!q; s/^# \{0,1\}//p' "$0"; exit 0; }  # the header above
cd "$(dirname "$0")/../.."
rev=${1:-}
if [[ -z $rev ]]; then
    echo "usage: bash bench/op/kernel_ab.sh REV [N D_HEAD PROBES PROBLEMS REPEATS]" >&2
    exit 2
fi
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! git show "$rev:kernels/pe_attention.h" 2>/dev/null \
        | sed 's/namespace pe_fast\b/namespace pe_fast_old/; s/^#pragma once//' > "$work/pe_attention_old.h" \
        || [[ ! -s $work/pe_attention_old.h ]]; then
    echo "error: no kernels/pe_attention.h at revision '$rev'" >&2
    exit 2
fi
g++ -O3 -march=native -mprefer-vector-width=512 -fno-trapping-math -fopenmp -std=c++20 -Ikernels -I"$work" bench/op/kernel_ab.cpp \
    -o "$work/kernel_ab" || exit 1
if (($# == 0)); then set -- 100 32 2 288 15; fi
"$work/kernel_ab" "$@"
