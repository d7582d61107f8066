"""The layer order holds: every import in ``dpool/`` points down.

Each module under ``dpool/`` is parsed with ``ast`` and every ``import`` / ``from ...
import`` in it is checked -- at module level, inside functions and under
``if TYPE_CHECKING:`` alike (a lazy import is still a dependency). The order, top to
bottom (a module may import its own layer and the layers below it):

    entry points   cli/, worker/, testing/, __main__, _run, dashboard/, autoscaler/
    public API     dpool/__init__, executor, _executor_core, pool, _pool_core, _pool_results,
                   _resources_api, _cancel, actors/, managers/
    runtime/       this process's client (embedded, attached, TCP cluster driver)
    node/, global_scheduler/   the daemons
    scheduling/    the local scheduler
    placement/     which node a task or bundle goes to: policies, gang placement
    transfer/      moving segments between nodes and TCP drivers
    objects/, control/         the store; the control store
    protocol/      messages, codec, channel, auth, IO loop, dial + handshake, workdir archives
    futures.py     a leaf of types (with _task_future, the future without concurrent.futures)
    errors.py      (with the errors it loads on first use; _log, the lazy loggers)

and besides:

- ``runtime/`` and the daemons (``node/``, ``global_scheduler/``) do not import each other;
- nothing imports ``worker/`` or ``cli/`` but the entry points that start them
  (``cli/``, ``worker/``, ``__main__``, ``testing/``).

Starting a process by the name of its entry module (``python -m dpool.node``,
``protocol._startup.WORKER_ENTRY``) is how entry points are reached, not an import.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dpool"

# Top to bottom; each layer is a set of modules or packages (a package holds its submodules).
LAYERS: list[tuple[str, frozenset[str]]] = [
    ("entry points", frozenset({"dpool.cli", "dpool.worker", "dpool.testing",
                                "dpool.__main__", "dpool._run", "dpool.dashboard",
                                "dpool.autoscaler"})),
    ("public API", frozenset({"dpool", "dpool.executor", "dpool._executor_core",
                              "dpool.pool", "dpool._pool_core",
                              "dpool._pool_results", "dpool._resources_api", "dpool._cancel",
                              "dpool._process_views", "dpool.integrations",
                              "dpool.observe", "dpool.actors", "dpool.managers"})),
    ("runtime", frozenset({"dpool.runtime"})),
    ("daemons", frozenset({"dpool.node", "dpool.global_scheduler"})),
    ("scheduling", frozenset({"dpool.scheduling"})),
    ("placement", frozenset({"dpool.placement"})),
    ("transfer", frozenset({"dpool.transfer"})),
    ("store", frozenset({"dpool.objects", "dpool.control"})),
    ("protocol", frozenset({"dpool.protocol"})),
    ("futures", frozenset({"dpool.futures", "dpool._task_future"})),
    ("errors", frozenset({"dpool.errors", "dpool._errors_broken", "dpool._errors_futures",
                          "dpool._errors_limits", "dpool._log", "dpool._lazy"})),
]

# Pairs that must not import each other, in either direction, whatever the order says.
APART: list[tuple[str, str]] = [
    ("dpool.runtime", "dpool.node"),
    ("dpool.runtime", "dpool.global_scheduler"),
]

# Only these may import ``worker/`` or ``cli/``.
STARTERS = frozenset({"dpool.cli", "dpool.worker", "dpool.__main__", "dpool.testing"})
STARTED = frozenset({"dpool.worker", "dpool.cli"})


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the module imported (``from a import b``: ``a.b`` if that is a module)
    line: int
    type_checking: bool

    def __str__(self) -> str:
        where = " (under TYPE_CHECKING)" if self.type_checking else ""
        return f"{self.module}:{self.line} imports {self.target}{where}"


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package: dotted name -> (path, whether it is a package)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = (path, is_package)
    return out


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, source: str | None = None) -> list[Import]:
    """Every import statement of ``module`` (or of ``source``, read as that module's) that
    names a dpool module."""
    path, is_package = MODULES[module]
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    here = module.split(".") if is_package else module.split(".")[:-1]
    found: list[Import] = []

    def visit(node: ast.AST, type_checking: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_checking)
            return
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1]
                                + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.append(sub if sub in MODULES else base)
        for target in targets:
            if target == "dpool" or target.startswith("dpool."):
                found.append(Import(module, target, node.lineno, type_checking))
        for child in ast.iter_child_nodes(node):
            visit(child, type_checking)

    visit(tree, False)
    return found


def _owner(module: str, groups: frozenset[str]) -> str | None:
    """The member of ``groups`` that ``module`` is or lies in (the longest match)."""
    best = None
    for g in groups:
        if (module == g or module.startswith(g + ".")) and (best is None or len(g) > len(best)):
            best = g
    return best


def _layer(module: str) -> int:
    matches = [(len(_owner(module, members) or ""), i)
               for i, (_, members) in enumerate(LAYERS) if _owner(module, members)]
    if not matches:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return max(matches)[1]


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@functools.cache
def all_imports() -> list[Import]:
    """Every dpool import in dpool/ (parsed on first use: not in every xdist worker that
    merely collects this file)."""
    return [imp for module in MODULES for imp in _imports(module)]


def test_the_scan_finds_the_imports_it_checks():
    """The parser sees what it must: relative, function-level and type-checking imports."""
    assert len(MODULES) > 50 and "dpool.scheduling" in MODULES
    assert any(imp.type_checking for imp in all_imports())
    assert {i.target for i in all_imports() if i.module == "dpool.__main__"} == {"dpool.cli"}
    assert all(i.target in MODULES for i in all_imports()), \
        sorted({i.target for i in all_imports()} - set(MODULES))


def test_every_module_is_in_a_layer():
    missing = []
    for module in MODULES:
        try:
            _layer(module)
        except AssertionError as e:
            missing.append(str(e))
    assert not missing, "\n".join(missing)


def test_imports_point_down_the_layers():
    upward = []
    for imp in all_imports():
        src, dst = _layer(imp.module), _layer(imp.target)
        if dst < src:
            upward.append(f"{imp}: layer '{LAYERS[src][0]}' imports layer '{LAYERS[dst][0]}'")
    assert not upward, "imports that point up the layers:\n" + "\n".join(upward)


@pytest.mark.parametrize("a, b", APART, ids=[f"{a}-{b}" for a, b in APART])
def test_the_runtime_and_the_daemons_do_not_import_each_other(a, b):
    crossing = [str(imp) for imp in all_imports()
                if (_in(imp.module, a) and _in(imp.target, b))
                or (_in(imp.module, b) and _in(imp.target, a))]
    assert not crossing, f"{a} and {b} must not import each other:\n" + "\n".join(crossing)


def test_nothing_but_an_entry_point_imports_the_worker_or_the_cli():
    wrong = [str(imp) for imp in all_imports()
             if _owner(imp.target, STARTED) and not _owner(imp.module, STARTERS)]
    assert not wrong, "only cli/, worker/, __main__ and testing/ may import worker/ or " \
                      "cli/:\n" + "\n".join(wrong)


def test_futures_is_a_leaf_of_types():
    deps = sorted({imp.target for imp in all_imports()
                   if imp.module in ("dpool.futures", "dpool._task_future")})
    assert set(deps) <= {"dpool.errors", "dpool._task_future", "dpool._log"}, \
        f"dpool.futures imports {deps}"


# -- front doors ---------------------------------------------------------------------------
# Imports of another package's private module that are meant: (importer, imported) -> why.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("dpool.transfer._pull", "dpool.objects._segment"):
        "a pulled value is written straight into a new segment of this host's store, in "
        "ranges as they arrive: it needs the segment writer's own steps (_claim_recycled, "
        "_create, _full, _NO_SPACE_ERRNOS), which no other package may call",
    ("dpool.transfer._push", "dpool.objects._segment"):
        "an uploaded value is laid out, and received, as the segment's bytes verbatim: the "
        "segment's layout (_layout, _Layout, _HEADER, _as_bytes_view) and the writer's "
        "steps (_claim_recycled, _create, _full)",
    ("dpool.transfer._ranges", "dpool.objects._segment"):
        "a range is written into the segment at its offset with the writer's own "
        "_pwrite_all, and a full /dev/shm is told apart by the store's _NO_SPACE_ERRNOS",
}


def _package(module: str) -> str:
    """The package under ``dpool/`` that ``module`` is or lies in: ``dpool.node`` for
    ``dpool.node._spillback``; ``dpool`` for the root's own modules (``dpool._log``)."""
    top = ".".join(module.split(".")[:2])
    return top if top in MODULES and MODULES[top][1] else "dpool"


def _is_private(module: str) -> bool:
    """Whether ``module`` is a ``_module`` of its package (``dpool.objects._payload``)."""
    return any(p.startswith("_") and not p.startswith("__") for p in module.split(".")[2:])


def _reaches_in(imports: list[Import]) -> list[Import]:
    """The imports of another package's private module."""
    return [imp for imp in imports
            if _package(imp.target) not in ("dpool", _package(imp.module))
            and _is_private(imp.target)]


def test_other_packages_are_imported_through_their_front_doors():
    """A package is used by the others through its ``__init__`` (its ``__all__``), never
    by one of its ``_modules``: ``from dpool.objects import payload as _payload``, not
    ``from dpool.objects import _payload``, ``from dpool.objects._payload import loads``
    or ``import dpool.objects._payload``. Every import counts (module level, in
    functions, under ``TYPE_CHECKING``). Inside a package its modules import each other
    freely, and the root's own private modules (``dpool._log``, ``dpool._task_future``,
    ``dpool._errors_*``...) are the whole library's shared internals: any package may
    import them. What is left is in ``EXCEPTIONS``, each with its reason."""
    wrong = [str(imp) for imp in _reaches_in(all_imports())
             if (imp.module, imp.target) not in EXCEPTIONS]
    assert not wrong, ("imports of another package's private module (import what its "
                       "__init__ exports instead, or add it there):\n" + "\n".join(wrong))


def test_every_front_door_exception_is_still_needed():
    used = {(imp.module, imp.target) for imp in _reaches_in(all_imports())}
    assert not set(EXCEPTIONS) - used, sorted(set(EXCEPTIONS) - used)
    assert all(len(why) > 40 for why in EXCEPTIONS.values())


def test_the_front_door_check_sees_every_form_of_import():
    source = """
from dpool.objects import _payload
from dpool.objects._values import stored
import dpool.objects._segment
from dpool.objects import payload
from dpool.node import _spillback_base
from dpool._log import get_logger
from dpool.errors import Error


def later():
    from ..protocol import _messages as m

TYPE_CHECKING = False
if TYPE_CHECKING:
    from dpool.runtime._client import Client
"""
    found = {imp.target for imp in _reaches_in(_imports("dpool.node._spillback", source))}
    assert found == {"dpool.objects._payload", "dpool.objects._values",
                     "dpool.objects._segment", "dpool.protocol._messages",
                     "dpool.runtime._client"}
    assert _package("dpool._log") == _package("dpool.executor") == "dpool"
    assert _reaches_in([Import("dpool._executor_core", "dpool.runtime._current", 1, False)])
