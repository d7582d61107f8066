"""The fast-import rule, checked for the modules it covers, and only for them.

The modules a short program loads before its first result -- ``from dpool import
ProcessPoolExecutor`` or ``Pool``, one task, one ``Pool.map``, in the driver and in the
worker -- are the *fast path*. They import none of ``typing``, ``dataclasses``,
``logging``, ``inspect`` at run time: annotations are strings (``from __future__ import
annotations``) and the names they use are imported under ``TYPE_CHECKING = False``;
loggers come from ``dpool._log``; records are ``protocol._record``'s ``@record``. That is
what keeps dpool's cold start at the stdlib's (``bench/coldstart.py``).

Code off that path -- the node daemon, the global scheduler, the CLI, the dashboard -- is
ordinary typed Python: it imports ``typing`` and ``logging`` as any program does, and the
``TYPE_CHECKING = False`` stand-in is not used there (it would only hide the rule).

The fast path is computed here, in a fresh interpreter, not listed by hand:
``tests/test_import_cost.py`` holds what it must never load; this file names the module
that breaks the rule and the line.
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dpool"
HEAVY = frozenset({"typing", "dataclasses", "logging", "inspect"})
ORDINARY = ("dpool.node", "dpool.global_scheduler", "dpool.cli", "dpool.dashboard")

_PROGRAM = textwrap.dedent("""
    import sys
    from dpool import Pool, ProcessPoolExecutor

    def loaded_in_worker(_):
        import sys
        return sorted(m for m in sys.modules if m == "dpool" or m.startswith("dpool."))

    if __name__ == "__main__":
        with ProcessPoolExecutor(1) as ex:
            worker = ex.submit(loaded_in_worker, 0).result()
        with Pool(1) as p:
            p.map(abs, [1, 2])
        here = [m for m in sys.modules if m == "dpool" or m.startswith("dpool.")]
        print("\\n".join(sorted(set(here) | set(worker))))
""")


@functools.lru_cache(maxsize=1)
def fast_path() -> frozenset[str]:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "first_task.py"
        script.write_text(_PROGRAM)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                             timeout=60, check=True, cwd=tmp, env=env)
    return frozenset(out.stdout.split())


def _path(module: str) -> Path:
    rel = Path(*module.split("."))
    pkg = ROOT / rel / "__init__.py"
    return pkg if pkg.exists() else (ROOT / rel).with_suffix(".py")


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING"))


def _run_time_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """Top-level imports that run when the module loads (``if TYPE_CHECKING:`` blocks
    excluded; function bodies excluded: what they import loads on a call)."""
    found: list[tuple[int, str]] = []
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if _is_type_checking(node):
            stack.extend(getattr(node, "orelse", []))
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []):
                    if isinstance(child, ast.ExceptHandler):
                        stack.extend(child.body)
                    else:
                        stack.append(child)
    return found


def test_the_fast_path_is_what_a_first_task_loads():
    fast = fast_path()
    assert {"dpool", "dpool.executor", "dpool.pool", "dpool.scheduling._scheduler",
            "dpool.worker._main"} <= fast
    assert not any(m.startswith(ORDINARY) for m in fast)


@pytest.mark.parametrize("module", sorted(fast_path()))
def test_a_fast_path_module_imports_nothing_heavy_at_run_time(module):
    tree = ast.parse(_path(module).read_text())
    bad = [(line, name) for line, name in _run_time_imports(tree) if name in HEAVY]
    assert not bad, (f"{module} is on the fast path (a first task loads it) and imports "
                     f"{', '.join(f'{n} (line {ln})' for ln, n in bad)} at run time: import "
                     "type names under TYPE_CHECKING, log through dpool._log")


def _ordinary_modules() -> list[str]:
    out = []
    for pkg in ORDINARY:
        base = PACKAGE / pkg.split(".")[1]
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out.append(".".join(parts))
    return out


@pytest.mark.parametrize("module", _ordinary_modules())
def test_code_off_the_fast_path_is_ordinary_python(module):
    assert module not in fast_path()
    tree = ast.parse(_path(module).read_text())
    stand_in = [n.lineno for n in tree.body
                if isinstance(n, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "TYPE_CHECKING" for t in n.targets)]
    assert not stand_in, (f"{module} is off the fast path: use typing.TYPE_CHECKING, not "
                          f"the TYPE_CHECKING = False stand-in (line {stand_in[0]})")
    uses_lazy_log = any(
        isinstance(n, ast.ImportFrom) and n.module == "dpool" and
        any(a.name == "_log" for a in n.names) for n in ast.walk(tree))
    assert not uses_lazy_log, f"{module} is off the fast path: use logging, not dpool._log"
