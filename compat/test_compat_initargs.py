"""Synchronization objects in ``initargs``, handed to every worker as the stdlib does.

multiprocessing's locks, queues and shared values may reach another process only while it
is being created ("through inheritance"); ``Pool(initializer=init, initargs=(lock,))`` and
the executor's ``initargs`` rely on that. Each scenario runs against the stdlib and dpool
and must observe the same thing; passing such an object as a task *argument* keeps
failing with the stdlib's ``RuntimeError``.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import os

import pytest
from compat_helpers import outcome, skip_stdlib_without_max_tasks_per_child
from compat_sync_tasks import (
    count,
    echo,
    keep_all,
    keep_counter,
    keep_lock_queue,
    use_every_kind,
    with_lock,
)
from compat_tasks import square

OK_S = 60
N = 12


def _every_kind(ctx: multiprocessing.context.BaseContext) -> tuple:
    return (ctx.Lock(), ctx.RLock(), ctx.Semaphore(2), ctx.BoundedSemaphore(2), ctx.Event(),
            ctx.Condition(), ctx.Barrier(2), ctx.Queue(), ctx.JoinableQueue(),
            ctx.SimpleQueue(), ctx.Value("i", 0), ctx.Array("i", 3), ctx.RawValue("i", 0),
            ctx.RawArray("i", 3))


def _drain(objs: tuple) -> list:
    queue, jqueue, squeue = objs[7], objs[8], objs[9]
    got = [sorted(queue.get(timeout=OK_S) for _ in range(N)),
           sorted(jqueue.get(timeout=OK_S) for _ in range(N)),
           sorted(squeue.get() for _ in range(N))]
    for _ in range(N):
        jqueue.task_done()
    return got


def _observed(objs: tuple, results: list) -> dict:
    return {"results": results, "queues": _drain(objs), "value": objs[10].value,
            "array": list(objs[11]), "raw_value": objs[12].value, "raw_array": list(objs[13])}


EXPECTED = {"results": [(i, True, 2) for i in range(N)], "queues": [list(range(N))] * 3,
            "value": N, "array": [4, 4, 4], "raw_value": N, "raw_array": [4, 4, 4]}


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_pool_initargs_of_every_kind(Pool, method):
    ctx = multiprocessing.get_context(method)
    objs = _every_kind(ctx)
    objs[4].set()
    with Pool(2, initializer=keep_all, initargs=objs, context=ctx) as p:
        results = p.map(use_every_kind, range(N), 1)
        # Read the queues while the workers live: leaving the block terminates them, and
        # a worker's queue feeder thread may not have flushed its last put by then.
        observed = _observed(objs, results)
    assert observed == EXPECTED


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_executor_initargs_of_every_kind(Executor, method):
    ctx = multiprocessing.get_context(method)
    objs = _every_kind(ctx)
    objs[4].set()
    with Executor(2, mp_context=ctx, initializer=keep_all, initargs=objs) as ex:
        results = list(ex.map(use_every_kind, range(N)))
        observed = _observed(objs, results)
    assert observed == EXPECTED


def test_lock_and_queue_with_the_default_context(Executor, Pool):
    lock, queue = multiprocessing.Lock(), multiprocessing.Queue()
    p = Pool(2, initializer=keep_lock_queue, initargs=(lock, queue))
    try:
        assert sorted(p.map(with_lock, range(6))) == list(range(6))
        got = [queue.get(timeout=OK_S) for _ in range(6)]
    finally:
        # close() and join(), not terminate() (what leaving a ``with`` does): a worker
        # killed right after its put -- its queue's feeder thread still holding the
        # queue's write lock -- leaves that lock taken for good, and the executor's
        # workers below would block in their puts (seen once: a hang, both impls can)
        p.close()
        p.join()
    with Executor(2, initializer=keep_lock_queue, initargs=(lock, queue)) as ex:
        assert sorted(ex.map(with_lock, range(6, 12))) == list(range(6, 12))
        got += [queue.get(timeout=OK_S) for _ in range(6)]
    assert sorted(got) == list(range(12))


def test_workers_started_later_get_them_too(Executor, Pool, impl):
    """Workers that replace retired ones (max_tasks_per_child) receive the initargs too."""
    skip_stdlib_without_max_tasks_per_child(impl)
    ctx = multiprocessing.get_context("spawn")
    counter = ctx.Value("i", 0)
    with Pool(2, initializer=keep_counter, initargs=(counter,), context=ctx,
              maxtasksperchild=1) as p:
        pids = p.map(count, range(6), 1)
    assert counter.value == 6 and len(set(pids)) == 6
    with Executor(1, initializer=keep_counter, initargs=(counter,), mp_context=ctx,
                  max_tasks_per_child=2) as ex:
        pids = [ex.submit(count, i).result(OK_S) for i in range(4)]
    assert counter.value == 10 and len(set(pids)) == 2


def test_an_object_as_a_task_argument_keeps_failing(Executor, Pool):
    lock = multiprocessing.Lock()
    with Executor(1) as ex:
        o = outcome(ex.submit(echo, lock).result, OK_S)
    assert o.raised(RuntimeError) and "inheritance" in str(o.exc)
    with Pool(1) as p:
        o = outcome(p.apply, echo, (lock,))
    assert o.raised(RuntimeError) and "inheritance" in str(o.exc)


def test_remote_traceback_is_the_stdlibs_own_type(Executor, Pool):
    import concurrent.futures.process as cfp

    with Executor(1) as ex:
        exc = ex.submit(int, "x").exception(OK_S)
    assert type(exc) is ValueError and type(exc.__cause__) is cfp._RemoteTraceback
    assert "invalid literal" in str(exc.__cause__)
    with Pool(1) as p:
        o = outcome(p.apply, int, ("x",))
        o_map = outcome(p.map, int, ["1", "x"], 2)
    for got in (o, o_map):
        assert got.raised(ValueError)
        assert type(got.exc.__cause__) is multiprocessing.pool.RemoteTraceback


def test_worker_lists_count_as_the_stdlibs(Executor, Pool):
    """CPython's test_saturation / test_processes_terminate / test_make_pool."""
    for method, expected in (("fork", 5), ("spawn", 3)):
        ctx = multiprocessing.get_context(method)
        sem = ctx.Semaphore(0)
        ex = Executor(5, mp_context=ctx)
        for _ in range(3):
            ex.submit(sem.acquire)
        assert len(ex._processes) == expected, method
        procs = ex._processes
        assert all(proc.is_alive() and proc.pid for proc in procs.values()), procs
        ex.shutdown()
        for proc in procs.values():
            proc.join()
        assert ex._processes is None
    p = Pool(3)
    try:
        assert len(p._pool) == 3
        assert all(proc.is_alive() and proc.pid for proc in p._pool), p._pool
        assert all(hasattr(proc, "join") and hasattr(proc, "is_alive") for proc in p._pool)
    finally:
        p.terminate()
        p.join()


def test_worker_list_after_a_few_tasks_is_alive(Executor):
    """Issue 31: after ``ProcessPoolExecutor(2)`` ran a few tasks, code checking its pool's
    health (as CPython's tests do) saw one live process and one that was not."""
    with Executor(2) as ex:
        assert [ex.submit(square, i).result(OK_S) for i in range(3)] == [0, 1, 4]
        procs = ex._processes
        assert len(procs) == 2
        assert all(proc.is_alive() and proc.exitcode is None for proc in procs.values())
        assert set(procs) == {proc.pid for proc in procs.values()}


def test_saturation(Executor):
    ctx = multiprocessing.get_context("spawn")
    sem = ctx.Semaphore(0)
    with Executor(2, mp_context=ctx) as ex:
        for _ in range(15 * ex._max_workers):
            ex.submit(sem.acquire)
        assert len(ex._processes) == ex._max_workers


def test_max_tasks_per_child_defaults_to_spawn(Executor, impl):
    skip_stdlib_without_max_tasks_per_child(impl)
    ex = Executor(1, max_tasks_per_child=2)
    try:
        assert ex._mp_context.get_start_method() == "spawn"
        assert {ex.submit(os.getpid).result(OK_S) for _ in range(4)}.__len__() == 2
    finally:
        ex.shutdown()


def test_idle_workers_are_reused_in_the_count(Executor):
    """CPython's test_idle_process_reuse_one/_multiple: a submit that finds a worker idle
    starts none, so sequential calls show one process."""
    ctx = multiprocessing.get_context("spawn")
    with Executor(5, mp_context=ctx) as ex:
        for _ in range(3):
            assert ex.submit(echo, 2).result(OK_S) == 2
        assert len(ex._processes) == 1
        for _ in range(12):
            ex.submit(echo, 1).result(OK_S)
        assert len(ex._processes) <= 3
