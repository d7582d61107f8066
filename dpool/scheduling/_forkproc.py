"""Worker processes under the ``fork`` start method, without multiprocessing's start-up cost.

A worker is a ``multiprocessing`` process (``ForkedWorker``, a ``ForkProcess``): in it,
``multiprocessing.current_process()`` is the worker, ``parent_process()`` the driver,
``get_start_method()`` says ``fork``, and its ``Process`` object in the driver behaves as
the stdlib's (``pid``, ``sentinel``, ``exitcode``, ``join``, ``kill``...). Only its start
differs: multiprocessing's fork ``Popen`` imports ``multiprocessing.util`` (and
``subprocess`` with it) in the driver, and its ``Process._bootstrap`` imports it again in
every child, where the worker needs none of it (bench/COLDSTART.md). Here ``_Popen`` forks
and ``_bootstrap`` sets the child up as multiprocessing's does -- the process identity,
stdin on ``/dev/null``, the after-fork hooks and exit functions of ``multiprocessing.util``
when the program loaded it -- without that import; ``_ZygotePopen`` has the fork server
(``_zygote``) fork the worker instead, while it is alive.

Only the stock ``fork`` context starts workers this way (``uses_light_fork``). It relies on
private names of ``multiprocessing.context``, ``multiprocessing.process`` and
``threading``: where one is missing, ``AVAILABLE`` is False and workers start through
multiprocessing's own ``Popen``. A started worker is taken out of multiprocessing's
children (``disown``): the runtime reaps it itself.
"""

from __future__ import annotations

import itertools
import os
import select
import signal
import sys
import threading
import weakref
from multiprocessing import context as _context_module
from multiprocessing import process as _process_module

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any

_context: Any = _context_module  # (private names, which typeshed does not list)
_process: Any = _process_module

__all__ = ["AVAILABLE", "ForkedWorker", "disown", "fork_server", "uses_light_fork"]

AVAILABLE = (
    hasattr(_context, "ForkProcess") and hasattr(_context, "_force_start_method")
    and all(hasattr(_process, n) for n in ("_current_process", "_parent_process",
                                           "_children", "_process_counter",
                                           "_ParentProcess"))
    and hasattr(threading, "_shutdown")
)


def uses_light_fork(ctx: object) -> bool:
    """Whether workers of an executor with multiprocessing context ``ctx`` start here:
    the stock ``fork`` context (not a subclass that may start processes its own way)."""
    return AVAILABLE and type(ctx) is getattr(_context, "ForkContext", None)


def fork_server() -> Any:
    """A fork server (``_zygote.Zygote``) for this process's workers, or None: where
    there are no pidfds, where ``fork`` is not the default start method (the workers of
    the default context would not use it), or where ``DPOOL_FORK_SERVER=0``."""
    if not AVAILABLE or os.environ.get("DPOOL_FORK_SERVER", "1") == "0":
        return None
    default = _context._default_context  # what ``get_context()`` gives, without fixing it
    actual = getattr(default, "_actual_context", None) or \
        getattr(default, "_default_context", None)
    if type(actual) is not getattr(_context, "ForkContext", None):
        return None
    from dpool.scheduling import _zygote

    if not _zygote.usable():
        return None
    from dpool.objects import mainref as _mainref

    _mainref.mark_fork_point()
    return _zygote.Zygote()


def single_threaded() -> bool:
    """Whether this process runs one thread (as the kernel counts them: C libraries'
    too), where a ``fork()`` copies every thread there is."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # num_threads: the 20th field; the fields after the command name start at 3rd
        return int(stat[stat.rindex(b")") + 2:].split()[17]) == 1
    except (OSError, ValueError, IndexError):
        return False


def disown(proc: Any) -> None:
    """Take a started worker out of multiprocessing's list of this process's children.

    The runtime reaps and stops its workers itself. Left in that list, they are joined by
    ``multiprocessing.util``'s exit hook, which is registered when that module is first
    imported -- by a spawn worker's start or by the program's own ``multiprocessing.Queue``,
    after the runtime registered its own exit hook -- so it runs first and waits forever
    for workers that end only when the runtime's hook stops them: the program would hang
    at exit. It also keeps ``active_children()`` from reaping a worker's pid behind the
    runtime's back (two waiters on one pid race)."""
    children = getattr(_process, "_children", None)
    if children is not None:
        children.discard(proc)


def flush_std_streams() -> None:
    """Before a fork: or the child would write this process's buffered output again."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (AttributeError, ValueError, OSError):
            pass


def _close_fds(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class _PopenBase:
    """What both Popens below share: multiprocessing's fork ``Popen`` interface, as
    ``BaseProcess`` uses it, around ``_send_signal``, ``finalizer``."""

    method = "fork"
    finalizer: Any

    def duplicate_for_child(self, fd: int) -> int:
        return fd

    def _send_signal(self, sig: int) -> None:
        raise NotImplementedError

    def terminate(self) -> None:
        self._send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self._send_signal(signal.SIGKILL)

    def close(self) -> None:
        self.finalizer()


class _Popen(_PopenBase):
    """multiprocessing's fork ``Popen``: this process forks the worker."""

    def __init__(self, process_obj: "ForkedWorker") -> None:
        flush_std_streams()  # or the child would write the parent's buffered output again
        self.returncode: int | None = None
        # the child reads EOF on its parent sentinel when the driver is gone; the driver's
        # sentinel (``parent_r``) is readable once the child has ended
        parent_r, child_w = os.pipe()
        child_r, parent_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                os.close(parent_r)
                os.close(parent_w)
                code = _bootstrap(process_obj, child_r)
            finally:
                os._exit(code)
        os.close(child_w)
        os.close(child_r)
        self.sentinel = parent_r
        self.finalizer = weakref.finalize(self, _close_fds, parent_r, parent_w)

    def poll(self, flag: int = os.WNOHANG) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, flag)
            except OSError:  # not a child of ours (any more)
                return None
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if self.returncode is None:
            if timeout is not None:
                poller = select.poll()
                poller.register(self.sentinel, select.POLLIN)
                if not poller.poll(max(0, int(timeout * 1000 + 0.999))):
                    return None
            return self.poll(os.WNOHANG if timeout == 0.0 else 0)
        return self.returncode

    def _send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass
            except OSError:
                if self.wait(timeout=0.1) is None:
                    raise


class _ZygotePopen(_PopenBase):
    """A worker forked by the fork server (``_zygote``), as ``BaseProcess`` uses a Popen.

    ``sentinel`` is the worker's pidfd (readable once it ended); signals go through it, so
    never to a later process given the same pid; the exit code is the zygote's report."""

    def __init__(self, process_obj: Any, zygote: Any) -> None:
        from dpool.scheduling._zygote import FdArg

        flush_std_streams()
        self.returncode: int | None = None
        fds: list[int] = []
        args = []
        for a in process_obj._args:
            if hasattr(a, "detach") and hasattr(a, "fileno"):  # a socket: its descriptor
                args.append(FdArg(len(fds)))
                fds.append(a.fileno())
            else:
                args.append(a)
        stdio: list[int | None] = []
        for fd in (1, 2):  # where the driver's output goes now (a redirect, a capture)
            try:
                os.fstat(fd)
            except OSError:
                stdio.append(None)
                continue
            stdio.append(len(fds))
            fds.append(fd)
        try:
            cwd = os.getcwd()
        except OSError:
            cwd = "."
        request = (process_obj.name, process_obj._identity,
                   _process.current_process().name, dict(os.environ), cwd, tuple(stdio),
                   process_obj._target, tuple(args))
        self.pid, self.sentinel = zygote.spawn(request, fds)
        self._zygote = zygote
        self._lock = threading.Lock()  # the report is read once: by the first waiter
        self.finalizer = weakref.finalize(self, _close_fds, self.sentinel)

    def _ended(self, timeout: float | None) -> bool:
        poller = select.poll()
        poller.register(self.sentinel, select.POLLIN)
        wait_ms = -1 if timeout is None else max(0, int(timeout * 1000 + 0.999))
        return bool(poller.poll(wait_ms))

    def poll(self, flag: int = os.WNOHANG) -> int | None:
        return self.wait(0.0 if flag == os.WNOHANG else None)

    def wait(self, timeout: float | None = None) -> int | None:
        if self.returncode is None and self._ended(timeout):
            with self._lock:  # it ended: the zygote reaps it and reports within moments
                if self.returncode is None:
                    self.returncode = self._zygote.exitcode(self.pid, None)
        return self.returncode

    def _send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self.sentinel, sig)  # type: ignore[attr-defined]
            except ProcessLookupError:
                pass


_fallback_logged = False


def _start(process_obj: Any) -> Any:
    """The Popen of a new worker: from the fork server when the process has one (and it
    is still there), else forked here."""
    global _fallback_logged
    zygote = getattr(process_obj, "_dpool_zygote", None)
    if zygote is not None and zygote.alive:
        try:
            return _ZygotePopen(process_obj, zygote)
        except OSError as exc:
            if zygote.alive:  # out of memory or processes: no fork would do better now
                raise
            if not _fallback_logged:
                _fallback_logged = True
                from dpool import _log

                _log.getLogger("dpool.scheduling").warning(
                    "dpool: the fork server is gone (%s): workers are forked by this "
                    "process from now on", exc)
    return _Popen(process_obj)


if AVAILABLE:
    class ForkedWorker(_context.ForkProcess):  # type: ignore[name-defined,misc]
        """A ``multiprocessing`` fork process started by ``_Popen`` (forked here) or
        ``_ZygotePopen`` (by the fork server, when ``_dpool_zygote`` names one)."""

        _dpool_zygote = None

        @staticmethod
        def _Popen(process_obj: "ForkedWorker") -> Any:  # type: ignore[override]
            return _start(process_obj)
else:  # pragma: no cover - a Python without the private names above
    ForkedWorker = None  # type: ignore[assignment,misc]


def _bootstrap(proc: Any, parent_sentinel: int) -> int:
    """In the child: become ``proc`` as multiprocessing's ``BaseProcess._bootstrap`` does,
    run it, return its exit code."""
    util = sys.modules.get("multiprocessing.util")  # loaded only if the program uses it
    exitcode = 1
    try:
        _context._force_start_method("fork")
        _process._process_counter = itertools.count(1)
        _process._children = set()
        if sys.stdin is not None:  # as multiprocessing: the child does not read the terminal
            try:
                sys.stdin.close()
                sys.stdin = open(os.devnull)
            except (OSError, ValueError):
                pass
        old = _process._current_process
        _process._current_process = proc
        _process._parent_process = _process._ParentProcess(
            proc._parent_name, proc._parent_pid, parent_sentinel)
        if getattr(threading, "_HAVE_THREAD_NATIVE_ID", False):
            threading.main_thread()._set_native_id()  # type: ignore[attr-defined]
        try:
            if util is not None:  # what the program's multiprocessing objects need after fork
                util._finalizer_registry.clear()
                util._run_after_forkers()
        finally:
            del old  # finalized only after the after-fork hooks, as multiprocessing does
        try:
            proc.run()
            exitcode = 0
        finally:
            util = sys.modules.get("multiprocessing.util")  # the task may have loaded it
            if util is not None:
                util._exit_function()
    except SystemExit as e:
        if e.code is None:
            exitcode = 0
        elif isinstance(e.code, int):
            exitcode = e.code
        else:
            sys.stderr.write(str(e.code) + "\n")
            exitcode = 1
    except BaseException:  # noqa: BLE001 - reported, as multiprocessing does
        exitcode = 1
        import traceback

        sys.stderr.write(f"Process {proc.name}:\n")
        traceback.print_exc()
    finally:
        threading._shutdown()  # type: ignore[attr-defined]
        flush_std_streams()
    return exitcode
