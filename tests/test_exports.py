"""dpool's public surface is one list, said three times that agree: ``__all__``, the table
of names ``dpool/__init__.py`` loads on first use (``_LAZY``) and the imports type
checkers see (``if TYPE_CHECKING:``). And ``import dpool`` alone stays cheap."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import dpool

INIT = Path(dpool.__file__)


def _type_checking_imports() -> dict[str, str]:
    """``name -> module`` of the ``from m import name`` lines under ``if TYPE_CHECKING:``."""
    tree = ast.parse(INIT.read_text())
    blocks = [node for node in tree.body if isinstance(node, ast.If)
              and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"]
    assert len(blocks) == 1, "dpool/__init__.py has one `if TYPE_CHECKING:` block"
    out: dict[str, str] = {}
    for node in ast.walk(blocks[0]):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, ast.dump(node)
            for alias in node.names:
                assert alias.asname is None, f"{alias.name} is imported under another name"
                assert alias.name not in out, f"{alias.name} is imported twice"
                out[alias.name] = node.module
        elif isinstance(node, ast.Import):
            raise AssertionError("the TYPE_CHECKING block imports names, not modules")
    return out


TYPE_CHECKING_IMPORTS = _type_checking_imports()
PUBLIC = list(dpool.__all__)


def test_all_lists_each_name_once():
    assert len(PUBLIC) == len(set(PUBLIC)), [n for n in PUBLIC if PUBLIC.count(n) > 1]
    assert all(isinstance(n, str) and not n.startswith("_") for n in PUBLIC)


def test_all_the_lazy_table_and_the_type_checking_imports_agree():
    lazy = dict(dpool._LAZY)
    assert set(lazy) == set(PUBLIC), {
        "in __all__ only": sorted(set(PUBLIC) - set(lazy)),
        "in _LAZY only": sorted(set(lazy) - set(PUBLIC))}
    assert set(TYPE_CHECKING_IMPORTS) == set(PUBLIC), {
        "in __all__ only": sorted(set(PUBLIC) - set(TYPE_CHECKING_IMPORTS)),
        "under TYPE_CHECKING only": sorted(set(TYPE_CHECKING_IMPORTS) - set(PUBLIC))}
    differ = {n: (lazy[n], TYPE_CHECKING_IMPORTS[n]) for n in PUBLIC
              if lazy[n] != TYPE_CHECKING_IMPORTS[n]}
    assert not differ, f"names whose lazy module and type-checking module differ: {differ}"


@pytest.mark.parametrize("name", PUBLIC)
def test_each_public_name_resolves_to_the_object_its_module_defines(name):
    module = importlib.import_module(dpool._LAZY[name])
    assert hasattr(module, name), f"{module.__name__} has no {name}"
    value = getattr(dpool, name)
    assert value is getattr(module, name)
    assert value is not None


def test_dir_lists_every_public_name():
    listed = dir(dpool)
    assert set(PUBLIC) <= set(listed), sorted(set(PUBLIC) - set(listed))
    assert listed == sorted(listed)


@pytest.mark.parametrize("name", PUBLIC)
def test_each_public_class_and_function_has_a_docstring(name):
    value = getattr(dpool, name)
    if inspect.isclass(value) or inspect.isroutine(value):
        # a class's own docstring (``__doc__`` is not inherited), not its base's
        assert (value.__doc__ or "").strip(), f"dpool.{name} has no docstring"


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        dpool.no_such_name  # noqa: B018


HEAVY = ("numpy", "cloudpickle", "psutil", "posix_ipc", "redis", "multiprocessing",
         "concurrent.futures", "threading", "socket")


def _modules_after(statement: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{statement}; import sys; print('\\n'.join(sys.modules))"],
        capture_output=True, text=True, timeout=30, check=True)
    return set(out.stdout.split())


def test_import_dpool_alone_loads_nothing_heavy():
    """``import dpool`` loads the package and ``typing`` (for ``TYPE_CHECKING``), nothing
    else: no runtime, no scheduler, no numpy -- those load with the first public name."""
    loaded = _modules_after("import dpool")
    extra = loaded - _modules_after("import typing")
    assert extra == {"dpool"}, sorted(extra)
    assert not [m for m in loaded if m.split(".")[0] == "dpool" and m != "dpool"]
    assert not [m for m in HEAVY if m in loaded]


def test_the_pytest_plugin_loads_no_dpool_machinery():
    """pytest loads ``dpool.testing._plugin`` on every run (an entry point): it must not
    bring the runtime, the scheduler or numpy with it."""
    loaded = _modules_after("import dpool.testing._plugin")
    ours = sorted(m for m in loaded if m.split(".")[0] == "dpool")
    assert ours == ["dpool", "dpool.testing", "dpool.testing._plugin"], ours
    assert "numpy" not in loaded
