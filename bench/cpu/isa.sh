#!/usr/bin/env bash
# Runs a command as an AVX2-only CPU would run it, on whichever x86 machine this is (an AVX-512 one included):
#
#   bash bench/cpu/isa.sh avx2 COMMAND [ARGS...]    e.g. bash bench/cpu/isa.sh avx2 python bench/training/bench_peers.py
#   bash bench/cpu/isa.sh native COMMAND [ARGS...]  the machine as it is (the same report, for a comparison)
#
# avx2 (an AMD EPYC of the Zen 2/3 kind, an Intel before Skylake-SP: AVX2 + FMA, no AVX-512) holds every library the
# step uses to AVX2: pe_fast's C++ kernels built for -march=x86-64-v3 (once, into build/isa-avx2/, again whenever
# kernels/, csrc/ or setup.py change) and loaded through PE_FAST_KERNELS; torch's own kernels through
# ATEN_CPU_CAPABILITY=avx2, oneDNN through ONEDNN_MAX_CPU_ISA=AVX2, MKL's GEMMs through MKL_ENABLE_INSTRUCTIONS=AVX2.
# It checks each before the command runs and prints one line saying what the command runs on. Instructions are all
# it changes: the cores' clock, caches and memory stay this machine's, so absolute times are not an AVX2 machine's
# (an AVX2-only EPYC measured about 3x slower than an AVX-512 Xeon, docs/results.md); ratios within one run are
# the point.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
usage="usage: bash bench/cpu/isa.sh avx2|native COMMAND [ARGS...]"
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi
if [ $# -lt 2 ]; then
    echo "error: $usage" >&2
    exit 2
fi
isa=$1
shift
case "$isa" in
    native)
        unset PE_FAST_KERNELS ATEN_CPU_CAPABILITY ONEDNN_MAX_CPU_ISA MKL_ENABLE_INSTRUCTIONS ;;
    avx2)
        build="$root/build/isa-avx2"
        stamp="$(cat "$root"/kernels/*.h "$root"/csrc/*.cpp "$root/setup.py" | sha256sum | cut -d' ' -f1)"
        if [ ! -f "$build/stamp" ] || [ "$(cat "$build/stamp")" != "$stamp" ]; then
            echo "bench/cpu/isa.sh: building the C++ kernels for x86-64-v3 (AVX2) into $build" >&2
            rm -rf "$build" && mkdir -p "$build"
            (cd "$root" && PE_FAST_MARCH=x86-64-v3 python setup.py -q build_ext --build-lib "$build/lib" \
                --build-temp "$build/tmp" >"$build/build.log" 2>&1) || { echo "error: the build failed: $build/build.log" >&2; exit 1; }
            echo "$stamp" >"$build/stamp"
        fi
        PE_FAST_KERNELS="$(ls "$build"/lib/pe_fast/_C*.so)"
        export PE_FAST_KERNELS ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ;;
    *)
        echo "error: unknown instruction set '$isa'; $usage" >&2
        exit 2 ;;
esac
python - "$isa" >&2 <<'EOF'
import os, re, subprocess, sys
import torch
from pe_fast.ops import extension
wanted = sys.argv[1]
torch_isa, kernels = torch.backends.cpu.get_cpu_capability().lower(), extension.ISA
# MKL names the code path it took in its verbose banner ("... Intel(R) AVX2 enabled processors"; on AMD CPUs a
# generic "Intel(R) Architecture processors" whatever the setting)
banner = subprocess.run([sys.executable, "-c", "import torch; torch.ones(8, 8) @ torch.ones(8, 8)"], text=True,
                        capture_output=True, env={**os.environ, "MKL_VERBOSE": "1"}).stdout
mkl = re.search(r"architecture (.*?processors)", banner)
line = (f"bench/cpu/isa.sh {wanted}: torch's kernels {torch_isa}, pe_fast's C++ kernels {kernels}, MKL "
        f"{mkl.group(1) if mkl else 'path unknown'}")
if wanted != "native" and (torch_isa, kernels) != (wanted, wanted):
    sys.exit(f"error: {line}, not {wanted}")
print(line)
EOF
exec "$@"
