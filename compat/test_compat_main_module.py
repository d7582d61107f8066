"""Functions and classes of the main script in the workers, as with the stdlib.

The stdlib pickles ``__main__`` objects by name; the worker finds them in its main module
(the parent's under ``fork``; the script re-imported as ``__mp_main__`` under ``spawn``
and ``forkserver``). So the script's functions share its globals in the worker: the
per-worker state idiom (an initializer sets ``global MODEL``, tasks read it) works, and a
class whose body holds a lock is sent by name. dpool must behave the same, and fall back
to by-value (sharing that one namespace) where the stdlib fails: lambdas, functions
defined after the worker started, and ``python -c`` under ``spawn``/``forkserver``
(compat/DIFFERENCES.md, "Functions and classes of the main script").

Each scenario is a program run in a subprocess: as ``python prog.py``, as
``python -m dpool run prog.py`` and as ``python -c``, with the stdlib's classes and with
dpool's, under each start method; they print one line per observation.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 120
METHODS = ("fork", "spawn", "forkserver")

PROGRAM = textwrap.dedent('''
    import sys
    import threading


    def init(tag):
        global MODEL  # MODEL exists only once the initializer ran
        MODEL = "model-" + tag


    def task(x):
        return (MODEL, x)


    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)


    SCALE = 1


    class Holder:
        lock = threading.Lock()  # this class cannot be pickled by value

        @classmethod
        def describe(cls):
            return (cls.__name__, cls.lock.locked(), MODEL)


    LOCK = threading.Lock()


    def locked():
        with LOCK:  # a global that cannot be pickled
            return "locked-ok"


    class Point:
        def __init__(self, x):
            self.x = x


    def make_point(x):
        return Point(x)


    class MainError(Exception):
        pass


    def fail(x):
        raise MainError(x)


    def step(label, fn):
        try:
            print(label, repr(fn()), flush=True)
        except BaseException as exc:
            print(label, "raised", type(exc).__name__, flush=True)


    if __name__ == "__main__":
        method, parts = sys.argv[1], sys.argv[2]
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        ctx = multiprocessing.get_context(method)
        if sys.argv[3:] == ["dpool"]:
            from dpool import Pool, ProcessPoolExecutor
            pool = lambda *a, **k: Pool(*a, context=ctx, **k)
        else:  # the stdlib's, or dpool's under python -m dpool run
            pool = lambda *a, **k: ctx.Pool(*a, **k)
        on_dpool = ProcessPoolExecutor.__module__.startswith("dpool")
        step("mp-main-alias", lambda: sys.modules["__mp_main__"] is sys.modules["__main__"])
        with ProcessPoolExecutor(1, mp_context=ctx, initializer=init,
                                 initargs=("a",)) as ex:
            step("initializer-global", lambda: ex.submit(task, 1).result())
            step("recursion", lambda: ex.submit(fact, 5).result())
            step("global-lock", lambda: ex.submit(locked).result())
            step("instance-back", lambda: type(ex.submit(make_point, 2).result()) is Point)

            def raises():
                try:
                    ex.submit(fail, 3).result()
                except MainError as exc:
                    return ("MainError", exc.args)
            step("exception-back", raises)

            def later(x):  # defined after the worker started
                return ("later", MODEL, x)
            step("defined-after-start", lambda: ex.submit(later, 4).result())
            if on_dpool:
                step("lambda", lambda: ex.submit(lambda: (MODEL, fact(3))).result())
                SCALE = 2  # the worker started with 1
                step("lambda-global", lambda: ex.submit(lambda: SCALE).result())
        if parts == "all":
            with pool(1, initializer=init, initargs=("b",)) as p:
                step("pool-classmethod", lambda: p.apply(Holder.describe))
                step("pool-map", lambda: p.map(task, [5, 6]))
        print("done")
''')

# What the stdlib prints for a script (every start method; under fork for python -c too).
STDLIB = {
    "mp-main-alias": "True",  # multiprocessing's alias of the main module, for unpickling
    "initializer-global": "('model-a', 1)",
    "recursion": "120",
    "global-lock": "'locked-ok'",
    "instance-back": "True",
    "exception-back": "('MainError', (3,))",
    "defined-after-start": "raised BrokenProcessPool",  # not in the worker's main module
    "pool-classmethod": "('Holder', False, 'model-b')",
    "pool-map": "[('model-b', 5), ('model-b', 6)]",
}
# Where dpool does better (DIFFERENCES.md): by value, in the same namespace.
DPOOL = {**STDLIB, "defined-after-start": "('later', 'model-a', 4)",
         "lambda": "('model-a', 6)", "lambda-global": "2"}


def _run(tmp_path: Path, how: str, method: str, parts: str, *extra: str) -> dict[str, str]:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    if how == "script":
        args = [str(script), method, parts, *extra]
    elif how == "dpool run":
        args = ["-m", "dpool", "run", str(script), method, parts, *extra]
    elif how == "dpool run -m":
        args = ["-m", "dpool", "run", "-m", "prog", method, parts, *extra]
    else:
        args = ["-c", PROGRAM, method, parts, *extra]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=TIMEOUT, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "done", proc.stdout + proc.stderr
    return dict(line.split(" ", 1) for line in lines[:-1])


@pytest.mark.parametrize("method", METHODS)
def test_main_script(tmp_path: Path, method: str) -> None:
    """``python prog.py`` with each implementation, and ``python -m dpool run prog.py``
    (and ``run -m prog``, which the workers re-import by module name)."""
    assert _run(tmp_path, "script", method, "all") == STDLIB
    assert _run(tmp_path, "script", method, "all", "dpool") == DPOOL
    assert _run(tmp_path, "dpool run", method, "all") == DPOOL
    assert _run(tmp_path, "dpool run -m", method, "all") == {
        **DPOOL, "mp-main-alias": "False"}  # DIFFERENCES.md, known limitations


@pytest.mark.parametrize("method", METHODS)
def test_python_c(tmp_path: Path, method: str) -> None:
    """``python -c``: the main module has no file, so spawn and forkserver workers cannot
    re-import it. The stdlib then fails every call (the initializer cannot be unpickled,
    each worker dies: ``BrokenProcessPool``; its ``Pool`` would respawn dying workers
    forever, so only its executor runs here). dpool sends everything by value into one
    namespace; only what cannot be pickled by value (a lock) fails, for that call."""
    if method == "fork":
        assert _run(tmp_path, "-c", method, "all") == STDLIB
        assert _run(tmp_path, "-c", method, "all", "dpool") == DPOOL
        return
    executor_steps = ("initializer-global", "recursion", "global-lock", "instance-back",
                      "exception-back", "defined-after-start")
    assert _run(tmp_path, "-c", method, "executor") == {
        "mp-main-alias": "True", **{step: "raised BrokenProcessPool" for step in executor_steps}}
    assert _run(tmp_path, "-c", method, "all", "dpool") == {
        **DPOOL, "global-lock": "raised DeserializationError",
        "pool-classmethod": "raised DeserializationError"}
