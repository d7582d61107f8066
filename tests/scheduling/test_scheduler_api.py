"""The local scheduler's interface to the node's services (``scheduling._api``) holds.

- ``LocalScheduler`` has every member of ``SchedulerAPI``, with the same parameters, and
  the node's services have every member of the service protocols the scheduler calls.
- No module outside ``dpool/scheduling/`` reaches a ``_``-member of the scheduler, nor
  plugs into it by assigning its attributes (a heuristic over the source: expressions
  that name the scheduler -- ``s``, ``_s``, ``scheduler``, ``sched``, ``self._s``,
  ``self.scheduler``, ``rt.scheduler``, ``d.scheduler`` ...).
- The lock rule is true: a method named ``*_locked`` never takes the scheduler's lock
  (it is held already: ``threading.Lock`` would deadlock), and any other function calls
  ``*_locked`` methods only inside ``with <...>.lock:``.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path
from typing import Any

from dpool.scheduling import (
    ActorService,
    DriverService,
    LeaseService,
    LocalScheduler,
    SchedulerAPI,
    SpillbackService,
)

PACKAGE = Path(__file__).resolve().parents[2] / "dpool"
SERVICES = ("node", "global_scheduler", "runtime")  # folders that use the scheduler
LOCK_RULE = ("scheduling", "node")  # folders where ``_locked`` names are the rule

# Expressions that name the scheduler: a plain name, or an attribute of that name.
SCHEDULER_NAMES = {"s", "_s", "scheduler", "sched"}
# Public attributes its owner (the node daemon) configures before it serves.
CONFIG_ATTRS = {"cpu_limit", "ledger", "id_prefix"}


def _members(proto: type) -> list[str]:
    """A protocol's members, as declared in its class body and its base protocols'."""
    names: set[str] = set()
    for cls in proto.__mro__:
        if getattr(cls, "_is_protocol", False) and cls.__module__.startswith("dpool"):
            names |= set(vars(cls).get("__annotations__", {}))
            names |= set(vars(cls))
    return sorted(n for n in names if not n.startswith("_"))


def _sources(*folders: str) -> list[tuple[Path, ast.Module]]:
    out = []
    for folder in folders:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            out.append((path, ast.parse(path.read_text(), str(path))))
    return out


def _names_scheduler(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in SCHEDULER_NAMES
    return isinstance(node, ast.Attribute) and node.attr in SCHEDULER_NAMES


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', '?')}"


def _assigned_in_init(cls: type) -> set[str]:
    """The attributes ``cls.__init__`` sets on ``self`` (instance members)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    return {t.attr for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
            and t.value.id == "self"}


def test_local_scheduler_implements_the_api() -> None:
    members = _members(SchedulerAPI)
    assert {"lock", "group", "admit_locked", "finish_locked", "send_locked",
            "take_out_locked", "deliver", "register_handler",
            "attach_services"} <= set(members)
    state = _assigned_in_init(LocalScheduler)
    missing = [n for n in members if not hasattr(LocalScheduler, n) and n not in state]
    assert not missing, f"LocalScheduler lacks {missing}"
    for name in members:
        declared = getattr(SchedulerAPI, name)
        if isinstance(declared, property):
            assert name in state or isinstance(getattr(LocalScheduler, name, None), property)
            continue
        want = list(inspect.signature(declared).parameters)
        got = list(inspect.signature(getattr(LocalScheduler, name)).parameters)
        assert got == want, f"LocalScheduler.{name}{got} is not the API's {want}"


def test_the_node_services_implement_what_the_scheduler_calls() -> None:
    from dpool.node._actor_calls import ActorCalls
    from dpool.node._attach import DriverSessions
    from dpool.node._leases import LeaseDesk
    from dpool.node._spillback import Spillback

    for cls, proto in ((DriverSessions, DriverService), (Spillback, SpillbackService),
                       (LeaseDesk, LeaseService), (ActorCalls, ActorService)):
        missing = [n for n in _members(proto) if not hasattr(cls, n)
                   and n not in inspect.getsource(cls.__init__)]  # (instance attributes)
        assert not missing, f"{cls.__name__} lacks {missing} of {proto.__name__}"


def test_nothing_outside_scheduling_reaches_a_private_member_of_the_scheduler() -> None:
    found = []
    for path, tree in _sources(*SERVICES):
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                    and not node.attr.startswith("__") and _names_scheduler(node.value):
                found.append(f"{_where(path, node)}: .{node.attr}")
    assert not found, "private members of the scheduler used outside scheduling/:\n" + \
        "\n".join(found)


def test_services_plug_in_through_methods_not_attributes() -> None:
    found = []
    for path, tree in _sources(*SERVICES):
        for node in ast.walk(tree):
            targets: list[Any] = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Subscript):  # scheduler.<table>[key] = ...
                    t = t.value
                if isinstance(t, ast.Attribute) and _names_scheduler(t.value) \
                        and t.attr not in CONFIG_ATTRS:
                    found.append(f"{_where(path, t)}: .{t.attr} = ...")
    assert not found, "attributes of the scheduler assigned outside scheduling/:\n" + \
        "\n".join(found)


def _takes_lock(node: ast.With) -> bool:
    return any(isinstance(i.context_expr, ast.Attribute) and i.context_expr.attr == "lock"
               for i in node.items)


def _lock_rule_violations(path: Path, tree: ast.Module) -> list[str]:
    found: list[str] = []

    def visit(node: ast.AST, func: str, locked: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func, locked = node.name, node.name.endswith("_locked")
        elif isinstance(node, ast.Lambda):
            locked = False  # runs later, wherever it is called
        elif isinstance(node, ast.With) and _takes_lock(node):
            if func.endswith("_locked"):
                found.append(f"{_where(path, node)}: {func} takes the lock it expects held")
            for child in node.body:
                visit(child, func, True)
            return
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr.endswith("_locked") and not locked:
            found.append(f"{_where(path, node)}: {func} calls {node.func.attr} "
                         "without the lock")
        for child in ast.iter_child_nodes(node):
            visit(child, func, locked)

    visit(tree, "<module>", False)
    return found


def test_the_lock_rule_is_true() -> None:
    found = []
    for path, tree in _sources(*LOCK_RULE):
        found += _lock_rule_violations(path, tree)
    assert not found, "\n".join(found)


def test_the_lock_rule_check_catches_both_mistakes() -> None:
    bad = ast.parse(
        "def finish_locked(self):\n"
        "    with self.lock:\n"
        "        pass\n"
        "def submit(self):\n"
        "    self.admit_locked(1)\n"
        "def ok(self):\n"
        "    with self._s.lock:\n"
        "        self._s.admit_locked(1)\n")
    found = _lock_rule_violations(PACKAGE / "x.py", bad)
    assert len(found) == 2
    assert "finish_locked takes the lock" in found[0]
    assert "submit calls admit_locked without the lock" in found[1]


def test_the_control_stores_implement_their_interfaces() -> None:
    from dpool.control import ControlStore, InProcessControlStore
    from dpool.control._interface import ClusterControlStore
    from dpool.control._redis import RedisControlStore

    for cls, proto in ((InProcessControlStore, ControlStore),
                       (RedisControlStore, ClusterControlStore)):
        for name in _members(proto):
            assert hasattr(cls, name), f"{cls.__name__} lacks {name}"
            want = list(inspect.signature(getattr(proto, name)).parameters)
            got = list(inspect.signature(getattr(cls, name)).parameters)
            assert got == want, f"{cls.__name__}.{name}{got} is not {want}"
