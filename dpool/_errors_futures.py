"""The two errors of :mod:`dpool.errors` that are also ``concurrent.futures``' exceptions.

They live here, not in ``errors``, because defining them imports ``concurrent.futures``
(and the ``logging`` it imports: ~15 M instructions), which a ``Pool`` program need not
load at all (see ``dpool._task_future``). ``dpool.errors`` loads this module when one of
the two names is first looked up (PEP 562), and each class says it is ``dpool.errors``'s,
which is where users, tracebacks and pickle find it.
"""

from __future__ import annotations

import builtins
from concurrent.futures import CancelledError as _StdCancelledError
from concurrent.futures import TimeoutError as _StdTimeoutError

from dpool.errors import Error

__all__ = ["CancelledError", "TimeoutError"]


class CancelledError(Error, _StdCancelledError):
    """The future was cancelled (also a ``concurrent.futures.CancelledError``)."""

    __module__ = "dpool.errors"


# the builtin and concurrent.futures' are one class from Python 3.11; before, both bases
_TIMEOUT_BASES = (_StdTimeoutError,) if issubclass(_StdTimeoutError, builtins.TimeoutError) \
    else (_StdTimeoutError, builtins.TimeoutError)


class TimeoutError(Error, *_TIMEOUT_BASES):  # type: ignore[misc]  # noqa: A001
    """A wait ran past its timeout (also the builtin/``concurrent.futures`` ``TimeoutError``)."""

    __module__ = "dpool.errors"
