"""``dpool.placement``'s front door: every name in ``__all__`` loads on first use from the
module that defines it, importing the package loads none of them, and the wire tags and
resource descriptions it shares with the local scheduler (which declares its own, so as
not to load this package) agree with ``scheduling._resources``'s."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import dpool.placement as placement
from dpool.placement import NodeLoad, strategy_from_wire
from dpool.scheduling import _resources

INIT = Path(placement.__file__)


def _type_checking_imports() -> dict[str, str]:
    tree = ast.parse(INIT.read_text())
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and node.test.id == "TYPE_CHECKING":
            for imp in ast.walk(node):
                if isinstance(imp, ast.ImportFrom):
                    out.update(dict.fromkeys((a.name for a in imp.names), imp.module))
    return out


def test_all_the_lazy_table_and_the_type_checking_imports_agree():
    public = placement.__all__
    assert len(public) == len(set(public))
    assert set(public) == set(placement._LAZY) == set(_type_checking_imports())
    assert placement._LAZY == _type_checking_imports()


@pytest.mark.parametrize("name", placement.__all__)
def test_each_name_is_its_modules_own(name):
    module = importlib.import_module(placement._LAZY[name])
    assert getattr(placement, name) is getattr(module, name)
    assert name in module.__all__


def test_importing_the_package_loads_none_of_its_modules_nor_typing():
    out = subprocess.run(
        [sys.executable, "-c", "import sys; before = set(sys.modules); import dpool.placement; "
         "print('\\n'.join(sorted(set(sys.modules) - before)))"],
        capture_output=True, text=True, timeout=30, check=True)
    assert set(out.stdout.split()) == {"dpool", "dpool._lazy", "dpool.placement"}


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        placement.no_such_name  # noqa: B018


def test_it_agrees_with_what_the_local_scheduler_declares():
    from dpool.placement import _policies

    assert (_policies.BUNDLE, _policies.HERE) == (_resources.BUNDLE, _resources.HERE)
    assert strategy_from_wire(_resources.HERE) is None
    n = NodeLoad("a:1", 4, resources={"GPU": 1, "memory": 2048, "TPU": 0.5})
    assert n.describe() == _resources._describe(n.offers()) == \
        "{CPU: 4, GPU: 1, memory: 2048, TPU: 0.5}"
