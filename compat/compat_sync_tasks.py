"""Initializers and tasks of test_compat_initargs (importable by spawned workers)."""

from __future__ import annotations

import os

SYNC: dict = {}


def keep(**objs: object) -> None:
    """The initializer: store what ``initargs`` brought in this worker's globals."""
    SYNC.update(objs)


def keep_lock_queue(lock: object, queue: object) -> None:
    keep(lock=lock, queue=queue)


def keep_counter(counter: object) -> None:
    keep(counter=counter)


def keep_all(*objs: object) -> None:
    SYNC["all"] = objs


def use_every_kind(i: int) -> tuple:
    """Touch each synchronization object the way programs do; report what it saw."""
    (lock, rlock, sem, bsem, event, cond, barrier, queue, jqueue, squeue, value, array,
     raw_value, raw_array) = SYNC["all"]
    with lock, rlock, sem, bsem:
        with value.get_lock():
            value.value += 1
        with array.get_lock():
            array[i % len(array)] += 1
        raw_value.value += 1
        raw_array[i % len(raw_array)] += 1
    with cond:
        cond.notify_all()
    queue.put(i)
    jqueue.put(i)
    squeue.put(i)
    return (i, event.is_set(), barrier.parties)


def count(i: int) -> int:
    """Increment the shared counter under its lock; the worker's pid back."""
    counter = SYNC["counter"]
    with counter.get_lock():
        counter.value += 1
    return os.getpid()


def with_lock(i: int) -> int:
    with SYNC["lock"]:
        SYNC["queue"].put(i)
    return i


def echo(x: object) -> object:
    return x
