"""``python -m dpool run script.py [args...]``: run an unmodified program on dpool.

Before the program starts, the stdlib's process pools are bound to dpool's:

- ``concurrent.futures.ProcessPoolExecutor`` (and ``concurrent.futures.process``'s),
- ``multiprocessing.pool.Pool`` -- which ``multiprocessing.Pool`` and every context's
  ``ctx.Pool(...)`` create (they import it on each call), so those give a ``dpool.Pool``
  bound to that context;
- ``multiprocessing.Manager()`` (every context's ``Manager`` method), which returns a
  started ``dpool.Manager()`` (``multiprocessing.managers``' classes stay the stdlib's):
  its server is an actor, on the embedded runtime or on the cluster, whose proxies work
  in tasks on any node.

The stdlib's own pool code refers to its ``Pool`` by that global name (``ThreadPool``
calls ``Pool.__init__``, the handler threads are ``Pool._handle_*``), so the name is not
simply replaced: it is bound to a subclass of the stdlib's ``Pool`` whose constructor
returns a ``dpool.Pool`` and which counts ``dpool.Pool`` instances as its own in
``isinstance``. ``ThreadPool``, ``multiprocessing.dummy`` and programs' own subclasses of
``Pool`` (which may override its internals) keep the stdlib's implementation.

The program then runs as ``python script.py`` would run it: as module ``__main__`` with
``__file__`` set, ``sys.argv == [script, *args]``, ``sys.path[0]`` the script's directory,
the same exit code, and tracebacks that start at the script's first frame (dpool's own
frames are hidden, as the interpreter hides its own). ``run -m module [args...]`` runs a
module as ``python -m module`` would.

``run --joblib ...`` (or ``DPOOL_JOBLIB=1``) also makes dpool joblib's default backend, so
``Parallel(...)`` and scikit-learn's ``n_jobs`` run on dpool where the program names no
backend (``dpool.register_joblib(make_default=True)``). Without it joblib is untouched.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import io
import logging
import os
import runpy
import sys
import types
from typing import Any, Optional

log = logging.getLogger("dpool.run")

USAGE = ("usage: python -m dpool run [--joblib] [--progress] (script.py | -m module) "
         "[args...]")

_YES = ("1", "true", "yes", "on")
_NO = ("", "0", "false", "no", "off")


def bind_stdlib() -> None:
    """Make the stdlib's process-pool names create dpool's classes (in this process)."""
    import concurrent.futures
    import concurrent.futures.process
    import multiprocessing.pool

    import dpool

    ours: Any = dpool.ProcessPoolExecutor
    concurrent.futures.ProcessPoolExecutor = ours  # type: ignore[misc]
    concurrent.futures.process.ProcessPoolExecutor = ours  # type: ignore[misc]
    std_pool = multiprocessing.pool.Pool
    if not getattr(std_pool, "_dpool_bound", False):
        multiprocessing.pool.Pool = _bound_pool_class(std_pool, dpool.Pool)  # type: ignore[misc,assignment]
    import multiprocessing.context

    def Manager(self: Any) -> Any:  # noqa: N802 - the stdlib's name
        return dpool.Manager()

    Manager.__doc__ = "dpool.Manager(): a started SyncManager whose server is an actor"
    multiprocessing.context.BaseContext.Manager = Manager  # type: ignore[method-assign]
    # (``multiprocessing.Manager`` is the default context's method, bound at its import)
    default: Any = multiprocessing.context._default_context  # type: ignore[attr-defined]
    multiprocessing.Manager = default.Manager  # type: ignore[method-assign]
    log.debug("bound concurrent.futures.ProcessPoolExecutor, multiprocessing.pool.Pool and "
              "multiprocessing.Manager to dpool's")


def _bound_pool_class(std_pool: type, dpool_pool: type) -> type:
    """The class ``multiprocessing.pool.Pool`` is bound to (see the module docstring)."""
    both = (std_pool, dpool_pool)

    class _PoolType(type):
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, both)

        def __subclasscheck__(cls, sub: type) -> bool:
            return type.__subclasscheck__(cls, sub) or issubclass(sub, both)

    class Pool(std_pool, metaclass=_PoolType):  # type: ignore[valid-type,misc]
        __doc__ = std_pool.__doc__
        _dpool_bound = True

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            if cls is Pool:
                return dpool_pool(*args, **kwargs)
            return super().__new__(cls)  # a program's own subclass: the stdlib's pool

    Pool.__module__ = std_pool.__module__
    Pool.__qualname__ = std_pool.__qualname__
    return Pool


class _HideRunnerFrames:
    """``sys.excepthook`` that drops the frames above the program's first one."""

    def __init__(self, filename: str, previous: Any) -> None:
        self.filename = filename
        self.previous = previous

    def __call__(self, etype: type, value: BaseException, tb: Any) -> None:
        t = tb
        while t is not None and t.tb_frame.f_code.co_filename != self.filename:
            t = t.tb_next
        if t is not None:
            tb = t
        elif isinstance(value, SyntaxError) and value.filename == self.filename:
            tb = None  # the program did not compile: python shows no traceback either
        # The default hook prints value.__traceback__ when the exception has one.
        value.__traceback__ = tb
        self.previous(etype, value, tb)


def _program_name() -> str:
    orig = getattr(sys, "orig_argv", None)
    return orig[0] if orig else os.path.basename(sys.executable)


def run_path(path: str, args: list[str]) -> int:
    """Run the file ``path`` as ``__main__``; returns an exit status for a setup error.

    What the program raises (``SystemExit`` included) propagates to the caller.
    """
    abspath = os.path.abspath(path)
    if os.path.isdir(abspath) or _is_zip(abspath):
        # A directory or zip with a __main__.py: the interpreter's own rules apply.
        sys.argv[:] = [path, *args]
        sys.path[0] = abspath
        sys.excepthook = _HideRunnerFrames(os.path.join(abspath, "__main__.py"),
                                           sys.excepthook)
        runpy.run_path(abspath, run_name="__main__")
        return 0
    try:
        with io.open_code(abspath) as f:
            source = f.read()
    except OSError as exc:
        print(f"{_program_name()}: can't open file {abspath!r}: [Errno {exc.errno}] "
              f"{exc.strerror}", file=sys.stderr)
        return 2
    sys.excepthook = _HideRunnerFrames(abspath, sys.excepthook)
    sys.argv[:] = [path, *args]
    sys.path[0] = os.path.dirname(os.path.realpath(abspath))
    main = types.ModuleType("__main__")
    main.__file__ = abspath
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", abspath)
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    # multiprocessing aliased __mp_main__ to the __main__ of its import (this runner's):
    # point it at the program, as under python script.py (pickles name __mp_main__).
    sys.modules["__main__"] = sys.modules["__mp_main__"] = main
    code = compile(source, abspath, "exec", dont_inherit=True)
    exec(code, main.__dict__)  # noqa: S102 - running the user's program is the point
    return 0


def _is_zip(path: str) -> bool:
    import zipfile

    return os.path.isfile(path) and zipfile.is_zipfile(path)


def run_module(name: str, args: list[str]) -> int:
    """Run module ``name`` as ``python -m name`` would."""
    spec = importlib.util.find_spec(name) if name else None
    origin: Optional[str] = getattr(spec, "origin", None)
    if origin:
        sys.excepthook = _HideRunnerFrames(origin, sys.excepthook)
    sys.argv[:] = [name, *args]  # run_module replaces argv[0] with the file's path
    sys.path[0] = os.getcwd()
    runpy.run_module(name, run_name="__main__", alter_sys=True)
    return 0


def _joblib_wanted(argv: list[str]) -> Optional[bool]:
    """Whether ``--joblib`` (removed from ``argv``) or ``$DPOOL_JOBLIB`` asks for the joblib
    backend; None (after saying why) for a ``$DPOOL_JOBLIB`` that is neither yes nor no."""
    flag = bool(argv) and argv[0] == "--joblib"
    if flag:
        del argv[0]
    value = os.environ.get("DPOOL_JOBLIB", "").strip().lower()
    if value not in _YES and value not in _NO:
        print(f"{USAGE}\nDPOOL_JOBLIB must be 1 or 0, got {value!r}", file=sys.stderr)
        return None
    return flag or value in _YES


def use_joblib_backend() -> None:
    """Make dpool joblib's default backend (``run --joblib``)."""
    from dpool.integrations import register_joblib

    register_joblib(make_default=True)
    log.debug("joblib's default backend is dpool's")


def main(argv: list[str]) -> int:
    """``run`` with ``argv`` = what follows ``run`` on the command line."""
    argv = list(argv)
    show = bool(argv) and argv[0] == "--progress"  # a live line on stderr (observe._live)
    if show:
        del argv[0]
    wanted = _joblib_wanted(argv)
    if wanted is None:
        return 2
    if not show and argv and argv[0] == "--progress":
        show = True
        del argv[0]
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    if wanted:
        try:
            use_joblib_backend()
        except ImportError as exc:
            print(f"python -m dpool run --joblib: {exc}", file=sys.stderr)
            return 2
    bind_stdlib()
    if argv[0] == "-m" and len(argv) < 2:
        print(f"{USAGE}\n-m needs a module name", file=sys.stderr)
        return 2
    line = None
    if show:
        from dpool.observe import LiveLine

        line = LiveLine()
        line.start()
    try:
        if argv[0] == "-m":
            return run_module(argv[1], argv[2:])
        return run_path(argv[0], argv[1:])
    finally:
        if line is not None:
            line.stop()
