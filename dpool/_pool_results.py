"""The result objects of ``dpool.Pool``: ``ApplyResult``/``MapResult`` and the ``imap`` iterators.

They behave as ``multiprocessing.pool``'s do. Outcomes reach them through one call,
``_set(index, ok, value, run_callbacks)``, made only by the pool's result-handler thread
(``dpool._pool_core``), so user callbacks always run on that one thread, in the order the
outcomes were handled -- never on the caller's thread. For map-like jobs ``value`` is the
list of a chunk's results (or the exception that failed the chunk).

The ``imap`` iterators also own the *feeder*: a thread that reads the input iterable a
chunk at a time and submits it, keeping at most ``max_inflight`` chunks running and at
most ``max_buffered`` results waiting for the consumer. So a generator is consumed
lazily, in step with the consumer, instead of being read to the end at once (as the
stdlib does). ``join()`` switches a feeder to *drain* mode: it feeds the rest of the
input whether or not anyone reads the results, because ``join`` promises that all the
work submitted to the pool has run.
"""

from __future__ import annotations

import threading
import time
import types
from collections import deque
from multiprocessing import TimeoutError as _MpTimeoutError

from dpool import _log

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Generic, Iterable, Iterator, Optional, TypeVar

    from dpool._pool_core import PoolCore

    T = TypeVar("T")
    Callback = Optional[Callable[[Any], object]]
else:
    # What these classes use of typing at run time, without importing it: generic bases,
    # so that ``AsyncResult[int]`` works as the stdlib's does (a ``types.GenericAlias``).
    from collections.abc import Iterator

    class Generic:
        __slots__ = ()
        __class_getitem__ = classmethod(types.GenericAlias)

    T = "T"

# How a submitted task's value maps onto a job's results (see PoolCore.submit).
APPLY, SINGLE, CHUNK, BATCH = 0, 1, 2, 3

__all__ = ["ApplyResult", "AsyncResult", "MapResult", "IMapIterator", "IMapUnorderedIterator"]

log = _log.getLogger("dpool.pool")


def _call_user(fn: Callable[[Any], object], arg: Any, what: str) -> None:
    """Run a user callback; log what it raises instead of losing the pool over it.

    The stdlib lets the exception kill its result-handler thread, after which every
    pending result of the pool hangs forever (see compat/DIFFERENCES.md).
    """
    try:
        fn(arg)
    except BaseException:  # even SystemExit must not end the result thread
        log.exception("dpool.Pool: the %s %r raised; the result is still delivered", what, fn)


class Outcomes(list):
    """Per-item ``(ok, value)`` pairs of an automatic batch (see ``PoolCore.auto_batch``)."""

    __slots__ = ()


class _SplitBatch:
    """The items of a failed automatic batch, re-run one task each (see ``_split``).

    Collects their outcomes and hands them to the iterator as the batch's outcome, once
    all have arrived.
    """

    __slots__ = ("_parent", "_index", "_left", "_outcomes", "_lock")
    _callback = _error_callback = None  # no user callbacks: outcomes are applied directly

    def __init__(self, parent: "IMapIterator", index: int, n: int) -> None:
        self._parent = parent
        self._index = index
        self._left = n
        self._outcomes: list = [None] * n
        self._lock = threading.Lock()

    def _set(self, index: int, ok: bool, value: Any, run_callbacks: bool) -> None:
        with self._lock:
            self._outcomes[index] = (True, value[0]) if ok else (False, value)
            self._left -= 1
            if self._left:
                return
        self._parent._set(self._index, True, Outcomes(self._outcomes), run_callbacks)


class ApplyResult(Generic[T]):
    """The outcome of ``apply_async``: ``get``, ``wait``, ``ready``, ``successful``."""

    def __init__(self, pool: Any, callback: Callback = None,
                 error_callback: Callback = None) -> None:
        # The Pool stays alive while its results are pending, as in the stdlib, so
        # ``Pool(2).apply_async(f).get()`` works; dropped once ready.
        self._pool = pool
        self._event = threading.Event()
        self._callback = callback
        self._error_callback = error_callback
        self._success: Optional[bool] = None
        self._value: Any = None
        self._fut: Any = None  # the task's future, while a waiting thread may lead it

    def ready(self) -> bool:
        """Whether the call has completed (successfully or not)."""
        return self._event.is_set()

    def successful(self) -> bool:
        """Whether the call completed without raising; ``ValueError`` if not ready yet."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return bool(self._success)

    def wait(self, timeout: Optional[float] = None) -> None:
        """Wait until the result is ready or ``timeout`` seconds have passed."""
        fut = self._fut
        if fut is not None and not self._event.is_set():
            client = fut._client
            if client is not None and not client.gives_back_slot:
                # read the result on this thread a while (``lead``): the outcome is then
                # applied here, without waking this thread from another
                timeout = client.lead(fut, timeout)
        self._event.wait(timeout)

    def get(self, timeout: Optional[float] = None) -> T:
        """The result, or raise the call's exception.

        Raises ``multiprocessing.TimeoutError`` if it is not ready within ``timeout`` s.
        """
        self.wait(timeout)
        if not self.ready():
            raise _MpTimeoutError
        if self._success:
            return self._value
        raise self._value

    def _set(self, index: int, ok: bool, value: Any, run_callbacks: bool) -> None:
        self._success, self._value = ok, value
        if run_callbacks:
            if ok and self._callback is not None:
                _call_user(self._callback, value, "callback")
            elif not ok and self._error_callback is not None:
                _call_user(self._error_callback, value, "error_callback")
        self._event.set()
        self._pool = self._fut = None


AsyncResult = ApplyResult


class MapResult(ApplyResult[list[T]]):
    """The outcome of ``map_async``/``starmap_async``: ready once every chunk is done.

    As in the stdlib, a failure does not make it ready early: it becomes ready (with the
    first exception to arrive) when the last chunk has finished, so nothing is still
    running when ``map`` raises.
    """

    def __init__(self, pool: Any, chunksize: int, length: int,
                 callback: Callback = None, error_callback: Callback = None) -> None:
        super().__init__(pool, callback, error_callback)
        self._success = True
        self._value = [None] * length
        self._chunksize = chunksize
        if length == 0:
            # Ready at once, and -- as in the stdlib -- without calling the callback.
            self._number_left = 0
            self._event.set()
            self._pool = None
        else:
            self._number_left = length // chunksize + bool(length % chunksize)

    def _set(self, index: int, ok: bool, value: Any, run_callbacks: bool) -> None:
        self._number_left -= 1
        if ok and self._success:
            size = self._chunksize
            self._value[index * size:(index + 1) * size] = value
        elif not ok and self._success:
            self._success = False
            self._value = value  # only the first exception is kept
        if self._number_left > 0:
            return
        if run_callbacks:
            if self._success and self._callback is not None:
                _call_user(self._callback, self._value, "callback")
            elif not self._success and self._error_callback is not None:
                _call_user(self._error_callback, self._value, "error_callback")
        self._event.set()
        self._pool = None


class IMapIterator(Iterator[T]):
    """The iterator ``imap`` returns: results in input order; ``next(timeout)``.

    An exception is raised at its item's position. With ``chunksize=1`` iteration can go
    on past it; with a larger chunksize the failed chunk's exception ends the iteration
    (the stdlib behaves the same way).
    """

    _ordered = True

    def __init__(self, core: "PoolCore", pool: Any, fn: Callable[..., Any],
                 iterable: Iterable[Any], chunksize: int,
                 runner: Callable[[list], list]) -> None:
        self._core = core
        self._pool = pool  # kept alive until every result is in (as the stdlib does)
        self._fn = fn
        self._runner = runner  # runs a whole chunk in one task (used when chunksize > 1)
        self._iterable: Optional[Iterable[Any]] = iterable
        self._chunksize = chunksize
        # Automatic batching of chunksize=1 calls only for inputs whose items are all there
        # already (a generator's next item may be slow to come: items read must go out at
        # once) and when tasks are not counted per worker (maxtasksperchild).
        self._batchable = chunksize == 1 and hasattr(iterable, "__len__") and \
            core.executor._group.max_tasks is None
        self._cond = threading.Condition(threading.Lock())
        self._items: deque = deque()  # (ok, value) ready for the consumer, in order
        self._unsorted: dict[int, tuple[bool, Any]] = {}  # chunks that arrived early
        self._next_index = 0  # the chunk whose results go to the consumer next
        self._submitted = 0  # chunks handed to the pool (or failed before it)
        self._arrived = 0  # chunks whose outcome the result handler delivered
        self._reading = 0  # 1 while the feeder reads the next chunk from the input
        self._exhausted = False  # the feeder has read all the input it ever will
        self._buffered = 0  # items arrived and not yet taken by the consumer
        self._finished = False  # a chunked iteration raised: nothing more is yielded
        self._stopped = False  # the pool was terminated: feed nothing more
        self._drain = False  # join(): feed the rest even if nobody reads
        self._input_error: Optional[int] = None  # index of the input's own exception
        self._batches: dict[int, list] = {}  # automatic batches in flight: their items
        self._max_inflight = core.max_inflight
        self._max_buffered = core.max_buffered * chunksize

    # -- the consumer's side -----------------------------------------------------------
    def __iter__(self) -> "IMapIterator[T]":
        return self

    def next(self, timeout: Optional[float] = None) -> T:
        """The next result; ``multiprocessing.TimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._items:
                if self._done():
                    self._pool = None
                    raise StopIteration
                if deadline is None:
                    self._cond.wait()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _MpTimeoutError from None
                self._cond.wait(remaining)
            ok, value = self._items.popleft()
            self._buffered -= 1
            if not ok and self._chunksize > 1:
                self._finish()  # the stdlib's chunked generator ends at its first error
            self._cond.notify_all()  # room for the feeder
        if ok:
            return value
        raise value

    __next__ = next

    def _done(self) -> bool:
        if self._finished:
            return True
        return (self._arrived == self._submitted and not self._unsorted
                and (self._exhausted or self._stopped))

    def _finish(self) -> None:
        self._finished = True
        self._items.clear()
        self._unsorted.clear()
        self._buffered = 0

    # -- the result handler's side -----------------------------------------------------
    def _set(self, index: int, ok: bool, value: Any, run_callbacks: bool) -> None:
        batch = self._batches.pop(index, None) if self._batches else None
        if batch is not None and not ok and self._split(index, batch, value):
            return  # its items run one by one; their outcomes arrive as this index's
        with self._cond:
            self._arrived += 1
            if not self._finished:
                self._buffered += len(value) if ok else 1
                if self._ordered:
                    if index == self._next_index:
                        self._push(ok, value)
                        self._next_index += 1
                        while self._next_index in self._unsorted:
                            self._push(*self._unsorted.pop(self._next_index))
                            self._next_index += 1
                    else:
                        self._unsorted[index] = (ok, value)
                elif index == self._input_error:
                    # The input's exception: after every chunk read before it (the
                    # stdlib's comes from a worker after them; here it is certain).
                    self._unsorted[index] = (ok, value)
                else:
                    self._push(ok, value)
                if self._unsorted and not self._ordered and self._arrived == self._submitted:
                    self._push(*self._unsorted.popitem()[1])  # the input's exception, last
            if self._exhausted and self._arrived == self._submitted:
                self._pool = None
            self._cond.notify_all()

    def _split(self, index: int, items: list, error: BaseException) -> bool:
        """A whole automatic batch failed (its worker died on every attempt, one item did
        not unpickle, one result did not pickle...): run each item as a task of its own,
        so that each succeeds or fails on its own, as it would have unbatched.

        False if the pool no longer takes tasks (the batch's error then stands).
        """
        if self._stopped:
            return False
        split = _SplitBatch(self, index, len(items))
        for i, x in enumerate(items):
            if not self._core.submit(split, i, SINGLE, self._fn, (x,)):
                if i == 0:
                    return False
                for j in range(i, len(items)):  # terminated meanwhile
                    split._set(j, False, error, False)
                break
        return True

    def _push(self, ok: bool, value: Any) -> None:
        if ok and type(value) is Outcomes:
            self._items.extend(value)  # an automatic batch: each item succeeded or failed
            value.clear()
        elif ok:
            self._items.extend([(True, v) for v in value])
            value.clear()  # the consumer alone holds each result (freed once it drops it)
        else:
            self._items.append((False, value))

    # -- the feeder ----------------------------------------------------------------------
    def _has_room(self) -> bool:
        if self._submitted + self._reading - self._arrived >= self._max_inflight:
            return False
        return self._drain or self._finished or self._buffered < self._max_buffered

    def _start_feeder(self) -> None:
        threading.Thread(target=self._feed, args=(self._core,), name="dpool-pool-feeder",
                         daemon=True).start()

    def _stop(self) -> None:
        """The pool is terminated: submit nothing more, end the iteration after what is out."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def _start_draining(self) -> None:
        with self._cond:
            self._drain = True
            self._cond.notify_all()

    def _feed(self, core: "PoolCore") -> None:
        try:
            self._feed_all(core)
        finally:
            with self._cond:
                self._exhausted = True
                self._cond.notify_all()
            core.feeder_finished(self)

    def _feed_all(self, core: "PoolCore") -> None:
        index = 0
        size = self._chunksize
        try:
            it = iter(self._iterable)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - the stdlib reports it as the first item
            self._post_error(core, index, exc)
            return
        finally:
            self._iterable = None
        while True:
            with self._cond:
                while not self._stopped and not self._has_room():
                    self._cond.wait()
                if self._stopped:
                    return
                self._reading = 1
            if self._batchable:
                size = core.auto_batch(self._fn)
            chunk: list = []
            error: Optional[BaseException] = None
            try:
                for _ in range(size):
                    chunk.append(next(it))
            except StopIteration:
                pass
            except BaseException as exc:  # noqa: BLE001 - delivered as the next item
                error = exc
            if error is not None and self._chunksize > 1:
                # As the stdlib's ``tuple(islice(it, chunksize))``: the items of a chunk
                # the input failed in the middle of are dropped, and its error takes
                # that chunk's place. (Items of an automatic batch of chunksize=1 calls
                # are separate calls, and run.)
                chunk = []
            with self._cond:
                self._reading = 0
                if chunk:
                    self._submitted += 1
            if chunk:
                if len(chunk) > 1 and self._chunksize == 1:
                    self._batches[index] = chunk  # to re-run one by one if it fails whole
                    accepted = core.submit(self, index, BATCH, core.batch_runner(self._fn),
                                           (chunk,))
                    if not accepted:
                        self._batches.pop(index, None)
                elif size == 1:
                    accepted = core.submit(self, index, SINGLE, self._fn, (chunk[0],))
                else:
                    accepted = core.submit(self, index, CHUNK, self._runner, (chunk,))
                if not accepted:
                    with self._cond:
                        self._submitted -= 1
                        self._cond.notify_all()
                    return  # terminated meanwhile
                index += 1
            if error is not None:
                # As in the stdlib: the error is raised at the position after the last
                # chunk submitted, once the chunks before it have been yielded.
                self._post_error(core, index, error, input_error=True)
                return
            if len(chunk) < size:
                return

    def _post_error(self, core: "PoolCore", index: int, error: BaseException,
                    input_error: bool = False) -> None:
        with self._cond:
            self._submitted += 1
            if input_error:
                self._input_error = index
        if not core.post_error(self, index, error):
            with self._cond:
                self._submitted -= 1
                self._cond.notify_all()


class IMapUnorderedIterator(IMapIterator[T]):
    """The iterator ``imap_unordered`` returns: results in the order they complete."""

    _ordered = False
