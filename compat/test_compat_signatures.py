"""Signature checks: every public method of the stdlib classes exists in dpool's and
accepts every call the stdlib's accepts (same names, kinds, order and defaults; dpool may
add parameters only with defaults)."""

from __future__ import annotations

import concurrent.futures as cf
import concurrent.futures.process
import inspect
import multiprocessing
import multiprocessing.pool
from typing import Any, Callable

import pytest

import dpool
import dpool.pool

P = inspect.Parameter
_POSITIONAL = (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)


def _public(cls: type) -> list[str]:
    names = [n for n in dir(cls) if not n.startswith("_")]
    return names + [n for n in ("__init__", "__enter__", "__exit__", "__iter__", "__next__",
                                "__reduce__") if n in cls.__dict__]


def assert_compatible(std: Callable[..., Any], ours: Callable[..., Any], where: str) -> None:
    s, o = inspect.signature(std), inspect.signature(ours)
    sp, op = list(s.parameters.values()), list(o.parameters.values())
    o_by_name = {p.name: p for p in op}
    o_positional = [p for p in op if p.kind in _POSITIONAL]
    o_var_pos = any(p.kind == P.VAR_POSITIONAL for p in op)
    o_var_kw = any(p.kind == P.VAR_KEYWORD for p in op)
    for i, p in enumerate(q for q in sp if q.kind in _POSITIONAL):
        # Positional use: the same slot must exist (or *args take it).
        assert i < len(o_positional) or o_var_pos, f"{where}: positional {p.name} missing"
        if i < len(o_positional) and p.kind == P.POSITIONAL_OR_KEYWORD:
            assert o_positional[i].name == p.name, \
                f"{where}: parameter {i} is {o_positional[i].name!r}, stdlib {p.name!r}"
    for p in sp:
        if p.kind in (P.VAR_POSITIONAL, P.VAR_KEYWORD):
            kind_ok = o_var_pos if p.kind == P.VAR_POSITIONAL else o_var_kw
            assert kind_ok, f"{where}: missing {p}"
            continue
        if p.kind == P.POSITIONAL_ONLY:
            continue
        q = o_by_name.get(p.name)
        if q is None:
            assert o_var_kw, f"{where}: keyword {p.name!r} missing"
            continue
        assert q.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY), f"{where}: {q} kind"
        if p.kind == P.KEYWORD_ONLY:
            assert q.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)
        if p.default is not P.empty:
            assert q.default is not P.empty, f"{where}: {p.name} needs a default"
            assert q.default == p.default, \
                f"{where}: {p.name} defaults to {q.default!r}, stdlib {p.default!r}"
    std_names = {p.name for p in sp}
    for q in op:  # dpool's extra parameters must be optional
        if q.name not in std_names and q.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD):
            assert q.default is not P.empty, f"{where}: extra parameter {q.name} is required"


PAIRS = [
    (cf.ProcessPoolExecutor, dpool.ProcessPoolExecutor),
    (multiprocessing.pool.Pool, dpool.Pool),
    (multiprocessing.pool.ApplyResult, dpool.pool.ApplyResult),
    (multiprocessing.pool.MapResult, dpool.pool.MapResult),
    (multiprocessing.pool.IMapIterator, dpool.pool.IMapIterator),
    (multiprocessing.pool.IMapUnorderedIterator, dpool.pool.IMapUnorderedIterator),
]
METHODS = [(std, ours, name) for std, ours in PAIRS for name in _public(std)
           if not (std is multiprocessing.pool.MapResult and name == "__init__")
           and not (std.__name__.startswith("IMap") and name == "__init__")
           and not (std is multiprocessing.pool.ApplyResult and name == "__init__")]


@pytest.mark.parametrize("std, ours, name", METHODS,
                         ids=[f"{s.__name__}.{n}" for s, _, n in METHODS])
def test_method_exists_with_compatible_signature(std, ours, name):
    assert hasattr(ours, name), f"{ours.__name__} lacks {name}"
    s, o = getattr(std, name), getattr(ours, name)
    if callable(s):
        assert callable(o)
        assert_compatible(s, o, f"{ours.__name__}.{name}")


def test_module_level_names():
    assert_compatible(multiprocessing.cpu_count, dpool.cpu_count, "cpu_count")
    assert dpool.cpu_count() == multiprocessing.cpu_count()
    assert dpool.pool.AsyncResult is dpool.pool.ApplyResult
    assert issubclass(dpool.Future, cf.Future)
    assert issubclass(dpool.WorkerCrashedError, concurrent.futures.process.BrokenProcessPool)
    # The result classes are generic, as the stdlib's are (annotations keep working).
    assert dpool.pool.ApplyResult[int] is not None and dpool.pool.MapResult[int] is not None


def test_the_checker_catches_incompatible_signatures():
    def std(a, b=1, *, c=None): ...
    def renamed(a, x=1, *, c=None): ...
    def no_default(a, b, *, c=None): ...
    def extra_required(a, b=1, *, c=None, d): ...
    def fine(a, b=1, e=2, *, c=None, d=3): ...

    for bad in (renamed, no_default, extra_required):
        with pytest.raises(AssertionError):
            assert_compatible(std, bad, bad.__name__)
    assert_compatible(std, fine, "fine")
