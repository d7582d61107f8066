"""How a joblib batch travels as one dpool task, and what runs it in the worker.

joblib hands its backend a ``BatchedCalls``: a list of ``(function, args, kwargs)``.
The batch is submitted as the *argument* of one module-level function, ``run_batch``
(the function table pickles a function once, by identity: a batch submitted as the
function would be registered anew for every batch). Large numpy arrays among the calls'
top-level arguments (``X`` and ``y`` of every fit of a grid search) are taken out of
the batch and stored once per ``Parallel`` call (``dpool.put``); the batch keeps a
``Slot`` where each was, and the task gets the stored objects as top-level arguments,
which the runtime hands to the worker mapped from shared memory (zero-copy, once per
node in a cluster). The worker puts them back in their slots and calls the batch.

This module imports neither joblib nor numpy: the worker imports it to run a batch,
before unpickling the batch (which brings joblib) has a reason to.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["Slot", "run_batch", "run_pickled", "pickle_batch", "split_batch", "limit_threads"]


class Slot:
    """Where the ``index``-th stored array goes back in a batch."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> tuple:
        return (Slot, (self.index,))

    def __repr__(self) -> str:
        return f"Slot({self.index})"


def split_batch(batch: Any, store: Any) -> tuple[Any, tuple]:
    """``(batch', values)``: ``batch`` with each large array argument replaced by a
    ``Slot``, and the stored objects (``store(array)``; ``None``: keep it inline) in
    slot order. ``batch`` itself is left as it is (joblib may still read it)."""
    items = batch.items
    values: list = []
    new_items = None
    for i, (fn, args, kwargs) in enumerate(items):
        new_args = _swap(args, store, values) if args else None
        new_kwargs = _swap(kwargs, store, values) if kwargs else None
        if new_args is None and new_kwargs is None:
            continue
        if new_items is None:
            new_items = list(items)
        new_items[i] = (fn, args if new_args is None else tuple(new_args),
                        kwargs if new_kwargs is None else new_kwargs)
    if new_items is None:
        return batch, ()
    clone = object.__new__(type(batch))
    clone.__dict__.update(batch.__dict__)
    clone.items = new_items
    return clone, tuple(values)


def _swap(container: Any, store: Any, values: list) -> Any:
    """A copy of ``container`` (the call's args tuple, as a list, or its kwargs dict) with
    each value ``store`` keeps replaced by a ``Slot``; None if it keeps none."""
    out = None
    keys = container.keys() if isinstance(container, dict) else range(len(container))
    for k in keys:
        ref = store(container[k])
        if ref is not None:
            if out is None:
                out = dict(container) if isinstance(container, dict) else list(container)
            out[k] = Slot(len(values))
            values.append(ref)
    return out


def _fill(x: Any, values: tuple) -> Any:
    return values[x.index] if type(x) is Slot else x


def run_batch(batch: Any, *values: Any) -> list:
    """The task: put the stored arrays back in their slots and run the batch."""
    if values:
        batch.items = [
            (fn, tuple(_fill(a, values) for a in args),
             {k: _fill(v, values) for k, v in kwargs.items()})
            for fn, args, kwargs in batch.items]
    return batch()  # type: ignore[no-any-return]


def run_pickled(payload: bytes, *values: Any) -> list:
    """``run_batch`` for a batch pickled by the submitter (see ``pickle_batch``)."""
    import pickle

    return run_batch(pickle.loads(payload), *values)


def pickle_batch(batch: Any) -> bytes:
    """The batch as bytes, functions of the main script by value (cloudpickle's default,
    what loky does). In a cluster this lets a batch that calls a function of the
    driver's script run on any node: passed as an object, such a function travels by
    reference to the driver's ``__main__``, and the node keeps the task."""
    import cloudpickle

    return cloudpickle.dumps(batch, protocol=5)  # type: ignore[no-any-return]


def run_callable(fn: Any) -> Any:
    """The task for a callable that is not a ``BatchedCalls``."""
    return fn()


def limit_threads(env: dict) -> None:
    """Worker initializer: cap the native thread pools (BLAS, OpenMP) as loky does, so
    that ``n_jobs`` processes of ``k`` threads do not oversubscribe the CPUs. The
    variables reach libraries loaded later and child processes; threadpoolctl (a
    scikit-learn dependency) caps the pools already loaded (the worker may be a fork of
    a driver that had numpy loaded)."""
    os.environ.update(env)
    n = env.get("OMP_NUM_THREADS")
    if n is None:
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=int(n))
