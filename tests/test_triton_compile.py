"""Every kernel configuration the Triton launchers can pick compiles ahead of time, without a GPU, for A100
(sm_80) and H100 (sm_90): triton.compile(ASTSource) → PTX → cubin (ptxas ships with triton's wheel), within the
card's shared memory. So a kernel the GPU compiler rejects (tl.dot shapes, layouts, shared memory) fails here.

Compiling is ~1–6 s per kernel, so the jobs run in a process pool; triton's cache makes reruns fast.
PE_FAST_AOT_RECORD=path writes the shared-memory table as JSON (bench/results/triton_aot_shared_memory.json).
"""
import concurrent.futures
import importlib
import json
import multiprocessing
import os
import re
import subprocess
import tempfile
from typing import NamedTuple

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from pe_fast.ops import triton_attention as ta  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                reason="TRITON_INTERPRET=1: this process's kernels are interpreted, not compiled")
SHARED_MEMORY_LIMIT = {80: 163 * 1024, 90: 227 * 1024}  # bytes per block, opt-in maximum: A100, H100
TRITON_DTYPE = {torch.float32: "fp32", torch.bfloat16: "bf16"}


class Job(NamedTuple):
    kernel: str  # packed_fwd, packed_bwd, long_fwd, long_bwd, bwd_preprocess
    dtype: torch.dtype
    precision: str | None
    width: int  # packed: the head-dim chunk; long: the padded head dim
    blocks: tuple[int, ...]
    num_warps: int
    num_stages: int
    # HAS_ADDEND: the packed kernels add pe·W + b to q, k, v as they load them; its pointer type, None without.
    # bf16 kernels take a float32 addend under autocast (projection.py), a bf16 one from all-bf16 calls.
    addend: str | None = None
    probes: str = "fp32"  # the probes' pointer type (triton_attention.kernel_probes)


def jobs() -> list[Job]:
    """Every distinct kernel compilation the launchers can ask for."""
    found = []
    for c in ta.all_kernel_configs():
        for precision in ("ieee", "tf32") if c.dtype == torch.float32 else ("ieee",):
            if c.packed:  # with and without the addend added on load (projection.kernel_operands)
                for addend in (None, "fp32", TRITON_DTYPE[c.dtype]):
                    found.append(Job("packed_fwd", c.dtype, precision, c.chunk, (c.fwd_block_m,), c.fwd_warps,
                                     c.fwd_stages, addend))
                    found.append(Job("packed_bwd", c.dtype, precision, c.chunk, (c.bwd_block,), c.bwd_warps,
                                     c.bwd_stages, addend))
            else:
                found.append(Job("long_fwd", c.dtype, precision, c.head_pad, (c.fwd_block_m, c.fwd_block_n),
                                 c.fwd_warps, c.fwd_stages))
                found.append(Job("long_bwd", c.dtype, precision, c.head_pad, (c.bwd_block,), c.bwd_warps,
                                 c.bwd_stages))
            # narrower probes (bool/uint8, bf16/fp16) take no more shared memory than float32 ones; that they
            # compile at all is checked on the largest tiles
            if c.head_pad == ta.MAX_HEAD_DIM and precision == "ieee":
                fwd = found[-2]
                found += [fwd._replace(probes=probes) for probes in ("u8", "bf16")]
        if c.pre_block:
            found.append(Job("bwd_preprocess", c.dtype, None, c.head_pad, (c.pre_block,), 4, 1))
    return list(dict.fromkeys(found))


def source(job: Job) -> ASTSource:
    """The kernel with the launcher's argument types; shapes chosen so every mask stays (a partial last chunk,
    a head dim below its padding)."""
    t = "*" + TRITON_DTYPE[job.dtype]
    added = t if job.addend is None else "*" + job.addend  # without an addend the launcher passes qkv
    packed = job.kernel.startswith("packed")
    heads = 2
    head_dim = job.width * 2 + job.width // 2 if packed else max(1, job.width * 3 // 4)
    const = dict(N=16 if packed else 360, H=heads, D=heads * head_dim)
    const.update(CHUNK=job.width) if packed else const.update(HEAD_PAD=job.width)
    if job.kernel == "packed_fwd":
        fn = ta._packed_fwd_kernel
        args = {"qkv_ptr": t, "add_ptr": added, "probe_ptr": "*" + job.probes, "out_ptr": t, "lse_ptr": "*fp32",
                "stat_ptr": "*fp32", "num_problems": "i32", "B": "i32", "qk_scale": "fp32"}
        const.update(NUM_PROBES=2, BLOCK=job.blocks[0], PRECISION=job.precision, HAS_ADDEND=job.addend is not None)
    elif job.kernel == "packed_bwd":
        fn = ta._packed_bwd_kernel
        args = {"qkv_ptr": t, "add_ptr": added, "do_ptr": t, "lse_ptr": "*fp32", "dqkv_ptr": t,
                "num_problems": "i32", "B": "i32", "sm_scale": "fp32"}
        const.update(BLOCK=job.blocks[0], PRECISION=job.precision, HAS_ADDEND=job.addend is not None)
    elif job.kernel == "long_fwd":
        fn = ta._long_fwd_kernel
        args = {"qkv_ptr": t, "probe_ptr": "*" + job.probes, "out_ptr": t, "lse_ptr": "*fp32", "stat_ptr": "*fp32",
                "B": "i32", "qk_scale": "fp32"}
        const.update(NUM_PROBES=2, PROBE_PAD=2, BLOCK_M=job.blocks[0], BLOCK_N=job.blocks[1],
                     PRECISION=job.precision)
    elif job.kernel == "long_bwd":
        fn = ta._long_bwd_kernel
        args = {"qkv_ptr": t, "do_ptr": t, "lse_ptr": "*fp32", "delta_ptr": "*fp32", "dqkv_ptr": t,
                "sm_scale": "fp32"}
        const.update(BLOCK=job.blocks[0], PRECISION=job.precision)
    else:
        fn = ta._pe_attention_bwd_preprocess_kernel
        args = {"out_ptr": t, "do_ptr": t, "delta_ptr": "*fp32", "num_rows": "i32"}
        const.update(BLOCK_R=job.blocks[0])
    signature = {name: args.get(name, "constexpr") for name in fn.arg_names}
    # torch allocations are 16-byte aligned; the JIT specialises on that too
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name, ty in args.items() if ty[0] == "*"}
    return ASTSource(fn=fn, signature=signature, constexprs=const, attrs=attrs)


def register_use(ptx: str, cc: int) -> dict:
    """ptxas -v's account of one kernel: registers per thread and bytes spilled to local memory (the H100's
    TF32 kernels at d 160 once spilled ~5 KB per thread: 5× slower than in IEEE fp32)."""
    ptxas = get_ptxas(cc)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        info = subprocess.run([getattr(ptxas, "path", ptxas), "-v", f"--gpu-name=sm_{cc}{'a' if cc == 90 else ''}",
                               f.name, "-o", os.devnull], capture_output=True, text=True, check=True).stderr
    return {"registers": int(re.search(r"Used (\d+) registers", info)[1]),
            "spill_bytes": int(re.search(r"(\d+) bytes spill stores", info)[1])}


def compile_job(job: Job) -> dict:
    result = {}
    for cc in SHARED_MEMORY_LIMIT:
        compiled = triton.compile(source(job), target=GPUTarget("cuda", cc, 32),
                                  options={"num_warps": job.num_warps, "num_stages": job.num_stages})
        result[cc] = {"cubin_bytes": len(compiled.asm.get("cubin", b"")), "shared": compiled.metadata.shared,
                      **register_use(compiled.asm["ptx"], cc)}
    return result


def job_id(job: Job) -> str:
    blocks = "x".join(map(str, job.blocks))
    precision = f"-{job.precision}" if job.precision else ""
    width = f"chunk{job.width}" if job.kernel.startswith("packed") else f"hd{job.width}"
    addend = f"-addend-{job.addend}" if job.addend else ""
    probes = "" if job.probes == "fp32" else f"-probes-{job.probes}"
    return f"{job.kernel}-{TRITON_DTYPE[job.dtype]}{precision}-{width}-{blocks}{addend}{probes}"


JOBS = jobs()


@pytest.fixture(scope="module")
def compiled():
    # spawn, not fork: the parent may hold MLIR/OpenMP threads from other tests
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(os.cpu_count() or 1, mp_context=context) as pool:
        results = dict(zip(JOBS, pool.map(compile_job, JOBS)))
    record = os.environ.get("PE_FAST_AOT_RECORD")
    if record:
        rows = [dict(job._asdict(), dtype=TRITON_DTYPE[job.dtype],
                     shared_bytes={f"sm_{cc}": r["shared"] for cc, r in result.items()},
                     registers={f"sm_{cc}": r["registers"] for cc, r in result.items()},
                     spill_bytes={f"sm_{cc}": r["spill_bytes"] for cc, r in result.items()})
                for job, result in results.items()]
        with open(record, "w") as f:
            json.dump({"triton": triton.__version__, "limits_bytes": {f"sm_{cc}": v for cc, v in
                                                                       SHARED_MEMORY_LIMIT.items()},
                       "kernels": rows}, f, indent=1)
    return results


@pytest.mark.parametrize("job", JOBS, ids=job_id)
def test_kernel_compiles_to_cubin_within_shared_memory(compiled, job):
    for cc, result in compiled[job].items():
        assert result["cubin_bytes"] > 0, f"sm_{cc}: no cubin"
        assert result["shared"] <= SHARED_MEMORY_LIMIT[cc], f"sm_{cc}: {result['shared']} bytes of shared memory"


@pytest.mark.parametrize("job", [j for j in JOBS if j.kernel.startswith("packed")], ids=job_id)
def test_packed_kernels_keep_their_tiles_in_registers(compiled, job):
    """The packed kernels (N ≤ 32: the paper's LST sweep) stream the head dim in chunks so that their tiles fit
    the registers: a spill to local memory costs more than the attention's whole q, k, v traffic."""
    spilled = compiled[job][90]["spill_bytes"]
    assert spilled <= 64, f"sm_90: {spilled} bytes spilled per thread"


def test_kernel_config_picks_from_the_listed_configs():
    listed = set(ta.all_kernel_configs())
    for N in (1, 16, 17, 32, 33, 100, 360, 1000):
        for head_dim in (1, 8, 16, 24, 40, 64, 100, 128, 160, 256):
            for dtype in (torch.float32, torch.bfloat16):
                cfg = ta.kernel_config(N, head_dim, dtype)
                assert cfg in listed
                assert cfg.head_pad >= max(16, head_dim)
                assert cfg.packed == (N <= ta.PACK_MAX_N) == (cfg.pre_block == 0)
                if cfg.packed:  # the keys are the query tile, which holds whole problems
                    assert cfg.fwd_block_m == cfg.fwd_block_n >= N and cfg.bwd_block >= N
                    assert 16 <= cfg.chunk <= cfg.head_pad


def test_tuning_candidates_are_configurations_the_launchers_take(monkeypatch):
    """bench/op/tune_triton.py (run on a GPU by bench/gpu/gpu_check.sh) varies only tiles, warps, stages and the
    packed kernels' head-dim chunk, keeps packed tiles whole-problem and square, and gives `kernel_config` back
    afterwards; without a GPU it exits 2."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.syspath_prepend(os.path.join(root, "bench"))  # as the script puts it: its kinds are packages
    tune = importlib.import_module("op.tune_triton")
    for name, (M, B, N, D, H, K) in tune.SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            default = ta.kernel_config(N, D // H, dtype)
            candidates = [c for c in tune.forward_candidates(default) + tune.backward_candidates(default)
                          if tune.valid(c, N)]
            assert len(candidates) > 8
            for c in candidates:
                assert (c.dtype, c.head_pad, c.packed, c.pre_block) == (
                    default.dtype, default.head_pad, default.packed, default.pre_block)
                if c.packed:
                    assert c.fwd_block_m == c.fwd_block_n >= N and c.bwd_block >= N and c.chunk >= 16
                else:
                    assert c.chunk == default.chunk
            with tune.configured(candidates[-1]):
                assert ta.kernel_config(N, D // H, dtype) == candidates[-1]
            assert ta.kernel_config(N, D // H, dtype) == default
    if not torch.cuda.is_available():
        assert tune.main(["--out", os.devnull]) == 2
