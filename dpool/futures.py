"""Future and ObjectRef: the types of dpool's results (a leaf of types).

``Future`` *is* a ``concurrent.futures.Future``: the stdlib's ``wait`` and
``as_completed`` work on it unchanged. Its behaviour is ``TaskFuture``'s
(``dpool._task_future``: the same states and attributes as the stdlib's, written without
importing ``concurrent.futures``, which ``Pool`` uses on its own). It also names the
object the task produces, so it can be passed to another task as an argument (a dataflow
dependency: the task runs when its inputs are ready and receives the value, not the
future).

The functions that need this process's runtime -- ``dpool.wait``, ``get`` and ``put`` --
are in ``dpool.runtime._api``.
"""

from __future__ import annotations

import concurrent.futures as _cf

from dpool._task_future import ObjectRef, TaskFuture

__all__ = ["Future", "ObjectRef"]


class Future(TaskFuture, _cf.Future):
    """The future of a dpool task; a ``concurrent.futures.Future`` in every respect.

    Every method is ``TaskFuture``'s (first in the MRO); ``concurrent.futures.Future`` is
    a base so that ``isinstance`` says so, and its ``__init__`` is never called (the
    attributes it would set, ``TaskFuture.__init__`` sets: see tests/runtime/test_task_future.py).
    """
