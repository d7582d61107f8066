"""What the two clients that talk to a scheduler by messages share: ``ChannelClient``.

A cluster driver (``_cluster.ClusterRuntime``, to its node) and a worker's client
(``dpool.worker._client.WorkerClient``, to its scheduler) both send ``SubmitTask``,
``PutObject``, ``GetObjects`` and ``Release`` and get ``ObjectValue`` back. This base
holds the part that is the same for both: object ids, function registration, futures for
refs (``GetObjects``), setting a future from an outcome (``complete``), questions answered
by ``ObjectValue`` (``ask``: the actor directory) and the lock-free release queue. Each
subclass sends (``_send``), submits, puts and reads its connection its own way.
"""

from __future__ import annotations

import itertools
from collections import deque

from dpool._task_future import ObjectRef, TaskFuture
from dpool.errors import DeserializationError
from dpool.futures import Future
from dpool.objects import payload as _payload
from dpool.protocol import messages as m
from dpool.runtime._functions import FunctionTable

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, TypeVar

    T = TypeVar("T")


_ASK_TIMEOUT = 30.0  # (the node answers from the control store: a lost answer is a bug)


class ChannelClient:
    """The shared half of a client whose runtime is at the other end of a channel."""

    gives_back_slot = False

    def __init__(self, first_id: int, owner_pid: int) -> None:
        self.owner_pid = owner_pid  # the store's owner: it names every segment written
        self._ids = itertools.count(first_id)
        self.functions = FunctionTable(self.new_id, self._register_function)
        self._futures: dict[int, TaskFuture] = {}  # object id -> future awaiting its value
        self._releases: deque = deque()  # object ids whose handles were dropped

    def new_id(self) -> int:
        return next(self._ids)

    def _send(self, msgs: list) -> None:
        raise NotImplementedError

    def _register_function(self, fn_id: int, name: str, payload: bytes) -> None:
        self._send([m.RegisterFunction(fn_id, payload)])

    def future_for(self, ref: ObjectRef) -> TaskFuture:
        pending = self._futures.get(ref.id)
        if pending is not None:
            return pending  # a task's future (or a get already in flight)
        # in a worker, the future's result() gives the slot back (it needs the client)
        fut = Future(0, self) if self.gives_back_slot else Future()
        fut.set_running_or_notify_cancel()
        self._futures[ref.id] = fut
        self._send([m.GetObjects((ref.id,))])
        return fut

    def ask(self, make: Callable[[int], Any], what: str) -> Any:
        """Ask the scheduler something: ``make(reply_id)`` is the question, answered by
        ``ObjectValue(reply_id)`` (a value, or an error raised here); ``dpool.Error`` if
        no answer comes in time."""
        rid = self.new_id()
        fut = Future(0, self) if self.gives_back_slot else Future()
        fut.set_running_or_notify_cancel()
        self._futures[rid] = fut
        self._send([make(rid)])
        try:
            return fut.result(_ASK_TIMEOUT)
        except TimeoutError:
            self._futures.pop(rid, None)
            from dpool.errors import Error

            raise Error(f"no answer to {what} within {_ASK_TIMEOUT:g} s") from None

    def find_actor(self, name: str) -> Optional[tuple]:
        return self.ask(lambda rid: m.ActorFind(rid, name), f"get_actor({name!r})")

    def kv_put(self, key: str, value: bytes, ttl_s: float) -> None:
        """Set ``key`` in the runtime's small key-value table (a cluster's: the control
        store) for ``ttl_s`` seconds."""
        self.ask(lambda rid: m.KVPut(rid, key, value, ttl_s), f"setting {key!r}")

    def kv_get(self, key: str) -> Optional[bytes]:
        return self.ask(lambda rid: m.KVGet(rid, key), f"reading {key!r}")

    def kill_actor(self, group_id: int, node: str, reason: str) -> None:
        self._send([m.KillActor(group_id, node, reason)])

    @staticmethod
    def complete(fut: TaskFuture, ok: bool, payload: bytes) -> None:
        """Set a future from a task's outcome (any thread)."""
        try:
            if ok:
                try:
                    value = _payload.loads(payload)
                except BaseException as exc:  # noqa: BLE001 - SystemExit too
                    fut.set_exception(DeserializationError.wrap("the task's result", exc))
                    return
                fut.set_result(value)
                value = None  # the future holds it; this frame must not (bpo-14406)
            else:
                fut.set_exception(_payload.loads_error(payload))
        except Exception:  # noqa: BLE001 - InvalidStateError: cancelled meanwhile
            pass

    def release(self, object_id: int) -> None:
        """Drop one handle. Safe from ``__del__`` in any thread: no lock is taken."""
        if object_id:
            self._releases.append(object_id)

    def take_releases(self) -> list:
        """A Release message for the handles dropped so far (or nothing)."""
        if not self._releases:
            return []
        rel = []
        while self._releases:
            rel.append(self._releases.popleft())
        return [m.Release(tuple(rel))]

    def lead(self, future: TaskFuture, timeout: Optional[float]) -> Optional[float]:
        return timeout  # results come from the reader thread

    def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)
