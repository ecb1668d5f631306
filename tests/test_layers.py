"""Every import inside pe_fast goes down the layers of pe_fast.results.LAYERS, or stays in its own unit: the sweep
and the report never import each other, a task never imports the training loop. Read from the source (ast), so
that an import inside a function counts too."""
import ast
from pathlib import Path

import pytest

import pe_fast
from pe_fast.results import LAYERS, UPWARD_SHORTCUTS

PACKAGE = Path(pe_fast.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    """The longest unit of LAYERS that holds the module."""
    units = [unit for layer in LAYERS for unit in layer if module == unit or module.startswith(unit + ".")]
    if not units:
        raise AssertionError(f"{module} is in no layer of pe_fast.results.LAYERS: add it there")
    return max(units, key=len)


LAYER_OF = {unit: depth for depth, layer in enumerate(LAYERS) for unit in layer}


def submodule_or_package(package: str, name: str) -> str:
    """`from package import name`: the module package.name where it is one, else package."""
    candidate = PACKAGE.parent / f"{package}.{name}".replace(".", "/")
    return f"{package}.{name}" if candidate.is_dir() or candidate.with_suffix(".py").is_file() else package


def imports(path: Path) -> list[str]:
    """The pe_fast modules a file imports, at its top or inside a function."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: pe_fast imports by absolute names only"
            names += [submodule_or_package(node.module, alias.name) for alias in node.names]
    return [name for name in names if name == "pe_fast" or name.startswith("pe_fast.")]


def violations(paths) -> list[str]:
    found = []
    for path in paths:
        importer = module_name(path)
        mine = unit_of(importer)
        for imported in imports(path):
            theirs = unit_of(imported)
            if theirs == mine or (importer, imported) in UPWARD_SHORTCUTS:
                continue
            if LAYER_OF[theirs] >= LAYER_OF[mine]:
                where = "beside" if LAYER_OF[theirs] == LAYER_OF[mine] else "above"
                found.append(f"{importer} imports {imported}, a unit {where} its own ({mine})")
    return found


def test_every_import_goes_down_the_layers():
    assert violations(sorted(PACKAGE.rglob("*.py"))) == []


def test_the_check_catches_an_import_of_a_peer_and_of_a_layer_above(tmp_path, monkeypatch):
    """A report module that imports the sweep, and a task that imports the results layer, are refused."""
    fake = tmp_path / "pe_fast"
    (fake / "report").mkdir(parents=True)
    (fake / "tasks").mkdir()
    (fake / "sweep").mkdir()
    (fake / "sweep" / "grid.py").write_text("")
    (fake / "report" / "x.py").write_text("from pe_fast.sweep.grid import expand_grid\n")
    (fake / "tasks" / "y.py").write_text("def f():\n    from pe_fast.results import run_folder\n")
    (fake / "tasks" / "z.py").write_text("from pe_fast.train import upload\nfrom pe_fast.models import PE_KINDS\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    found = violations(sorted(fake.rglob("*.py")))
    assert found == ["pe_fast.report.x imports pe_fast.sweep.grid, a unit beside its own (pe_fast.report)",
                     "pe_fast.tasks.y imports pe_fast.results, a unit above its own (pe_fast.tasks)",
                     "pe_fast.tasks.z imports pe_fast.train, a unit beside its own (pe_fast.tasks)"]


@pytest.mark.parametrize("module", ["pe_fast.sweep.cli", "pe_fast.report.cli", "pe_fast.results.reading"])
def test_a_module_belongs_to_the_unit_that_holds_it(module):
    assert unit_of(module) == ".".join(module.split(".")[:2])
