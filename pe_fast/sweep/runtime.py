"""What the machine offers, probed: CUDA, the packages and tools the executors and --tensorboard need (Ray,
submitit, sbatch, TensorBoard), a Ray cluster's address. The one module of the sweep's settings with side effects
(a socket, a PATH search, package look-ups); validation.validate calls resolve() once, after the rules that need
none of them."""
from __future__ import annotations

import importlib.util
import os
import re
import socket
import tempfile
from pathlib import Path

import torch

from pe_fast import precision
from pe_fast.models.transformer import compute_path_problem
from pe_fast.ops import backends, extension
from pe_fast.results import run_folder
from pe_fast.results.settings import MAX_THREADS
from pe_fast.sweep import UsageError
from pe_fast.sweep.executors import EXECUTORS
from pe_fast.train import compile_problem

RAY_CONNECT_TIMEOUT_S = 10
# A gRPC server (Ray's GCS, a Ray Client server) answers HTTP/2's client preface with a SETTINGS frame (type 4, the
# fourth byte of its header); a TCP service of another kind stays silent or answers otherwise
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def check_ray_address(address: str | None, name: str = "--ray-address"):
    """An address where no Ray cluster answers is one line within seconds, before the folder is written: ray.init
    would retry a silent port for ever. auto is resolved as ray.init resolves it (RAY_ADDRESS, then the cluster
    started on this machine). name: where the address came from, as the message names it."""
    if address is None or address == "local":
        return
    if not address.strip():  # ray.init would fail on it after the folder was written
        raise UsageError(f"{name} {address!r} names no cluster: give auto or HOST:PORT, or leave it out for a "
                         f"local Ray instance")
    found_by_auto = address == "auto"
    if found_by_auto:
        variable = os.environ.get("RAY_ADDRESS")
        address = running_ray_cluster()  # $RAY_ADDRESS first, as ray.init reads it
        if address is None:
            return
        if variable and variable.strip() != "auto":  # the culprit of a refusal is the variable, as its user wrote it
            name = f"--ray-address auto, from $RAY_ADDRESS {variable!r},"
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"{name} {address!r}: expected auto or HOST:PORT")
    advice = "start one with ray start --head, or use --ray-address auto"
    try:
        with socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT_S) as connection:
            connection.sendall(HTTP2_PREFACE)
            reply = connection.recv(9)
    except socket.timeout:
        raise UsageError(f"{name} {address}: the service there does not answer as a Ray cluster within "
                         f"{RAY_CONNECT_TIMEOUT_S} s; {advice}")
    except OSError as error:
        raise UsageError(f"{name} {address}: no Ray cluster answers there ({error.strerror or error}); {advice}")
    if len(reply) < 4 or reply[3] != 4:
        raise UsageError(f"{name} {address}: the service there is not a Ray cluster; {advice}")
    check_ray_protocol(address, name, advice, found_by_auto)


def ray_token(found_by_auto: bool) -> tuple[tuple[str, str], ...]:
    """The token ray.init would send a cluster with token authentication (Ray 2.5x's default for ray start): with
    $RAY_AUTH_MODE=token, or, for an address found by auto with $RAY_AUTH_MODE unset, wherever one is saved."""
    try:
        from ray._raylet import AuthenticationTokenLoader
    except ImportError:  # a Ray without token authentication
        return ()
    loader = AuthenticationTokenLoader.instance()
    unset = os.environ.get("RAY_AUTH_MODE") is None
    if not loader.has_token(ignore_auth_mode=found_by_auto and unset):
        return ()
    return tuple(loader.get_token_for_http_header().items())


def check_ray_protocol(address: str, name: str, advice: str, found_by_auto: bool):
    """Any gRPC or HTTP/2 server answers the preface: one call of Ray's own protocol tells Ray's from another's (the
    cluster's id from its GCS; a ping of the Ray Client server behind ray://). Without Ray, nothing: --executor ray
    refuses that next."""
    try:
        import grpc
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc, ray_client_pb2, ray_client_pb2_grpc
    except ImportError:
        return
    token = ray_token(found_by_auto)
    with grpc.insecure_channel(address.removeprefix("ray://")) as channel:
        try:
            if address.startswith("ray://"):
                ray_client_pb2_grpc.RayletDriverStub(channel).ClusterInfo(
                    ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING),
                    timeout=RAY_CONNECT_TIMEOUT_S, metadata=token)
            else:
                gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                    gcs_service_pb2.GetClusterIdRequest(), timeout=RAY_CONNECT_TIMEOUT_S, metadata=token)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise UsageError(f"{name} {address}: the service there does not answer as a Ray cluster within "
                                 f"{RAY_CONNECT_TIMEOUT_S} s; {advice}") from None
            if error.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise UsageError(f"{name} {address}: the Ray cluster there wants a token this machine does not send; "
                                 f"set RAY_AUTH_MODE=token and the cluster's token in $RAY_AUTH_TOKEN or "
                                 f"~/.ray/auth_token, as ray.init needs them") from None
            raise UsageError(f"{name} {address}: the service there is not a Ray cluster ({error.code().name}); "
                             f"{advice}") from None


def check_kernels():
    """$PE_FAST_KERNELS names the build of the C++ kernels to load in place of the installed one (bench/cpu/isa.sh):
    where it did not load, import pe_fast warns and runs the reference (a library import must not fail), but a
    sweep would time or train something other than what was asked. One line naming the variable and why."""
    if extension.REQUESTED is not None and extension.MODULE is None:
        why = " ".join(str(extension.ERROR).split()) or type(extension.ERROR).__name__
        raise UsageError(f"$PE_FAST_KERNELS {extension.REQUESTED!r}: its kernels did not load ({why}); unset it, or "
                         f"name a build of bench/cpu/isa.sh")


def check_inductor_cache(out: str | None = None):
    """torch makes $TORCHINDUCTOR_CACHE_DIR, where it is set, when it first loads its compiler: torch.optim does
    as a pack's optimizer is built, whether or not --compile compiles the step, and a compiled step writes its
    kernels there. A folder that exists and is writable, or can be made, is checked before the results folder is
    written (else the first pack failed after it, blaming the results folder). The probe is a real one, made and
    removed: permission bits do not bind root, and /proc takes no folder. Not inside a results folder: another
    one, or out (this sweep's --out, made later)."""
    path = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if path is None:
        return
    name = f"$TORCHINDUCTOR_CACHE_DIR {path!r}"
    advice = "torch keeps its compiler's caches there: name a writable folder, or unset it"
    if not path.strip():  # torch would write its caches into the working folder
        raise UsageError(f"{name} names no folder; {advice}")
    if (problem := run_folder.shell_text_problem(path)) is not None:
        raise UsageError(f"$TORCHINDUCTOR_CACHE_DIR {problem}")
    # inductor's C++ compile command is split as a shell would (shlex): at whitespace, and quotes and backslashes
    # are taken away
    # a relative path too: torch compiles under its absolute one (a folder "a b" above it split the command)
    if any(character.isspace() or character in "'\"\\" for character in os.path.abspath(path)):
        raise UsageError(f"{name} holds a space, a line break, a quote or a backslash, which torch's C++ compiler "
                         f"command splits or drops; {advice}")
    folder = Path(path).absolute()
    existing = folder
    try:
        existing = next(p for p in (folder, *folder.parents) if p.exists() or p.is_symlink())
        if not existing.exists():  # torch would fail to make the folder a link leads nowhere from (or in a loop)
            raise UsageError(f"{name}: {existing} is a link that leads to no folder; {advice}")
        if not existing.is_dir():
            raise UsageError(f"{name}: {existing} is a file, not a folder; {advice}")
        run_folder.check_outside_package(folder)  # torch's cache files would mix with pe_fast's code
        home = next((p for p in (folder, *folder.parents) if run_folder.is_results_folder(p)), None)
        if home is None and out is not None and folder.resolve().is_relative_to(Path(out).absolute().resolve()):
            home = Path(out)  # this sweep's, not made yet
        if home is not None:  # its files would be read as part of that folder's, as an --out there would be
            raise UsageError(f"{name}: inside the results folder {home}; {advice} outside it")
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except run_folder.OutFolderError as error:
        raise UsageError(f"{name}: {error}") from None
    except OSError as error:
        raise UsageError(f"{name}: cannot write in {existing} ({error.strerror or error}); {advice}") from None


def running_ray_cluster() -> str | None:
    """The address --ray-address auto means here, or None where this Ray cannot say (ray.init will look itself)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:  # no Ray (refused below), or a Ray that keeps this elsewhere
        return None
    try:
        return canonicalize_bootstrap_address("auto")
    except ConnectionError:
        raise UsageError("--ray-address auto: no Ray cluster is running on this machine; start one with "
                         "ray start --head, or name one with --ray-address HOST:PORT") from None
    except ValueError as error:  # auto reads $RAY_ADDRESS first, which may hold anything
        raise UsageError(f"--ray-address auto: $RAY_ADDRESS {os.environ.get('RAY_ADDRESS')!r} is not an address "
                         f"({error})") from None


def resolve(s: dict):
    """The settings that depend on the machine (the device, compilation, the precision) resolved, and every
    setting checked against what the machine offers: CUDA, the packages and tools an executor needs, a Ray
    cluster's address. validate() calls it once, after every rule that needs no probing."""
    if s["device"] == "auto":
        s["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    executor = EXECUTORS[s["executor"]]
    # ray.init joins $RAY_ADDRESS where --ray-address is left out
    ray_address, ray_source = ((s["ray_address"], "--ray-address") if s["ray_address"] is not None else
                               (os.environ.get("RAY_ADDRESS") or None, "$RAY_ADDRESS"))
    # a cluster may have the GPUs and cores this machine lacks; a local Ray or submitit's local executor has not
    here = not executor.runs_elsewhere(s, ray_address)
    if s["device"] == "cuda" and not torch.cuda.is_available() and here:
        raise UsageError(f"--device {s['device']!r} is not available here (cpu)")
    cores = len(os.sched_getaffinity(0))
    if here and s["threads"] is not None and s["threads"] > cores:
        raise UsageError(f"--threads {s['threads']}: this machine has {cores} cores")
    if s["compile"] == "auto":  # measured: bench/results/h100-20261126-sweep (1.1-1.3× on an H100)
        s["compile"] = "on" if s["device"] == "cuda" else "off"
    if (why := compile_problem(s["compile"], torch.device(s["device"]))) is not None:
        raise UsageError(f"--compile {s['compile']}: {why}")
    check_inductor_cache(s.get("out"))
    # OpenMP takes a list, one count per nesting level; MKL one count
    for variable, parts in (("OMP_NUM_THREADS", None), ("MKL_NUM_THREADS", 1)):
        threads = os.environ.get(variable)
        # ASCII blanks only (C's isspace): \s also passed a no-break space, which libgomp refused and ignored
        if threads is not None and not (
                all(re.fullmatch(r"[ \t\n\r\f\v]*\+?[0-9]+[ \t\n\r\f\v]*", part, re.ASCII)
                    and 0 < int(part) <= MAX_THREADS for part in threads.split(","))
                and (parts is None or len(threads.split(",")) == parts)):
            # OpenMP warns on stderr and takes its default, MKL says nothing: the sweep would run on another count
            # than the one set (str.isdigit() also passed '²', which int() then refused with a traceback)
            listed = " (or a list of them, one per nesting level)" if parts is None else ""
            raise UsageError(f"${variable} {threads!r}: set it to a number of threads from 1 to {MAX_THREADS:,}"
                             f"{listed}, or unset it; --threads sets the sweep's")
    check_kernels()
    try:
        backends.tf32_dots()
    except ValueError as error:
        raise UsageError(str(error)) from None
    if s["device"] == "cpu" and s.get("backend") is None and backends.resolve_backend(
            None, torch.device("cpu")) == "triton":  # the interpreter registered Triton for CPU tensors, first
        raise UsageError("$TRITON_INTERPRET runs the Triton kernels in Triton's interpreter, on the CPU hundreds of "
                         "times slower than pe_fast's C++ kernels: unset it, or ask for it with --backend triton")
    if s.get("backend") is not None and (why := compute_path_problem(s["backend"], s["device"])) is not None:
        raise UsageError(f"--backend {s['backend']}: {why} (--device {s['device']}); leave it out for the device's "
                         f"fastest")
    if s.get("precision") is None:
        s["precision"] = precision.default(torch.device(s["device"]))
    if (why := precision.problem(s["precision"], torch.device(s["device"]))) is not None:
        raise UsageError(f"--precision {s['precision']}: {why}")
    if s["executor"] == "ray":
        check_ray_address(ray_address, ray_source)
    executor.check_machine(s)
    if s.get("tensorboard") and importlib.util.find_spec("tensorboard") is None:
        raise UsageError("--tensorboard needs TensorBoard, which is not installed: pip install 'pe_fast[tensorboard]' "
                         "(or pip install tensorboard)")
