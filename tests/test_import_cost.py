"""What a short program pays before its first result: no module it does not need.

``from dpool import ProcessPoolExecutor`` (and ``Pool``) must not load what only the
cluster, large objects or a nested call need (issue 21: the cold start was twice the
stdlib's). Checked by module name in a fresh interpreter, never by time; timings live in
``bench/coldstart.py``. And ``@record`` classes -- what keeps the wire messages cheap to
create -- behave as the ``@dataclass`` classes they replace.
"""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any, ClassVar, Optional

import pytest

from dpool.protocol._record import Slotted, field, record

# Loaded on first use only: what only large objects (shared memory) or process
# inspection need (made lazy for issue 21), numpy, the cluster's modules and clients,
# placement strategies, and pickling by value.
DENIED = (
    "psutil", "posix_ipc", "ctypes", "numpy", "redis", "hiredis",
    "dpool.cli", "dpool.node", "dpool.global_scheduler", "dpool.transfer",
    "dpool.worker", "dpool.testing", "dpool.runtime._cluster", "dpool.runtime._address",
    "dpool.control._redis", "dpool.control._redis_batch", "dpool.control._watch",
    "dpool.control._keys", "dpool.scheduling._detect", "dpool.objects._inline",
    "dpool.placement",  # (where a task runs: only a strategy or a placement group needs it)
    # what only a closure, a class made in a function... needs (cloudpickle, and what it
    # imports), and ``@dataclass`` (``@record`` instead)
    "cloudpickle", "dataclasses", "inspect", "ast", "platform",
    # what the stdlib's executor imports and a worker's start does without: the module of
    # BrokenProcessPool (multiprocessing's connections, queues, utilities, subprocess),
    # multiprocessing's fork Popen (``scheduling._forkproc`` instead), files on disk
    # (spilling), and the bytecode disassembler (``_byvalue`` reads globals itself)
    "concurrent.futures.process", "multiprocessing.connection", "multiprocessing.queues",
    "multiprocessing.util", "multiprocessing.popen_fork", "subprocess", "tempfile",
    "shutil", "dis",
    # typing: annotations are strings (``from __future__ import annotations``) and the
    # names they use are imported under ``TYPE_CHECKING`` (which is False at run time)
    "typing",
    # the cluster's wire messages (``_messages`` loads them when one is first used)
    "dpool.protocol._messages_cluster",
    # placement groups' bundles (the first one held loads it)
    "dpool.scheduling._bundle_ledger",
    # the shared-memory store's machinery: writing, mapping, recycling segments, and its
    # accounting (the first stored value loads them; ``_owners`` names and reaps)
    "dpool.objects._segment", "dpool.objects._mapping", "dpool.objects._writemaps",
    "dpool.objects._recycle", "dpool.objects._accounting", "dpool.objects._forkguard",
    # an extension module (loading its shared library: ~1.6 M instructions) that only the
    # store's mappings use (a channel's read buffer is a bytearray)
    "mmap",
    # the cache of large array arguments (made once numpy is loaded) and ``no_rebuild``
    "dpool.runtime._argcache", "dpool.runtime._rebuild",
)
# ``multiprocessing.Pool``'s programs load neither; nor does ``dpool.Pool`` (its futures
# are ``TaskFuture``s, its loggers load ``logging`` when a record is due: ``dpool._log``);
# nor what ``multiprocessing.Pool`` loads and ``dpool.Pool`` does without: ``traceback``
# (and ``linecache``, ``tokenize``, ``textwrap``: a task's error is formatted when one
# fails), ``queue`` (the C ``SimpleQueue`` is ``_queue``'s), ``zlib`` (``_mainref``'s
# function digests are arithmetic)
POOL_DENIED = ("concurrent", "logging", "string", "traceback", "linecache", "tokenize",
               "textwrap", "queue", "heapq", "zlib")
PRELOADED = {"dpool.worker", "dpool.worker._main", "dpool.worker._watchdog"}


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)
                          + "\nimport sys; print('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, timeout=60, check=True)
    return set(out.stdout.split())


_startup: set[str] = set()


def _denied(loaded: set[str], name: str) -> list[str]:
    """The denied modules in ``loaded`` that the interpreter's own start-up does not load
    (3.13's loads ``linecache``, whatever the program is)."""
    if not _startup:
        _startup.update(_loaded_after("pass"))
    denied = DENIED + (POOL_DENIED if name == "Pool" else ())
    return sorted(m for m in loaded - _startup
                  if any(m == d or m.startswith(d + ".") for d in denied))


@pytest.mark.parametrize("name", ["ProcessPoolExecutor", "Pool"])
def test_importing_the_pool_classes_loads_nothing_denied(name):
    loaded = _loaded_after(f"from dpool import {name}")
    assert f"dpool.{'executor' if name == 'ProcessPoolExecutor' else 'pool'}" in loaded
    assert not _denied(loaded, name), _denied(loaded, name)


_FIRST_TASK = {
    "ProcessPoolExecutor":
        "with ProcessPoolExecutor(2) as ex: in_worker = ex.submit(modules).result()",
    "Pool": "with Pool(2) as p: in_worker = p.apply(modules)",
}


@pytest.mark.parametrize("name", ["ProcessPoolExecutor", "Pool"])
def test_a_first_task_loads_nothing_denied_in_the_driver_or_the_worker(name):
    """Submit, result, shutdown: the driver and its (forked) worker load none of them
    either (the worker's own modules, dpool.worker, aside)."""
    loaded = _loaded_after(f"""
        import sys
        from dpool import {name}

        def modules():
            return sorted(sys.modules)

        if __name__ == "__main__":
            {_FIRST_TASK[name]}
            print("\\n".join("worker:" + m for m in in_worker))
    """)
    driver = {m for m in loaded if not m.startswith("worker:")}
    worker = {m[len("worker:"):] for m in loaded if m.startswith("worker:")}
    assert "dpool.runtime._driver" in driver and "dpool.worker._main" in worker
    # the worker's own code is loaded in the driver before it forks workers
    # (``_startup.preload_worker``): each child finds it there; the rest of it is not
    assert PRELOADED <= driver
    assert not _denied(driver - PRELOADED, name), _denied(driver - PRELOADED, name)
    ours = {m for m in worker if m == "dpool.worker" or m.startswith("dpool.worker.")}
    assert not _denied(worker - ours, name), _denied(worker - ours, name)


# -- @record behaves as @dataclass --------------------------------------------------------
def _rec_class(field: Callable[..., Any], base: type = object) -> type:
    class Rec(base):  # type: ignore[valid-type,misc]
        """A record."""

        CODE: ClassVar[int] = 7
        a: int
        b: Optional[bytes]
        c: tuple = ()
        d: list = field(default_factory=list)

    return Rec


@pytest.mark.parametrize("how", ["slots", "no slots", "Slotted"])
def test_a_record_is_what_a_dataclass_would_be(how):
    slots = how != "no slots"
    if how == "Slotted":  # made once, by the base's metaclass (the wire messages)
        cheap = _rec_class(field, Slotted)
    else:
        cheap = record(slots=slots)(_rec_class(field))
    real = dataclasses.dataclass(slots=slots)(_rec_class(dataclasses.field))
    assert cheap.__match_args__ == real.__match_args__ == ("a", "b", "c", "d")
    assert cheap.CODE == 7 and cheap.__doc__ == "A record."
    assert cheap.__hash__ is None and real.__hash__ is None
    if slots:
        assert cheap.__slots__ == real.__slots__ == ("a", "b", "c", "d")
        assert not hasattr(cheap(1, None), "__dict__")
    else:
        assert cheap.c == real.c == ()  # a plain default stays a class attribute
        assert "d" not in cheap.__dict__ and "d" not in real.__dict__
    x, y = cheap(1, b"x"), real(1, b"x")
    assert repr(x) == repr(y) and repr(x).endswith("Rec(a=1, b=b'x', c=(), d=[])")
    assert str(inspect.signature(cheap)) == str(inspect.signature(real))
    assert x == cheap(1, b"x") and x != cheap(2, b"x") and x != y  # another class
    assert x.d is not cheap(1, b"x").d  # a fresh list each time
    assert cheap(a=1, b=None, c=(2,), d=[3]) == cheap(1, None, (2,), [3])
    nan = float("nan")
    # before 3.13 tuples of fields are compared (identity first); from 3.13 field by field
    assert (cheap(nan, None) == cheap(nan, None)) is (real(nan, None) == real(nan, None)) \
        is (sys.version_info < (3, 13))
    for cls in (cheap, real):
        assert cls(float("nan"), None) != cls(float("nan"), None)
    with pytest.raises(TypeError) as cheap_error:
        cheap(1, None, (), [], 5)
    with pytest.raises(TypeError) as real_error:
        real(1, None, (), [], 5)
    assert str(cheap_error.value) == str(real_error.value)


@pytest.mark.parametrize("slots", [True, False])
def test_a_record_without_factories_inits_as_a_dataclass(slots):
    """Its ``__init__`` comes from a precompiled template of its arity (``_record``): the
    same signature, defaults, keywords and argument errors as the dataclass's."""

    def make(decorator: Callable[..., Any]) -> type:
        @decorator
        class Pt:
            x: int
            y: Optional[int]
            label: str = "p"
            tag: tuple = ()

        return Pt

    cheap, real = make(record(slots=slots)), make(dataclasses.dataclass(slots=slots))
    for args, kwargs in [((1, 2), {}), ((1, None, "q"), {}), ((1,), {"y": 3, "tag": (4,)}),
                         ((), {"x": 1, "y": 2, "label": "z"})]:
        assert repr(cheap(*args, **kwargs)).split("Pt(")[1] == \
            repr(real(*args, **kwargs)).split("Pt(")[1]
        assert cheap(*args, **kwargs) == cheap(*args, **kwargs)
    assert str(inspect.signature(cheap)) == str(inspect.signature(real))  # (once made)
    for args, kwargs in [((1, 2, 3, 4, 5), {}), ((1,), {}), ((1, 2), {"z": 0}),
                         ((1, 2), {"x": 0})]:
        with pytest.raises(TypeError) as cheap_error:
            cheap(*args, **kwargs)
        with pytest.raises(TypeError) as real_error:
            real(*args, **kwargs)
        assert str(cheap_error.value) == str(real_error.value)
    assert cheap.__init__.__qualname__ == real.__init__.__qualname__
    empty = record(slots=slots)(type("Empty", (), {"__annotations__": {}}))
    assert repr(empty()) == "Empty()"


@pytest.mark.parametrize("slots", [True, False])
def test_a_record_with_init_false_keeps_its_own_init(slots):
    @record(slots=slots, init=False)
    class Cfg:
        a: int
        b: list = field(default_factory=list)

        def __init__(self, a: int) -> None:
            self.a = a
            self.b = [a]

    x = Cfg(3)
    assert (x.a, x.b) == (3, [3]) and repr(x).endswith("Cfg(a=3, b=[3])")
    assert x == Cfg(3) and x != Cfg(4) and Cfg.__match_args__ == ("a", "b")
    assert hasattr(x, "__dict__") != slots
    with pytest.raises(TypeError):
        Cfg(1, [])  # its own signature, not the fields'


@pytest.mark.parametrize("make", [
    lambda: __import__("dpool.scheduling._records", fromlist=["WorkerGroup"]).WorkerGroup(
        1, 2, None, None, None, 3),
    lambda: __import__("dpool.protocol._startup", fromlist=["WorkerConfig"]).WorkerConfig(
        1, 2, 3),
], ids=["WorkerGroup", "WorkerConfig"])
def test_a_hand_written_record_init_gives_each_field_its_declared_default(make):
    """``WorkerGroup`` and ``WorkerConfig`` write their own ``__init__`` (``init=False``): a field
    added to the class but not to it would be missing, or keep another default."""
    from dpool.protocol import _record

    x = make()
    names, defaults, factories = _record._SPECS[type(x)]
    given = 6 if type(x).__name__ == "WorkerGroup" else 3
    for n in names[given:]:
        expected = factories[n]() if n in factories else defaults[n]
        assert getattr(x, n) == expected and type(getattr(x, n)) is type(expected), n
    if factories:
        assert all(getattr(x, n) is not getattr(make(), n) for n in factories)  # fresh


def test_the_wire_messages_pickle_and_compare_as_before():
    from dpool.protocol import _messages as m

    for cls in m.ALL_MESSAGES:
        names = cls.__slots__
        msg = cls(*range(len(names)))
        assert [getattr(msg, n) for n in names] == list(range(len(names)))
        assert pickle.loads(pickle.dumps(msg)) == msg
        assert repr(msg) == f"{cls.__qualname__}(" + ", ".join(
            f"{n}={i!r}" for i, n in enumerate(names)) + ")"
    assert m.FetchSegment(6, "/x") == m.FetchSegment(6, "/x", 0, -1)
    assert m.SubmitTask(1, 2, None, None, 3).req is None


def test_a_failed_pool_task_loads_no_concurrent_futures():
    """A ``Pool``'s error gets ``multiprocessing.pool.RemoteTraceback`` as its cause, the
    stdlib's, without the executor's class (``concurrent.futures.process``, and most of
    ``multiprocessing`` with it) being loaded on the way."""
    loaded = _loaded_after("""
        import sys
        from dpool import Pool

        def bad(x):
            raise ValueError(x)

        if __name__ == "__main__":
            with Pool(1) as p:
                try:
                    p.apply(bad, (1,))
                except ValueError as exc:
                    import multiprocessing.pool
                    assert type(exc.__cause__) is multiprocessing.pool.RemoteTraceback
                    assert 'ValueError: 1' in str(exc.__cause__)
    """)
    assert "multiprocessing.pool" in loaded
    assert not [m for m in loaded if m == "concurrent" or m.startswith("concurrent.")]
