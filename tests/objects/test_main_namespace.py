"""Functions and classes of the main script: by reference, by-value fallback, one namespace.

In-process: a "driver" namespace pickles, a "worker" namespace (another process's, as far
as ``_mainref`` can tell) unpickles. The real processes are in
``compat/test_compat_main_module.py``. Every test runs twice: with the stdlib's pickler
first (what dpool does; ``_byvalue`` makes the fallbacks of plain functions) and with
cloudpickle's only (what it does for everything the stdlib's cannot take): the two must
behave the same.
"""

from __future__ import annotations

import builtins
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from dpool.errors import SerializationError
from dpool.objects import _byvalue, _mainref, _serialization
from dpool.objects._serialization import deserialize, dumps, serialize

PROGRAM = """
import threading

def init(tag):
    global MODEL
    MODEL = "model-" + tag

def task(x):
    return (MODEL, x)

def is_even(n):
    return True if n == 0 else is_odd(n - 1)

def is_odd(n):
    return False if n == 0 else is_even(n - 1)

class Holder:
    lock = threading.Lock()

    @classmethod
    def describe(cls):
        return cls.__name__

    def method(self):
        return ("method", MODEL)
"""


def _namespace(src: str = "") -> dict:
    ns: dict = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(textwrap.dedent(src), "<prog>", "exec"), ns)  # noqa: S102
    return ns


class Link:
    """Pickle as the driver, unpickle as a worker (another process: another token)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, driver: dict, worker: dict) -> None:
        self.driver, self.worker = driver, worker
        monkeypatch.setattr(_mainref, "_shipped", {})
        monkeypatch.setattr(_mainref, "_tables", {})
        monkeypatch.setattr(_mainref, "_worker_ns", None)
        _mainref.adopt(worker)  # as at the worker's start
        _mainref._worker_ns = None
        self.token = _mainref._TOKEN
        monkeypatch.setattr(_mainref, "_TOKEN", self.token)  # restored after the test

    def send(self, obj: Any) -> Any:
        _mainref._worker_ns = self.driver
        try:
            payload = dumps(obj)
            _mainref._worker_ns = self.worker
            _mainref._TOKEN = b"another process"
            return deserialize(payload)
        finally:
            _mainref._worker_ns = None
            _mainref._TOKEN = self.token


@pytest.fixture(autouse=True, params=["stdlib", "cloudpickle"])
def pickler(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "cloudpickle":
        monkeypatch.setattr(_serialization, "_first_pickler", _serialization._cloud_pickler)
    return str(request.param)


@pytest.fixture
def link(monkeypatch: pytest.MonkeyPatch) -> Callable[[dict, dict], Link]:
    return lambda driver, worker: Link(monkeypatch, driver, worker)


def test_found_by_name_in_the_worker(link: Any) -> None:
    driver, worker = _namespace(PROGRAM), _namespace(PROGRAM)
    ln = link(driver, worker)
    assert ln.send(driver["task"]) is worker["task"]
    assert ln.send(driver["Holder"]) is worker["Holder"]  # holds a lock: never pickled
    assert ln.send(driver["Holder"].describe)() == "Holder"
    init, initargs = ln.send((driver["init"], ("a",)))
    init(*initargs)
    assert ln.send(driver["task"])(1) == ("model-a", 1)


def test_missing_in_the_worker_comes_by_value_into_its_namespace(link: Any) -> None:
    driver, worker = _namespace(PROGRAM), _namespace()
    ln = link(driver, worker)
    init = ln.send(driver["init"])
    task = ln.send(driver["task"])  # a separate payload, as a task after the initializer
    assert init.__globals__ is worker and task.__globals__ is worker
    init("b")
    assert task(2) == ("model-b", 2)
    assert worker["task"] is task and worker["init"] is init  # the worker's main has them
    assert ln.send(driver["task"]) is task  # found by name from now on
    is_even = ln.send(driver["is_even"])  # mutual recursion, both by value
    assert is_even(10) is True and worker["is_odd"](3) is True
    lam = ln.send(lambda: 3)  # a lambda of this module, not of the main namespace
    assert lam.__globals__ is not worker and lam() == 3


def test_lambdas_of_the_main_namespace_share_it(link: Any) -> None:
    driver, worker = _namespace(PROGRAM + "\nN = 1\nget = lambda: (N, task(0))\n"), _namespace()
    ln = link(driver, worker)
    ln.send(driver["init"])("c")
    assert ln.send(driver["get"])() == (1, ("model-c", 0))
    # A global the driver shipped and the worker did not change follows the driver ...
    exec("N = 2\nget2 = lambda: N", driver)  # noqa: S102
    assert ln.send(driver["get2"])() == 2
    # ... but once the worker assigned it, the worker's value stays.
    worker["N"] = 99
    exec("N = 3\nget3 = lambda: N", driver)  # noqa: S102
    assert ln.send(driver["get3"])() == 99
    # The initializer's state is never overwritten by the driver's (missing/None) value.
    exec("MODEL = None\nget4 = lambda: MODEL", driver)  # noqa: S102
    assert ln.send(driver["get4"])() == "model-c"


def test_the_drivers_newer_values_replace_those_the_worker_started_with(link: Any) -> None:
    driver = _namespace(PROGRAM + "\nSCALE = 1\nMODEL = None\n")
    worker = _namespace(PROGRAM + "\nSCALE = 1\nMODEL = None\n")  # fork / re-import
    ln = link(driver, worker)
    init = ln.send(driver["init"])
    assert init is worker["init"]
    init("f")  # the worker assigns MODEL itself
    exec("SCALE = 2\nget = lambda: (SCALE, MODEL)", driver)  # noqa: S102
    assert ln.send(driver["get"])() == (2, "model-f")
    assert worker["SCALE"] == 2  # one namespace: the script's functions see it too


def test_a_different_definition_in_the_worker_is_not_used(link: Any) -> None:
    driver = _namespace(PROGRAM)
    worker = _namespace(PROGRAM.replace("return (MODEL, x)", "return 'stale'"))
    ln = link(driver, worker)
    ln.send(driver["init"])("d")
    task = ln.send(driver["task"])
    assert task(4) == ("model-d", 4)
    assert worker["task"] is task


def test_bound_methods(link: Any) -> None:
    driver, worker = _namespace(PROGRAM), _namespace(PROGRAM)
    ln = link(driver, worker)
    ln.send(driver["init"])("e")
    method = ln.send(driver["Holder"]().method)
    assert method() == ("method", "model-e")
    assert type(method.__self__) is worker["Holder"]


def test_unpicklable_and_missing_is_a_clear_error(link: Any) -> None:
    driver, worker = _namespace(PROGRAM), _namespace()
    ln = link(driver, worker)
    with pytest.raises(SerializationError, match=r"'Holder'.*cannot pickle '_thread.lock'"):
        ln.send(driver["Holder"])


def test_same_process_gets_the_same_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = _namespace(PROGRAM)
    monkeypatch.setattr(_mainref, "_worker_ns", driver)
    ser = serialize([driver["task"], driver["Holder"]])
    assert ser.meta[0] == _mainref.TAG
    task, holder = deserialize(ser.meta, ser.buffers)
    assert task is driver["task"] and holder is driver["Holder"]


def test_payloads_without_main_objects_are_plain_pickles() -> None:
    assert serialize([1, "a", (2.0, None)]).meta[0] == 0x80
    assert dumps(test_payloads_without_main_objects_are_plain_pickles)[0] == 0x80
    assert pickle.loads(dumps(len)) is len


def test_a_late_payload_does_not_roll_back_a_newer_value(link: Any) -> None:
    driver, worker = _namespace("SCALE = 1\ndef f():\n    return SCALE\n"), _namespace()
    ln = link(driver, worker)
    _mainref._worker_ns = driver
    old = dumps(driver["f"])  # made once, sent to this worker later
    _mainref._worker_ns = None
    exec("SCALE = 2\nget = lambda: SCALE", driver)  # noqa: S102
    assert ln.send(driver["get"])() == 2
    _mainref._worker_ns = worker
    _mainref._TOKEN = b"another process"
    try:
        f = deserialize(old)
    finally:
        _mainref._worker_ns = None
        _mainref._TOKEN = ln.token
    assert f() == 2 and worker["SCALE"] == 2


def test_a_function_pickled_again_gives_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = _namespace("class C:\n    def m(self):\n        return 1\nobj = C()\n"
                        "lam = lambda: obj\n")
    monkeypatch.setattr(_mainref, "_worker_ns", driver)
    assert dumps(driver["obj"].m) == dumps(driver["obj"].m)  # deduplicated by bytes
    assert dumps(driver["lam"]) == dumps(driver["lam"])


def test_a_plain_functions_fallback_keeps_what_the_function_has(link: Any) -> None:
    driver = _namespace("""
        import math
        import xml.etree.ElementTree
        BASE = 10

        def f(x: int, y=2, *, z=3) -> int:
            "Doc."
            return math.floor(x) + y + z + BASE + len(xml.etree.ElementTree.tostring(
                xml.etree.ElementTree.Element("a")))
        f.tag = "t"
    """)
    ln = link(driver, _namespace())
    f = ln.send(driver["f"])
    assert f is not driver["f"] and f(1.5) == 1 + 2 + 3 + 10 + len(b"<a />")
    assert (f.__defaults__, f.__kwdefaults__, f.__doc__, f.tag) == ((2,), {"z": 3}, "Doc.", "t")
    assert f.__annotations__ == driver["f"].__annotations__
    assert (f.__name__, f.__qualname__, f.__module__) == ("f", "f", "__main__")
    slots = _byvalue.function_state(driver["f"])[1]
    assert list(slots["__globals__"]) == ["math", "BASE", "xml"]  # what the code reads
    assert sys.modules["xml.etree.ElementTree"] in slots["_cloudpickle_submodules"]


def test_the_stdlib_pickler_leaves_closures_and_local_classes_to_cloudpickle(
        link: Any, pickler: str) -> None:
    driver = _namespace("""
        def make(n):
            def add(x):
                return x + n
            return add

        def local_class():
            class Local:
                v = 7
            return Local

        add3 = make(3)
        Local = local_class()
    """)
    ln = link(driver, _namespace())
    assert ln.send(driver["add3"])(1) == 4  # a closure: by value through cloudpickle
    assert ln.send(driver["Local"]).v == 7
    with pytest.raises(_byvalue.NeedsCloudpickle):
        _byvalue.function_state(driver["add3"])


def test_a_short_program_does_not_import_cloudpickle() -> None:
    """A script's plain functions, lambdas and modules go by the stdlib's pickler, their
    fallbacks included; a closure loads cloudpickle."""
    code = textwrap.dedent("""
        import sys, math
        from dpool.objects._serialization import deserialize, dumps, serialize
        K = 2
        def f(x):
            return math.sqrt(x) * K
        g = lambda x: f(x) + 1
        ser = serialize([f, g, math])
        f2, g2, m2 = deserialize(ser.meta, ser.buffers)
        assert (f2(4), g2(4), m2) == (4.0, 5.0, math), (f2(4), g2(4), m2)
        print("cloudpickle" in sys.modules)
        def make(n):
            return lambda: n
        deserialize(dumps(make(1)))
        print("cloudpickle" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]
