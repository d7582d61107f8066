"""Differential conformance: ``multiprocessing.Manager()`` / ``multiprocessing.managers``
vs ``dpool.Manager()`` / ``dpool.managers`` (whose server is an actor).

Every test runs once per implementation and asserts one expected observation for both;
documented differences name their entry of compat/DIFFERENCES.md ("Managers").
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.managers
import queue
import threading
import time
from concurrent.futures import ProcessPoolExecutor as StdExecutor

import pytest
from compat_manager_tasks import Counter, add, bump, fail, fill, square

import dpool
import dpool.managers

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def manager(impl: str):
    m = multiprocessing.Manager() if impl == "stdlib" else dpool.Manager()
    try:
        yield m
    finally:
        m.shutdown()


@pytest.fixture
def managers(impl: str):
    return multiprocessing.managers if impl == "stdlib" else dpool.managers


@pytest.fixture
def Executor(impl: str) -> type:
    return StdExecutor if impl == "stdlib" else dpool.ProcessPoolExecutor


def test_dict(manager):
    d = manager.dict(a=1)
    d["b"] = 2
    assert (d["a"], len(d), "b" in d, "z" in d) == (1, 2, True, False)
    assert sorted(d.keys()) == ["a", "b"] and sorted(d.items()) == [("a", 1), ("b", 2)]
    assert sorted(d.values()) == [1, 2] and sorted(d) == ["a", "b"]
    assert d.get("z", 9) == 9 and d.setdefault("c", 3) == 3 and d.pop("c") == 3
    d.update({"e": 5}, f=6)
    assert d.copy() == {"a": 1, "b": 2, "e": 5, "f": 6} == d._getvalue()
    assert isinstance(d.popitem(), tuple) and len(d) == 3
    del d["a"]
    with pytest.raises(KeyError):
        d["a"]
    assert str(d) == str(d._getvalue())
    d.clear()
    assert len(d) == 0 and type(d).__name__ == "DictProxy"


def test_list(manager):
    lst = manager.list([3, 1, 2])
    lst.append(4)
    lst.extend([5])
    lst += [6]
    assert lst[0] == 3 and lst[-1] == 6 and lst[1:3] == [1, 2] and len(lst) == 6
    lst.sort()
    assert lst._getvalue() == [1, 2, 3, 4, 5, 6]
    lst.reverse()
    lst.insert(0, 0)
    assert lst.index(0) == 0 and lst.count(6) == 1 and 5 in lst
    assert lst.pop() == 1 and lst.pop(0) == 0
    lst.remove(6)
    lst[0] = 50
    del lst[1]
    assert lst._getvalue() == [50, 3, 2]
    lst *= 2
    assert str(lst) == "[50, 3, 2, 50, 3, 2]"
    with pytest.raises(IndexError):
        lst[99]
    with pytest.raises(ValueError):
        lst.remove(99)


def test_namespace_value_array(manager):
    ns = manager.Namespace(x=1)
    ns.y = 2
    assert (ns.x, ns.y) == (1, 2)
    del ns.x
    with pytest.raises(AttributeError):
        ns.x  # noqa: B018
    v = manager.Value("i", 3)
    v.value += 1
    assert v.value == 4 and v.get() == 4
    v.set(7)
    assert v.value == 7
    a = manager.Array("i", [1, 2, 3])
    a[0] = 10
    assert (len(a), a[0], list(a[:])) == (3, 10, [10, 2, 3])


def test_locks_and_semaphores(manager):
    lock = manager.Lock()
    assert lock.acquire() is True
    assert lock.acquire(False) is False
    assert lock.acquire(True, 0.05) is False
    lock.release()
    with lock:
        pass
    rlock = manager.RLock()
    assert rlock.acquire() and rlock.acquire()  # reentrant for its owner
    rlock.release()
    rlock.release()
    with pytest.raises(RuntimeError):
        rlock.release()
    sem = manager.Semaphore(2)
    assert sem.acquire() and sem.acquire() and sem.acquire(False) is False
    sem.release()
    bsem = manager.BoundedSemaphore(1)
    bsem.acquire()
    bsem.release()
    with pytest.raises(ValueError):
        bsem.release()


def test_a_lock_held_by_one_thread_blocks_another(manager):
    lock = manager.RLock()
    lock.acquire()
    got: list = []
    t = threading.Thread(target=lambda: got.append(lock.acquire(True, 0.2)))
    t.start()
    t.join()
    assert got == [False]  # another caller, even of the same process, waits
    lock.release()
    t = threading.Thread(target=lambda: (got.append(lock.acquire()), lock.release()))
    t.start()
    t.join()
    assert got == [False, True]


def test_event_condition_barrier(manager):
    ev = manager.Event()
    assert ev.is_set() is False and ev.wait(0.05) is False
    ev.set()
    assert ev.wait(1) is True
    ev.clear()
    cond = manager.Condition()
    with cond:
        assert cond.wait(0.05) is False

    def later() -> None:
        time.sleep(0.2)
        with cond:
            cond.notify_all()

    t = threading.Thread(target=later)
    t.start()
    with cond:
        assert cond.wait(10) is True
    t.join()
    with pytest.raises(RuntimeError):
        cond.notify()  # not holding its lock
    barrier = manager.Barrier(2)
    assert barrier.parties == 2 and barrier.n_waiting == 0 and barrier.broken is False
    out: list = []
    t = threading.Thread(target=lambda: out.append(barrier.wait(10)))
    t.start()
    out.append(barrier.wait(10))
    t.join()
    assert sorted(out) == [0, 1]


def test_queues(manager):
    q = manager.Queue()
    q.put(1)
    q.put_nowait(2)
    assert (q.qsize(), q.empty(), q.get(), q.get_nowait()) == (2, False, 1, 2)
    with pytest.raises(queue.Empty):
        q.get(timeout=0.05)
    jq = manager.JoinableQueue()
    jq.put("x")
    assert jq.get() == "x"
    jq.task_done()
    jq.join()
    t = threading.Thread(target=lambda: (time.sleep(0.1), q.put("late")))
    t.start()
    assert q.get(timeout=10) == "late"  # a blocking get lets the put through
    t.join()


def test_proxies_pass_to_worker_processes(manager, Executor):
    counter, lock = manager.Value("i", 0), manager.Lock()
    d, lst, q = manager.dict(), manager.list(), manager.Queue()
    with Executor(2) as ex:
        assert sum(ex.map(bump, [counter] * 4, [lock] * 4, [10] * 4)) == 40
        assert sorted(ex.map(fill, [d] * 4, [lst] * 4, [q] * 4, range(4))) == [0, 1, 2, 3]
    assert counter.value == 40
    assert d._getvalue() == {0: 0, 1: 1, 2: 4, 3: 9} and sorted(lst) == [0, 1, 2, 3]
    assert sorted(q.get() for _ in range(4)) == [0, 1, 2, 3]


def test_pool(manager):
    with manager.Pool(2) as p:
        assert type(p).__name__ == "PoolProxy"
        assert p.apply(square, (3,)) == 9 and p.apply(add, (1,), {"b": 2}) == 3
        assert p.map(square, range(5)) == [0, 1, 4, 9, 16]
        assert p.map(square, range(20), chunksize=4) == [x * x for x in range(20)]
        assert p.starmap(add, [(1, 2), (3, 4)]) == [3, 7]
        r = p.apply_async(square, (4,))
        assert r.get(timeout=30) == 16 and r.ready() and r.successful()
        assert list(p.imap(square, range(4))) == [0, 1, 4, 9]
        assert sorted(p.imap_unordered(square, range(4))) == [0, 1, 4, 9]
        assert p.map_async(square, range(3)).get(30) == [0, 1, 4]
        assert p.starmap_async(add, [(5, 6)]).get(30) == [11]
        with pytest.raises(ValueError, match="bad 1"):
            p.apply(fail, (1,))
        e = p.apply_async(fail, (2,))
        e.wait(30)
        assert e.ready() and not e.successful()
        with pytest.raises(ValueError, match="bad 2"):
            e.get(30)
    p2 = manager.Pool(1)
    p2.close()
    p2.join()


def test_registered_class(managers):
    class MyManager(managers.BaseManager):
        pass

    MyManager.register("Counter", Counter, exposed=("add", "get", "fail"))
    with MyManager() as m:
        c = m.Counter(5)
        assert c.add(2) == 7 and c.get() == 7
        with pytest.raises(ValueError, match="counter says no"):
            c.fail()
        assert not hasattr(c, "hidden")
        with pytest.raises(managers.RemoteError, match="not in exposed"):
            c._callmethod("hidden")  # not exposed: refused by the server
        assert c._callmethod("add", (3,)) == 10
        assert "Counter" in repr(c)


def test_auto_proxy_exposes_public_methods(managers):
    class MyManager(managers.BaseManager):
        pass

    MyManager.register("Counter", Counter)
    with MyManager() as m:
        c = m.Counter()
        assert c.add() == 1 and c.hidden() == "hidden"
        assert type(c).__name__ == "AutoProxy[Counter]"


def test_start_twice_and_use_before_start(managers):
    from multiprocessing import ProcessError

    m = managers.SyncManager()
    m.start()
    try:
        with pytest.raises(ProcessError):
            m.start()
    finally:
        m.shutdown()


def test_proxies_fail_after_shutdown(impl, manager):
    d = manager.dict()
    manager.shutdown()
    # compat/DIFFERENCES.md, "Managers": the stdlib's proxies raise a connection error
    # (its server process is gone); dpool's raise ActorDiedError (its actor is gone)
    expected = (dpool.ActorDiedError,) if impl == "dpool" else (OSError, EOFError)
    with pytest.raises(expected):
        d["x"] = 1
