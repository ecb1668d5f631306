"""Packaging metadata lives in pyproject.toml; this file adds the optional C++ CPU kernels, pe_fast._C.

    pip install torch==2.13.0 "setuptools>=70.1" ninja && pip install --no-build-isolation -e .

builds kernels/ + csrc/ with torch.utils.cpp_extension (ninja when installed), optimised for the building machine
(-O3 -march=native; PE_FAST_MARCH=x86-64-v3 targets AVX2 machines instead, as bench/cpu/isa.sh does to measure one). torch must be importable at build time, hence --no-build-isolation: an isolated build
environment would have no torch (and must not pull an unpinned, multi-GB one). Without torch at build time,
without a working C++ compiler, or if the build fails for any other reason, pe_fast installs as pure Python and
runs the reference backend on CPU; `import pe_fast` then warns once and says how to get the fast path.
"""
import os
from pathlib import Path

from setuptools import setup

try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError:  # no torch in the build environment: pure-Python install
    print("pe_fast: torch is not importable at build time; skipping the C++ CPU kernels "
          "(install torch first, then pip install --no-build-isolation)")
    setup()
else:
    class OptionalBuildExtension(BuildExtension):
        """A failed build (no compiler, a broken one, ...) leaves a working pure-Python install instead of a failed
        install: any exception means "no fast path", which pe_fast reports at import."""

        def run(self):
            try:
                super().run()
            except Exception as error:  # noqa: BLE001
                print(f"pe_fast: building the C++ CPU kernels failed ({error}); installing without them")

    def zen4() -> bool:
        """An AMD Zen 4 (family 25 with AVX-512): it runs 512-bit instructions as two 256-bit halves, and there the
        kernels' AVX2 blocking measured 1.07-1.10x faster for a training step (docs/kernels.md)."""
        try:
            info = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
        except OSError:
            return False
        fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        fields = {key.strip(): value.strip() for key, value in fields.items()}
        return (fields.get("vendor_id") == "AuthenticAMD" and fields.get("cpu family") == "25"
                and "avx512f" in fields.get("flags", "").split())

    # the target: this machine (without AVX-512 on a Zen 4), or PE_FAST_MARCH's gcc -march (x86-64-v3: AVX2 + FMA)
    march = [f"-march={os.environ['PE_FAST_MARCH']}"] if os.environ.get("PE_FAST_MARCH") else \
        ["-march=native", *(["-mno-avx512f"] if zen4() else [])]
    setup(
        ext_modules=[CppExtension(
            "pe_fast._C", ["csrc/pe_attention_cpu.cpp", "csrc/sublayer_cpu.cpp"], include_dirs=[str(Path(__file__).resolve().parent / "kernels")],
            # -fopenmp: at::parallel_for and the kernels' `omp simd` loops (torch ships the OpenMP runtime);
            # -fno-trapping-math: lets fast_exp vectorise (kernels/pe_attention.h); -mprefer-vector-width=512: on a
            # machine with AVX-512, its 64-byte vectors (gcc's default stays at 32 bytes)
            extra_compile_args=["-O3", *march, "-mprefer-vector-width=512", "-fopenmp", "-fno-trapping-math"],
            extra_link_args=["-fopenmp"])],
        cmdclass={"build_ext": OptionalBuildExtension},
    )
