"""A model moved with .to() must not leave any tensor behind, checked on the CPU as a dtype move.

On CUDA, `python -m pe_fast.sweep --preset paper` crashed because the `random` PE kept its tables in a plain
Python list that `.to()` never saw. A CPU-only suite cannot see a device mismatch, so the project's rule is to
test a device move as a dtype move: after `.to(torch.float64)` every floating-point tensor that reaches an op in
a training step (forward, loss and backward, the fused attention op's kernels included) must be float64. A
float32 tensor there is one that a `.to("cuda")` would have left on the CPU. In float64 a mix does not even
crash (type promotion hides it), so the test records the dtype of every op argument with a dispatch mode.
"""
from __future__ import annotations

import functools
import traceback
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import keystr, tree_flatten, tree_flatten_with_path, tree_map
from torch.utils.weak import WeakTensorKeyDictionary

from pe_fast.results.settings import Settings
from pe_fast.sweep import grid, settings
from pe_fast.tasks.masked_regions import REGION_PES
from pe_fast.sweep.task_loading import load_task as load_sweep_task
from pe_fast.data import DataError
from pe_fast.models import PE_KINDS
from pe_fast.train import PackTrainer

MOVED_DTYPE = torch.float64
TORCH_DIR = str(Path(torch.__file__).parent)

# The fused op's attention statistics are float32 whatever the inputs' dtype (pe_attention's docstring and its
# fake kernel): a deliberate downcast, computed on the op's device, not a tensor that .to() missed. These ops'
# outputs at these positions are statistics; so is anything computed from statistics alone.
STATISTICS_OUTPUTS = {"pe_fast::pe_attention": 1, "pe_fast_cpp::attention_forward": 1}


def _floating_tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _caller() -> str:
    """The innermost frame outside torch (pe_fast's or the test's code), to say where a tensor was used."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not frame.filename.startswith(TORCH_DIR):
            return f"{Path(frame.filename).name}:{frame.lineno} ({frame.name})"
    return "?"


class DtypeRecorder(TorchDispatchMode):
    """Records every op that runs, with the dtypes of its floating-point tensor arguments, and collects the
    arguments whose dtype is not `expected` (attention statistics excepted, see STATISTICS_OUTPUTS).

    Ops outside aten (the fused op pe_fast::pe_attention and its C++ kernels) are re-run with the mode active, so
    that the ops inside them are recorded as well: a float32 constant made inside a backend counts too."""

    def __init__(self, expected: torch.dtype = MOVED_DTYPE):
        super().__init__()
        self.expected = expected
        self.calls: list[tuple[str, list[torch.dtype]]] = []
        self.violations: list[str] = []
        self.statistics = WeakTensorKeyDictionary()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = str(func)
        self.calls.append((op, [t.dtype for t in _floating_tensors((args, kwargs))]))
        for path, value in tree_flatten_with_path((args, kwargs))[0]:
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != self.expected:
                if value in self.statistics:
                    continue
                where = ("args" + keystr(path[1:])) if path[0].idx == 0 else ("kwargs" + keystr(path[1:]))
                self.violations.append(f"{op} got {where} of dtype {value.dtype}, shape {list(value.shape)}, "
                                       f"at {_caller()}")
        if func.namespace in ("aten", "prims"):
            out = func(*args, **kwargs)
        else:
            # Below the Python key, with this mode pushed again: the op's own body dispatches through the mode.
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            keys = functools.reduce(lambda a, b: a | b, (torch._C._dispatch_keys(t) for t in tensors))
            below = keys & torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.Python)
            with self:
                out = func.redispatch(below, *args, **kwargs)
        self._track_statistics(func, args, kwargs, out)
        return out

    def _track_statistics(self, func, args, kwargs, out):
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        position = STATISTICS_OUTPUTS.get(func._schema.name)
        if position is not None:
            self.statistics[outputs[position]] = True
            return
        low = [t for t in _floating_tensors((args, kwargs)) if t.dtype != self.expected]
        if low and all(t in self.statistics for t in low):
            for t in _floating_tensors(outputs):
                self.statistics[t] = True

    def report(self) -> str:
        unique = list(dict.fromkeys(self.violations))
        return (f"{len(unique)} op argument(s) are not {self.expected} after .to({self.expected}) (a tensor the "
                f"move missed: on CUDA it would stay on the CPU):\n  " + "\n  ".join(unique[:20]))


def _to_moved_dtype(tree):
    return tree_map(lambda t: t.to(MOVED_DTYPE) if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
                    tree)


def recorded_training_step(trainer: PackTrainer) -> tuple[DtypeRecorder, Exception | None]:
    """One training step of the moved model (forward, the task's loss, backward) under the recorder. A crash is
    returned, not raised: the recorder's report usually says which tensor caused it."""
    inputs, targets = trainer.batches(trainer.sampler.next())
    inputs, targets, probes = _to_moved_dtype((inputs, targets, trainer.probes))
    recorder = DtypeRecorder()
    try:
        with recorder:
            outputs, _stats = trainer.model(inputs, probes, trainer.pe_dropout_masks(inputs))
            trainer.task.loss(outputs, targets).sum().backward()
    except Exception as error:  # noqa: BLE001  a mixed-dtype op may raise; the report explains it
        return recorder, error
    return recorder, None


# ---- the tasks, built as `python -m pe_fast.sweep` builds them, and tiny models ----

# netsim sized to build in well under a second; the network itself does not matter here.
SMALL_NETWORK = ["--nodes", "20", "--modules", "4", "--timepoints", "200"]
TINY_MODEL = ["--width", "16", "--depth", "2", "--heads", "2", "--mlp-width", "32", "--batch-size", "8",
              "--precision", "fp32", "--device", "cpu"]
SIGMAS = [0.5, 1.0]
SEEDS = [1, 2]


def task_settings(task: str, *extra: str) -> Settings:
    flags = ["--task", task, *TINY_MODEL, *(SMALL_NETWORK if task == "netsim" else []), *extra]
    return settings.from_flags(settings.build_parser().parse_args(flags))


@functools.cache
def _load_task(task: str):
    return load_sweep_task(task_settings(task))


def load_task(task: str):
    """Each task once per test session (the LST's generalisation set takes seconds); fmri is skipped where its
    data packages are missing."""
    try:
        return _load_task(task)
    except settings.UsageError as error:
        if isinstance(error.__context__, DataError):
            pytest.skip(f"{task} data is not available: {error}")
        raise


def tiny_trainer(task_name: str, kind: str, *flags: str) -> PackTrainer:
    s = task_settings(task_name, *flags)
    task = load_task(task_name)
    return PackTrainer(task, grid.model_config(s, task, kind), grid.train_config(s, [{}] * len(SEEDS)), SEEDS, SIGMAS,
                       torch.device("cpu"))


# Every PE kind each task accepts: sin2d and rope2d need a 2D grid, which the LST has and the region tasks lack
# (REGION_PES). The simulated network has no node coordinates, so "sinnd" raises ValueError there by design
# (test_netsim_rejects_sinnd keeps that exclusion honest).
PAIRS = ([("lst", kind) for kind in PE_KINDS]
         + [("netsim", kind) for kind in REGION_PES if kind != "sinnd"]
         + [("fmri", kind) for kind in REGION_PES])


# The sinusoidal PE again with the authors' dropout on x + PE (--pe-dropout), whose masks the trainer draws, and
# the learned PE with the same dropout (its gradient then flows through the masked sum)
PAIRS_WITH_FLAGS = ([(task, kind, ()) for task, kind in PAIRS]
                    + [("lst", "sin2d", ("--pe", "sin2d", "--pe-dropout", "0.1")),
                       ("lst", "learned", ("--pe", "learned", "--pe-dropout", "0.1", "--pe-dropout-on", "learned"))])


@pytest.mark.parametrize("task_name, kind, flags", PAIRS_WITH_FLAGS,
                         ids=[f"{t}-{k}" + ("-pe-dropout" if f else "") for t, k, f in PAIRS_WITH_FLAGS])
def test_model_moved_to_float64_trains_in_float64(task_name, kind, flags):
    trainer = tiny_trainer(task_name, kind, *flags)
    trainer.model.to(MOVED_DTYPE)
    recorder, error = recorded_training_step(trainer)
    if error is not None:
        raise AssertionError(f"the training step crashed after .to({MOVED_DTYPE}); {recorder.report()}") from error
    assert recorder.calls, "the recorder saw no op: the dispatch mode is not in effect"
    assert not recorder.violations, recorder.report()
    for name, parameter in trainer.model.named_parameters():
        assert parameter.grad is not None, f"{name} got no gradient"
        assert parameter.grad.dtype == MOVED_DTYPE, f"{name}.grad is {parameter.grad.dtype}"
        assert torch.isfinite(parameter.grad).all(), f"{name}.grad is not finite"


def test_netsim_rejects_sinnd():
    # Why PAIRS leaves (netsim, sinnd) out; if the network gains coordinates, the pair belongs in PAIRS.
    with pytest.raises(ValueError, match="coordinates"):
        tiny_trainer("netsim", "sinnd")


# ---- the checker can fail ----

class ScaleByListedTensor(nn.Module):
    """A module with the old bug's shape: a tensor held in a plain Python list, which .to() does not see."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3))
        self.listed = [torch.full((3,), 2.0)]

    def forward(self, x):
        return x * self.weight * self.listed[0]


def test_recorder_reports_a_tensor_kept_in_a_plain_list():
    module = ScaleByListedTensor().to(MOVED_DTYPE)
    recorder = DtypeRecorder()
    with recorder:
        # Type promotion makes the result float64: without the recorder nothing would look wrong.
        module(torch.ones(3, dtype=MOVED_DTYPE)).sum().backward()
    assert any("float32" in line and "aten.mul" in line for line in recorder.violations), recorder.calls
    assert "float32" in recorder.report()


def test_recorder_reports_the_old_random_pe_bug(monkeypatch):
    # The random PE as it was before the fix: its tables also in a plain list, which at_block read.
    trainer = tiny_trainer("netsim", "random")
    pe = trainer.model.absolute
    pe.tables = [getattr(pe, f"table{block}") for block in range(pe.num_blocks)]
    monkeypatch.setattr(pe, "at_block", lambda block: pe.tables[block] if block < pe.num_blocks else None)
    trainer.model.to(MOVED_DTYPE)
    recorder, error = recorded_training_step(trainer)
    # pe_attention refuses a PE of another dtype than its weights before any op runs (one TypeError naming pe);
    # where a PE reaches an op by another path, the recorder names the table
    refused = isinstance(error, TypeError) and "pe is torch.float32 but w_qkv is torch.float64" in str(error)
    table_shape = [trainer.M, trainer.model_config.num_tokens, trainer.model_config.width]
    assert refused or any("torch.float32" in line and str(table_shape) in line for line in recorder.violations), \
        (error, recorder.report())
