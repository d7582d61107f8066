"""The runtime API inside a worker: tasks that submit tasks, wait and get.

    task code ──submit──▶ WorkerClient ──SubmitTask──▶ scheduler
        ▲                    ▲ receiver thread ◀──ObjectValue── scheduler
        └── Future.result ───┘ (sets the future)

The first nested call starts a receiver thread that owns reading the socket from then on
(the main loop takes its next tasks from it), so results arrive while the task runs and
stdlib ``wait``/``as_completed`` on nested futures work too.

Waiting (``result()``, ``exception()``, ``dpool.wait``, ``dpool.get``) gives the worker's
CPU slot back: the worker hands its unstarted tasks back and tells the scheduler it is
blocked, so the scheduler can run other tasks -- including the ones this task waits on --
even with ``max_workers=1``.
"""

from __future__ import annotations

import os
import queue
import threading

from dpool._task_future import ObjectRef, TaskFuture
from dpool.objects import mapping as _mapping
from dpool.objects import payload as _payload
from dpool.protocol import ChannelClosed, decode_batch, encode_batch
from dpool.protocol import messages as m
from dpool.runtime import ChannelClient
from dpool.runtime import calls as _calls

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, TypeVar

    from dpool.scheduling import resources

    T = TypeVar("T")

_CLOSED = object()


class WorkerClient(ChannelClient):
    """The ``Client`` of a worker process (see ``dpool.runtime._client``)."""

    gives_back_slot = True

    def __init__(self, worker: Any) -> None:
        base = worker.cfg.id_base or (worker.cfg.worker_id << 32)
        # the scheduler's process owns the store: it names every segment written here
        super().__init__(base + 1, worker.cfg.parent_pid)
        self.worker = worker
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._block_lock = threading.Lock()
        self._depth = 0
        self._blocked = False
        self._thread: threading.Thread | None = None
        self.wake_fd: int | None = None  # a lent worker's main loop waits on it (_lease)
        self._routed: set[int] = set()  # actors whose node this worker's node was told
        worker.client = self

    # -- sending ---------------------------------------------------------------------------
    def _send(self, msgs: list) -> None:
        if self._releases:
            msgs = [*msgs, *self.take_releases()]
        self.worker.chan.send(encode_batch(msgs))

    @property
    def receiving(self) -> bool:
        """Whether the receiver thread owns the socket (else the main loop reads it)."""
        return self._thread is not None

    def _ensure_receiver(self) -> None:
        if self._thread is None:
            with self._block_lock:
                if self._thread is None:
                    t = threading.Thread(target=self._receive_loop, daemon=True,
                                         name="dpool-worker-receiver")
                    t.start()
                    self._thread = t

    def actor_route(self, group_id: int, node: str, name: str) -> None:
        """Before the first call of an actor on node ``node`` (a handle that came from
        elsewhere): tell this worker's node where its calls go (``node._actor_calls``)."""
        if group_id not in self._routed:
            self._routed.add(group_id)
            self._send([m.ActorRoute(group_id, node, name)])

    def ask(self, make: Callable[[int], Any], what: str) -> Any:
        self._ensure_receiver()  # the answer arrives while the task waits
        return super().ask(make, what)

    # -- the task API ----------------------------------------------------------------------
    def submit(self, group_id: int, fn: Callable[..., Any], args: tuple, kwargs: dict,
               req: Optional[resources.Request], future_type: type[TaskFuture]) -> TaskFuture:
        self._ensure_receiver()
        oid = self.new_id()
        fut = future_type(oid, self)
        try:
            fn_id, payload, deps = _calls.submit_prepared(self, fn, args, kwargs, fut)
        except Exception as exc:  # noqa: BLE001
            fut._client = None
            return _calls.failed_future(fut, exc)
        # A nested task cannot be recalled once sent, so its future is RUNNING at once and
        # cancel() says False rather than promising what the scheduler cannot keep.
        fut.set_running_or_notify_cancel()
        self._futures[oid] = fut
        self._send([m.SubmitTask(oid, fn_id, payload, deps, group_id,
                                 None if req is None else tuple(req))])
        return fut

    def put(self, value: Any) -> ObjectRef:
        oid = self.new_id()
        self._send([m.PutObject(oid, _payload.dumps_value(value, oid, self.owner_pid))])
        return ObjectRef(oid, self)

    def future_for(self, ref: ObjectRef) -> TaskFuture:
        self._ensure_receiver()  # the value arrives while the task waits
        return super().future_for(ref)

    # -- blocking --------------------------------------------------------------------------
    def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` (a wait) with this worker's slot given back to the scheduler."""
        self._ensure_receiver()
        w = self.worker
        with self._block_lock:
            self._depth += 1
            first = self._depth == 1
            returned: list = []
            if first:
                self._blocked = True
                returned = [t.task_id for t in w.pending]
                w.pending.clear()
                keep = []
                while True:
                    try:
                        msg = self._inbox.get_nowait()
                    except queue.Empty:
                        break
                    if msg is not _CLOSED and msg.CODE == m.ExecuteTask.CODE:
                        returned.append(msg.task_id)
                    else:
                        keep.append(msg)
                for msg in keep:
                    self._inbox.put(msg)
            if first:
                # sent under the lock: Blocked/Unblocked from concurrent waits in one
                # task stay in the order of the depth changes
                w.flush()
                self._send([m.Blocked(tuple(returned))])
        try:
            return fn(*args)
        finally:
            with self._block_lock:
                self._depth -= 1
                if self._depth == 0:
                    self._blocked = False
                    self._send([m.Unblocked()])

    # -- receiving -------------------------------------------------------------------------
    def handle(self, msg: Any) -> bool:
        """Messages the main loop got before the receiver started (none expected)."""
        if msg.CODE == m.ObjectValue.CODE:
            self._deliver(msg)
            return True
        return False

    def _deliver(self, msg: m.ObjectValue) -> None:
        fut = self._futures.pop(msg.object_id, None)
        if fut is None:
            return
        try:
            if msg.ok:
                fut.set_result(_payload.loads(msg.payload))
            else:
                fut.set_exception(_payload.loads_error(msg.payload))
        except Exception as exc:  # noqa: BLE001 - unpicklable value: report it on the future
            if not fut.done():
                fut.set_exception(exc)

    def _receive_loop(self) -> None:
        chan = self.worker.chan
        fn_payloads = self.worker.fn_payloads
        try:
            while True:
                bounced = []
                for frame in chan.recv_frames():
                    for msg in decode_batch(frame):
                        code = msg.CODE
                        if code == m.ObjectValue.CODE:
                            self._deliver(msg)
                        elif code == m.RegisterFunction.CODE:
                            fn_payloads[msg.fn_id] = msg.payload
                        elif code == m.Forget.CODE:
                            _mapping.forget(msg.names)
                        elif code == m.ExecuteTask.CODE:
                            with self._block_lock:
                                if self._blocked:
                                    bounced.append(msg.task_id)
                                else:
                                    self._inbox.put(msg)
                        else:
                            self._inbox.put(msg)
                if self.wake_fd is not None:
                    self._wake()
                if bounced:
                    self._send([m.ReturnTasks(tuple(bounced))])
        except (ChannelClosed, OSError):
            pass
        finally:
            self._inbox.put(_CLOSED)
            if self.wake_fd is not None:
                self._wake()

    def _wake(self) -> None:
        try:
            os.write(self.wake_fd, b"x")  # type: ignore[arg-type]
        except OSError:  # full (a wake-up is pending already) or closed
            pass

    def poll_messages(self, msgs: Optional[list] = None) -> list:
        """Main loop of a leased worker: the messages queued so far (maybe none)."""
        msgs = [] if msgs is None else msgs
        while True:
            try:
                msgs.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        if _CLOSED in msgs:
            raise ChannelClosed("scheduler closed the connection")
        return msgs

    def next_messages(self) -> list:
        """Main loop: block for the next messages the receiver queued."""
        return self.poll_messages([self._inbox.get()])
