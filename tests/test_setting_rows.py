"""One row per flag: each field of Settings carries its flag's rules (results.settings.Flag), and the parser,
validation, --resume and pooling follow the rows. Each rule a row declares is checked here through the command
that must enforce it, row by row, so that a new row's rules hold without a line elsewhere."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from pe_fast.results.reading import ReportError, check_alike
from pe_fast.results import summary
from pe_fast.results.settings import FLAGS, GRID_AXES, LIST_SETTINGS, RUNTIME_FLAGS, value_type
from pe_fast.sweep import UsageError, api, grid, resume, validation
from pe_fast.sweep.settings import build_parser, from_flags, parse_list
from pe_fast.tasks import KINDS
from sweep_harness import narrowed, refuse_sweep

# A grid of one netsim model, small enough to validate in milliseconds
BASE = ["--task", "netsim", "--pe", "learned", "--sigmas", "0.1", "--seeds", "1", "--steps", "2"]


def flag_of(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def outside(low, high, ends, kind: type) -> list:
    """Values just outside a row's range, on each bounded side."""
    step = 1 if kind is int else 0.5
    values = [low - step if ends[0] == "[" else low]
    if high is not None:
        values.append(high + step if ends[1] == "]" else high)
    return values


RANGED = [(name, value) for name, flag in FLAGS.items() if flag.range
          for value in outside(*flag.range, value_type(name))]


@pytest.mark.parametrize("name,value", RANGED, ids=[f"{n}={v}" for n, v in RANGED])
def test_a_value_outside_a_rows_range_is_refused_naming_its_flag(name, value):
    done = refuse_sweep(*BASE, f"{flag_of(name)}={value}", "--out", "unused")
    assert done.returncode == 2, done.stderr
    assert flag_of(name) in done.stderr and "Traceback" not in done.stderr


CHOOSING = [name for name, flag in FLAGS.items() if flag.choices is not None and name != "task"]


@pytest.mark.parametrize("name", CHOOSING)
def test_a_value_outside_a_rows_choices_is_refused_naming_its_flag(name):
    done = refuse_sweep(*BASE, f"{flag_of(name)}=no-such-value", "--out", "unused")
    assert done.returncode == 2, done.stderr
    assert flag_of(name) in done.stderr and "no-such-value" in done.stderr


EXECUTOR_VALUES = {str: "x", int: "3", bool: None}


@pytest.mark.parametrize("name", [name for name, flag in FLAGS.items() if flag.executor])
def test_an_executors_flag_with_another_executor_is_refused(name):
    value = EXECUTOR_VALUES[value_type(name)]
    if name == "slurm_option":
        value = "qos=short"
    given = [flag_of(name)] if value is None else [f"{flag_of(name)}={value}"]
    done = refuse_sweep(*BASE, *given, "--out", "unused")
    assert done.returncode == 2
    assert f"{flag_of(name)} applies to --executor {FLAGS[name].executor} only" in done.stderr


APPLIES = {"momentum": ["--optimizer", "adamw", "--momentum", "0.9"],  # momentum is SGD's
           "pe_dropout": ["--pe-dropout", "0.1"],  # the learned PE is not among --pe-dropout-on's default kinds
           "sigmas": ["--pe", "none,sin1d", "--sigmas", "0.5"],  # σ is the learned and random PEs' alone
           "pe_at": ["--pe", "none,rope", "--pe-at", "input"]}  # a rotary PE turns q and k in every block


def test_every_conditional_row_is_tried():
    assert set(APPLIES) == {name for name, flag in FLAGS.items() if flag.applies_only_with}


@pytest.mark.parametrize("name", APPLIES)
def test_a_flag_where_its_condition_fails_is_refused(name):
    base = BASE if name == "sigmas" else [a for i, a in enumerate(BASE)  # --sigmas itself applies to σ PEs only
                                          if "--sigmas" not in BASE[max(i - 1, 0):i + 1]]
    done = refuse_sweep(*narrowed(*base, *APPLIES[name], "--out", "unused"))
    assert done.returncode == 2
    assert f"{flag_of(name)} applies to --{FLAGS[name].applies_only_with[0]}" in done.stderr


def test_the_grid_axes_are_the_rows_marked_grid_axis_and_validation_counts_their_grid():
    """GRID_AXES (the summaries', pooling's and expand_grid's) is the rows with grid_axis, outermost first; a
    conditional axis nests inside the axis it applies with. check_grid's size, which refuses a typo grid before
    anything is listed, is expand_grid's number of models."""
    marked = sorted((flag.grid_axis, name) for name, flag in FLAGS.items() if flag.grid_axis is not None)
    assert GRID_AXES == summary.GRID_AXES == tuple(name for _, name in marked)
    assert len({place for place, _ in marked}) == len(marked)  # one place of the nesting each
    # the nesting numbers the models (model_id, config.json's packs): a change would renumber recorded runs
    assert GRID_AXES == ("optimizer", "lr", "weight_decay", "momentum", "init_gamma")
    assert all(name in LIST_SETTINGS for name in GRID_AXES)
    for name in GRID_AXES:
        if FLAGS[name].applies_only_with:
            outer = FLAGS[name].applies_only_with[0]
            assert outer in GRID_AXES[:GRID_AXES.index(name)], name
    flags = ["--task", "netsim", "--pe", "learned,none", "--sigmas", "0.1,1", "--seeds", "2", "--optimizer",
             "adam,sgd", "--lr", "1e-3,3e-3", "--weight-decay", "0,0.01", "--momentum", "0,0.5,0.9",
             "--init-gamma", "0.5,1", "--out", "unused"]
    s = from_flags(build_parser().parse_args(flags))
    models = grid.expand_grid(s)
    # (learned: 2 σ + none) × (adam: 2 lr × 2 wd + sgd: 2 lr × 2 wd × 3 momenta) × 2 γ × 2 seeds
    assert validation.check_grid(s.flat()) == len(models) == 3 * (4 + 12) * 2 * 2
    assert [m["model_id"] for m in models] == list(range(len(models)))
    keys = {tuple(m.get(axis) for axis in ("pe", "sigma", "seed", *GRID_AXES)) for m in models}
    assert len(keys) == len(models)  # each model a point of its own


def test_the_parser_reads_each_lists_values_and_each_rows_type():
    """A list row takes comma-separated text; a scalar row is read as its type."""
    args = build_parser().parse_args(BASE + ["--lr", "0.001,0.002", "--width", "16", "--mlp-width", "24"])
    s = from_flags(args)
    assert s.lr == (0.001, 0.002) and s.width == 16 and s.mlp_width == 24
    assert all(isinstance(value, value_type(name)) for name in LIST_SETTINGS for value in getattr(s, name) or ())


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A sweep's config.json as the sweep writes it at the start: its validated settings, its models and its one
    pack."""
    out = tmp_path_factory.mktemp("rows") / "run"
    out.mkdir()
    s = from_flags(build_parser().parse_args(BASE + ["--out", str(out)]))
    from pe_fast.sweep import grid
    models = [{**model, "pack": 0} for model in grid.expand_grid(s)]
    (out / "config.json").write_text(json.dumps({"settings": s.to_json(), "models": models, "packs": [[0]]}))
    return out


def changed(name: str) -> object:
    """A value of this row other than the recorded one (valid or not: --resume compares before it validates)."""
    kind = value_type(name)
    if name == "task":
        return "lst"
    if name in LIST_SETTINGS:
        return {str: "zzz", float: "0.123", int: "7"}[kind]
    return {str: "zzz", float: 0.123, int: 7777, bool: True}[kind]


@pytest.mark.parametrize("name", [name for name in FLAGS if name not in RUNTIME_FLAGS and name != "out"])
def test_resume_refuses_a_change_of_any_row_that_says_what_trains(name, recorded):
    with pytest.raises(UsageError, match=f"{flag_of(name)} .* differs from its") as refused:
        resume.from_resume(api.arguments({"resume": True, "out": str(recorded), name: changed(name)}))
    # and names every flag that may change, from the rows
    named = str(refused.value).split("may change: ")[1]
    assert all(flag_of(row) in named for row in RUNTIME_FLAGS if not FLAGS[row].executor)


@pytest.mark.parametrize("name,value", [("threads", 1), ("checkpoint_every", 7), ("no_report", True),
                                        ("compile", "off"), ("device", "cpu")])
def test_resume_takes_a_new_value_of_a_runtime_row(name, value, recorded):
    assert name in RUNTIME_FLAGS
    s = resume.from_resume(api.arguments({"resume": True, "out": str(recorded), name: value}))
    assert getattr(s, name) == value


@pytest.mark.parametrize("name", [name for name in FLAGS if name != "task"])
def test_pooling_refuses_folders_that_differ_in_a_row_that_may_not(name, recorded):
    """Folders pooled as one run may differ in a row marked may_differ or runtime (which models, where they ran),
    in no other."""
    s = resume.from_resume(api.arguments({"resume": True, "out": str(recorded)}))
    value = changed(name)
    other = dataclasses.replace(s, **{name: parse_list(value, LIST_SETTINGS[name], name) if name in LIST_SETTINGS
                                      else value})
    folders = {Path("a"): s, Path("b"): other}
    if FLAGS[name].may_differ or FLAGS[name].runtime:
        check_alike(folders)
    else:
        with pytest.raises(ReportError, match=f"trained with {name} = "):
            check_alike(folders)


def test_every_executor_the_flag_offers_is_one_the_sweep_has():
    from pe_fast.sweep.executors import EXECUTORS
    assert FLAGS["executor"].choices == tuple(EXECUTORS)


@pytest.mark.parametrize("task,preset", [(task, preset) for task, kind in KINDS.items() for preset in kind.presets])
def test_every_preset_is_settings_the_rows_accept(task, preset):
    s = from_flags(build_parser().parse_args(["--task", task, "--preset", preset]))
    assert s.preset == preset
    for name, value in KINDS[task].presets[preset].items():
        if name in FLAGS:
            expected = parse_list(value, LIST_SETTINGS[name], name) if name in LIST_SETTINGS else value
            assert getattr(s, name) == expected, name


def test_a_float16_setting_from_python_is_read_without_numpy_s_warning():
    """sweep.run(mask_fraction=np.float16(0.5)): float32's largest cast to float16 for the range check printed
    numpy's "overflow encountered in cast" (issue 55)."""
    import warnings
    from pe_fast.results.settings import conform
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert conform("mask_fraction", np.float16(0.5), float) == 0.5
