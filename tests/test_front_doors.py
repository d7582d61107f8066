"""Each package's front door: its ``__init__`` says in ``__all__`` what the other packages
may use (``tests/test_architecture.py`` holds them to it), serves those names on first use
(PEP 562) and, but where it always did, loads none of its modules when imported.

The pattern is ``dpool/placement/__init__.py``'s (tested in ``tests/placement/``): a name
in ``_LAZY`` is its module's own; one in ``_MODULES`` is the module itself, used as a
namespace (``from dpool.objects import payload as _payload``); type checkers read the same
names from the imports under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import dpool

ROOT = Path(dpool.__file__).parent
PACKAGES = sorted(f"dpool.{p.parent.name}" for p in ROOT.glob("*/__init__.py"))
# Those whose ``__init__`` imports some of its modules at once, as before front doors:
# the names the embedded runtime or ``dpool.progress``/``timeline`` need anyway.
EAGER = {"dpool.cli", "dpool.control", "dpool.observe", "dpool.protocol", "dpool.scheduling"}


def _init(package: str) -> ast.Module:
    return ast.parse((ROOT / package.split(".")[1] / "__init__.py").read_text())


def _type_checking_imports(package: str) -> dict[str, str]:
    """``name -> module`` bound under ``if TYPE_CHECKING:`` (a module bound whole maps to
    itself)."""
    out: dict[str, str] = {}
    for node in _init(package).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and node.test.id == "TYPE_CHECKING":
            for imp in ast.walk(node):
                if isinstance(imp, ast.ImportFrom):
                    assert imp.module
                    for a in imp.names:
                        whole = f"{imp.module}.{a.name}"
                        is_module = imp.module == package and a.name.startswith("_")
                        out[a.asname or a.name] = whole if is_module else imp.module
    return out


def _bound_at_import(package: str) -> set[str]:
    """Names the ``__init__`` binds when it runs: its imports and definitions."""
    out = set()
    for node in _init(package).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
    return out


def test_every_package_has_a_front_door():
    assert len(PACKAGES) >= 15 and "dpool.objects" in PACKAGES
    for package in PACKAGES:
        public = importlib.import_module(package).__all__
        assert len(public) == len(set(public)), package
        assert not [n for n in public if n.startswith("_")], package


@pytest.mark.parametrize("package", PACKAGES)
def test_all_the_lazy_tables_and_the_type_checking_imports_agree(package):
    mod = importlib.import_module(package)
    lazy, modules = getattr(mod, "_LAZY", {}), getattr(mod, "_MODULES", {})
    types = set(getattr(mod, "_TYPES", ()))
    assert not set(lazy) & set(modules)
    assert set(mod.__all__) == set(lazy) | set(modules) | (
        set(mod.__all__) & _bound_at_import(package)), package
    assert not types & set(mod.__all__)
    checked = _type_checking_imports(package)
    if lazy or modules:
        assert {n: m for n, m in checked.items() if n not in types} == {**lazy, **modules}
    assert types <= set(checked)
    for name, module in modules.items():
        assert module == f"{package}._{name}", "a namespace is named as its module"


_NAMES = [(p, n) for p in PACKAGES for n in importlib.import_module(p).__all__]


@pytest.mark.parametrize("package, name", _NAMES, ids=[f"{p}.{n}" for p, n in _NAMES])
def test_each_name_is_its_modules_own(package, name):
    mod = importlib.import_module(package)
    value = getattr(mod, name)
    if name in getattr(mod, "_MODULES", {}):
        assert value is importlib.import_module(mod._MODULES[name])
    elif name in getattr(mod, "_LAZY", {}):
        assert value is getattr(importlib.import_module(mod._LAZY[name]), name)
    assert value is not None


@pytest.mark.parametrize("package", sorted(set(PACKAGES) - EAGER))
def test_importing_a_package_loads_none_of_its_modules(package):
    out = subprocess.run(
        [sys.executable, "-c", "import sys; before = set(sys.modules); "
         f"import {package}; print('\\n'.join(sorted(set(sys.modules) - before)))"],
        capture_output=True, text=True, timeout=30, check=True)
    # (dpool's modules only: a package off the fast path may import typing, say --
    # tests/test_fast_import_rule.py)
    # (``dpool._lazy``: the root's helper that makes a lazy front door)
    assert {n for n in out.stdout.split() if n.split(".")[0] == "dpool"} - {"dpool._lazy"} \
        == {"dpool", package}


@pytest.mark.parametrize("package", [p for p in PACKAGES
                                     if hasattr(importlib.import_module(p), "_LAZY")])
def test_an_unknown_name_is_an_attribute_error(package):
    mod = importlib.import_module(package)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        mod.no_such_name  # noqa: B018
    for name in getattr(mod, "_TYPES", ()):  # for type checkers only
        with pytest.raises(AttributeError):
            getattr(mod, name)
    assert set(mod.__all__) <= set(dir(mod))
