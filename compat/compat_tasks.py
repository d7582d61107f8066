"""Functions and objects the compat scenarios send to worker processes.

They live in an importable module (not in the test files) so that the stdlib pools,
which pickle functions by reference, can run them too. The failure-injection classes
follow CPython's ``test_concurrent_futures/test_deadlock.py``: objects that raise, exit
or crash the process when they are pickled or unpickled.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from pickle import PicklingError, UnpicklingError


# -- ordinary tasks ---------------------------------------------------------------------------
def square(x):
    return x * x


def add(a, b=0):
    return a + b


def identity(x):
    return x


def kw_echo(*args, **kwargs):
    return args, sorted(kwargs.items())


def fail_on(x, bad=3):
    """Return x, but raise ValueError for ``bad`` (so maps have one failure)."""
    if x == bad:
        raise ValueError(f"bad item {x}")
    return x


def raise_error(exc_type, message="boom"):
    raise exc_type(message)


def sleep_return(seconds, value=None):
    time.sleep(seconds)
    return value


def sleep_square(x, seconds=0.05):
    time.sleep(seconds)
    return x * x


def getpid(_=None):
    return os.getpid()


def slow_then_fast(x):
    """imap_unordered: the first item finishes last."""
    time.sleep(0.4 if x == 0 else 0.01)
    return x


# -- initializers -----------------------------------------------------------------------------
_global = None


def init_set_global(value):
    global _global
    _global = value


def get_global(_=None):
    return _global


def init_raise():
    raise RuntimeError("initializer failed on purpose")


# -- crashes ----------------------------------------------------------------------------------
def _crash():
    """A segfault, without faulthandler's dump (as CPython's tests do it)."""
    faulthandler.disable()
    faulthandler._sigsegv()


def crash(_=None):
    _crash()


def sigkill_self(_=None):
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(5)  # never reached


def os_exit(code=3):
    os._exit(code)


def sys_exit(code=1):
    sys.exit(code)


def sigkill_once(marker):
    """Die the first time (per marker file), succeed when retried."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return "survived"
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(5)  # never reached


def return_instance(cls):
    return cls()


# -- objects that fail at (un)pickling time -----------------------------------------------
def _raise_unpickling_error():
    raise UnpicklingError("error in unpickle")


def _exit_at_unpickle():
    sys.exit(1)


class ErrorAtPickle:
    def __reduce__(self):
        raise PicklingError("error in pickle")


class ErrorAtUnpickle:
    def __reduce__(self):
        return _raise_unpickling_error, ()


class ExitAtPickle:
    def __reduce__(self):
        sys.exit(1)


class ExitAtUnpickle:
    def __reduce__(self):
        return _exit_at_unpickle, ()


class CrashAtPickle:
    def __reduce__(self):
        _crash()


class CrashAtUnpickle:
    def __reduce__(self):
        return _crash, ()


class Unpicklable:
    """Holds a lock: ``pickle`` refuses it with TypeError."""

    def __init__(self):
        self.lock = threading.Lock()


def return_unpicklable(_=None):
    return Unpicklable()


class UnpicklableError(Exception):
    """An exception that cannot travel back: it holds a lock."""

    def __init__(self, message="unpicklable error"):
        super().__init__(message)
        self.lock = threading.Lock()


def raise_unpicklable_exception(_=None):
    raise UnpicklableError()


def init_touch(path):
    """Initializer that records that a worker started."""
    with open(path, "a"):
        pass


# -- exceptions that fail to unpickle in the caller ----------------------------------------
class ErrorAtUnpickleError(Exception):
    """Raised by a task; unpickling it in the caller raises ``UnpicklingError``."""

    def __reduce__(self):
        return _raise_unpickling_error, ()


class ExitAtUnpickleError(Exception):
    """Raised by a task; unpickling it in the caller calls ``sys.exit()``."""

    def __reduce__(self):
        return _exit_at_unpickle, ()


def raise_instance(cls):
    raise cls()


# -- results whose lifetime the caller watches -----------------------------------------------
class Blob:
    """A result the caller can watch with a weakref, to see when it is freed."""

    def __init__(self, i):
        self.i = i


def make_blob(i):
    return Blob(i)


def make_array(i, nbytes=1 << 20):
    """A numpy array of ``nbytes`` (large enough for dpool's shared-memory path)."""
    import numpy

    return numpy.full(nbytes // 8, i, dtype="float64")


def pid_then_sleep(marker, seconds=60):
    """First run: write this process's pid to ``marker`` and sleep (to be killed).

    A retry (``marker`` exists) returns ``"retried"`` at once.
    """
    if os.path.exists(marker):
        return "retried"
    with open(marker + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(marker + ".tmp", marker)
    time.sleep(seconds)
    return "not killed"


class CallableErrorAtUnpickle(ErrorAtUnpickle):
    """A task function that raises ``UnpicklingError`` when unpickled in the worker."""

    def __call__(self, *args):
        return args


class CallableExitAtUnpickle(ExitAtUnpickle):
    """A task function that calls ``sys.exit()`` when unpickled in the worker."""

    def __call__(self, *args):
        return args
