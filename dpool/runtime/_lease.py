"""Worker leases, the driver's side: tasks go straight to a worker the node lent us.

    submit ──(lease idle, no dependencies)──▶ ExecuteTask over the lease ──▶ worker
    result() ◀── leads: reads the lease socket itself ◀── TaskDone ──────────┘
                 (else this module's IO thread completes the future)
    then, batched with the next message to the node: LeasedResult (the node keeps the
    value in its object table, for later tasks, other nodes and the driver's releases)

A driver attached to a node on its own host asks for one lease per executor (a new
connection on the node's unix socket, authenticated like every other; the node starts a
worker with it as the worker's second channel, ``node._leases``). One task runs on
the lease at a time, sent only while the worker is idle: everything else (bursts, tasks
with futures as arguments, large arguments) goes through the node as before. The driver
gives the lease back when the node recalls it, when the executor shuts down, or when the
worker dies -- then a task it held goes to the node, which runs it (a retry, as a dead
worker's task always gets).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Optional

from dpool import _log, errors
from dpool.errors import Error, ProtocolError
from dpool.objects import values as _values
from dpool.protocol import (
    PROTOCOL_VERSION,
    Channel,
    ChannelClosed,
    IOLoop,
    decode_batch,
    encode_batch,
)
from dpool.protocol import auth as _auth
from dpool.protocol import messages as m

log = _log.getLogger("dpool.runtime")

_READY_S = 30.0  # a lent worker starts (and runs its initializer) within this
_RETRY_S = 1.0  # after a refusal, ask again no sooner
_RECALLED_S = 5.0  # after the node asked for the worker back


class Lease:
    """One worker lent to this driver (an IO-loop handle: ``chan``, ``alive``)."""

    __slots__ = ("group", "chan", "worker_id", "pid", "alive", "task", "fns", "ending")

    def __init__(self, group: Any, chan: Channel, ready: m.LeaseReady) -> None:
        self.group = group
        self.chan = chan
        self.worker_id = ready.worker_id
        self.pid = ready.pid
        self.alive = True
        self.task: Optional[tuple] = None  # (oid, fn_id, payload, future) while one runs
        self.fns: set[int] = set()  # functions the worker has
        self.ending = False  # recalled or shut down: no new task; closed once idle


class DriverLeases:
    def __init__(self, rt: Any) -> None:
        self._rt = rt
        self._lock = threading.Lock()  # a lease's task slot
        self._leading = threading.Lock()  # held by the one thread that leads
        self._io: Optional[IOLoop] = None
        self._held: set[Lease] = set()

    # -- asking for one ----------------------------------------------------------------
    def request(self, g: Any) -> None:
        """Ask the node for a worker of ``g`` in the background (if none is held or asked
        for, and the last refusal is old enough)."""
        if g.lease is not None or g.lease_asked or time.monotonic() < g.lease_retry_at:
            return
        g.lease_asked = True
        g.lease_recalled = False
        threading.Thread(target=self._acquire, args=(g,), daemon=True,
                         name="dpool-lease").start()

    def _acquire(self, g: Any) -> None:
        rt = self._rt
        where = f"the dpool node at {rt.target.address}"
        reason = "no answer"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(_READY_S)
            sock.connect(rt.target.unix_path)
            _auth.client_handshake(sock, rt.target.token, where, _READY_S)
            chan = Channel(sock, blocking=True)
            chan.send(encode_batch([m.LeaseRequest(PROTOCOL_VERSION, g.group_id)]))
            deadline = time.monotonic() + _READY_S
            frames: list = []
            while not frames and time.monotonic() < deadline and g.broken is None \
                    and not g.lease_closed and rt._lost is None:
                frames = chan.recv_frames(timeout=0.25)  # (its initializer may fail)
            msg = None
            for frame in frames:
                for one in decode_batch(frame):
                    if one.CODE == m.Output.CODE:  # its initializer's, around LeaseReady
                        rt.print_output(one)
                    elif msg is None:
                        msg = one
            if isinstance(msg, m.LeaseReady):
                lease = Lease(g, chan, msg)
                chan.set_blocking(False)
                with self._lock:
                    if g.broken is None and not g.lease_closed and rt._lost is None:
                        g.lease = lease
                        self._held.add(lease)
                if g.lease is lease:
                    self._loop().add(lease)
                    if g.lease_recalled:  # the node wants the CPU back already
                        self.end(g)
                    log.debug("leased worker %d (pid %d) for group %d", lease.worker_id,
                              lease.pid, g.group_id)
                    return
                reason = "the group closed meanwhile"
            elif isinstance(msg, m.LeaseDenied):
                reason = msg.reason
        except (OSError, Error, ChannelClosed) as exc:  # e.g. the worker's initializer failed
            reason = str(exc) or type(exc).__name__
        finally:
            g.lease_retry_at = max(g.lease_retry_at, time.monotonic() + _RETRY_S)
            g.lease_asked = False
        log.debug("no lease for group %d: %s", g.group_id, reason)
        sock.close()

    def _loop(self) -> IOLoop:
        with self._lock:
            if self._io is None:
                self._io = IOLoop(self._on_frames, self._on_closed, _nothing)
            return self._io

    # -- sending -----------------------------------------------------------------------
    def try_submit(self, g: Any, oid: int, fn_id: int, payload: Optional[bytes],
                   fut: Any) -> bool:
        """Send the task over ``g``'s lease if its worker is idle; False: use the node."""
        lease = g.lease
        if lease is None or (payload is not None and _values.stored(payload) is not None):
            return False  # (arguments in the store: the node accounts for them)
        with self._lock:
            if lease.task is not None or lease.ending or not lease.alive:
                return False
            lease.task = (oid, fn_id, payload, fut)
        msgs: list = []
        if fn_id not in lease.fns:
            msgs.append(m.RegisterFunction(fn_id, self._rt.function_payload(fn_id)))
            lease.fns.add(fn_id)
        msgs.append(m.ExecuteTask(oid, fn_id, payload, None))
        fut.set_running_or_notify_cancel()  # it starts now, as a stdlib task sent to a worker
        # the node keeps a pending object for its result: a later task that takes this
        # future as an argument waits there for it (sent ahead of any later message)
        self._rt.note(m.LeasedTask(oid))
        try:
            if not lease.chan.send(encode_batch(msgs)):
                self._loop().want_write(lease)
        except ChannelClosed:
            pass  # the IO thread sees the EOF and sends the task to the node
        return True

    # -- results (the IO thread, or a leader) ------------------------------------------
    def _on_frames(self, lease: Lease, frames: list) -> None:
        for frame in frames:
            for msg in decode_batch(frame):
                if msg.CODE == m.Output.CODE:  # what it printed, ahead of its result
                    self._rt.print_output(msg)
                    continue
                if msg.CODE != m.TaskDone.CODE:
                    raise ProtocolError(f"unexpected {type(msg).__name__} on a lease")
                with self._lock:
                    task, lease.task = lease.task, None
                    end = lease.ending
                if task is None or task[0] != msg.task_id:
                    raise ProtocolError(f"a lease returned task {msg.task_id:#x}, not ours")
                # for the node's object table, before anyone can release or reuse it
                self._rt.note(m.LeasedResult(msg.task_id, msg.ok, msg.payload))
                self._rt.complete(task[3], msg.ok, msg.payload)
                if end:
                    self._close(lease)

    def _on_closed(self, lease: Lease) -> None:
        """The lease's connection closed: we ended it, or its worker died."""
        g = lease.group
        with self._lock:
            lease.alive = False
            task, lease.task = lease.task, None
            if g.lease is lease:
                g.lease = None
            self._held.discard(lease)
        lease.chan.close()
        if task is None or task[3].done():
            return
        oid, fn_id, payload, fut = task
        if g.broken is not None:
            try:
                fut.set_exception(errors.broken_pool(g.broken))
            except Exception:  # noqa: BLE001 - cancelled meanwhile
                pass
            return
        log.warning("leased worker %d (pid %d) died running task %#x; the node runs it "
                    "again", lease.worker_id, lease.pid, oid)
        self._rt.resubmit(g, oid, fn_id, payload, fut)

    # -- ending ------------------------------------------------------------------------
    def end(self, g: Any, closed: bool = False) -> None:
        """Give ``g``'s lease back once its task is done (``closed``: and ask no more;
        else the node recalled it: ask again only after a while, so a workload that
        alternates bursts and single calls does not churn worker processes)."""
        with self._lock:
            if closed:
                g.lease_closed = True
            else:
                g.lease_retry_at = time.monotonic() + _RECALLED_S
            lease = g.lease
            if lease is None:
                g.lease_recalled = g.lease_asked  # (a lease on its way: end it on arrival)
                return
            lease.ending = True
            idle = lease.task is None
        if idle:
            self._close(lease)

    def lost(self, g: Any, worker_id: int) -> None:
        """The node saw ``g``'s lent worker exit: close our end (our IO loop then hands
        a task it held to the node)."""
        lease = g.lease
        if lease is not None and lease.worker_id == worker_id:
            self._close(lease)

    def _close(self, lease: Lease) -> None:
        try:  # the worker sees EOF and serves the node again; our IO loop sees it too
            lease.chan.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def stop(self) -> None:
        if self._io is not None:
            self._io.stop()

    def is_io_thread(self) -> bool:
        """Whether this is the thread that reads the leased workers (done-callbacks)."""
        io = self._io
        return io is not None and io.is_io_thread()

    # -- leading -----------------------------------------------------------------------
    def lead(self, fut: Any, timeout: Optional[float]) -> Optional[float]:
        """Wait for ``fut`` by reading its lease's socket on this thread (see
        ``LocalScheduler.lead``): the result wakes the waiting thread directly."""
        io = self._io
        if io is None or fut.done() or fut._done_callbacks or io.is_io_thread():
            return timeout
        lease = self._holder(fut)
        if lease is None or not self._leading.acquire(blocking=False):
            return timeout
        try:
            return self._lead(io, lease, fut, timeout)
        finally:
            self._leading.release()

    def _holder(self, fut: Any) -> Optional[Lease]:
        for lease in tuple(self._held):
            task = lease.task
            if task is not None and task[3] is fut:
                return lease
        return None

    def _lead(self, io: IOLoop, lease: Lease, fut: Any,
              timeout: Optional[float]) -> Optional[float]:
        return io.lead(lease, fut, timeout, True,
                       lambda frames: self._on_frames(lease, frames), _nothing,
                       lambda: self._close(lease))


def _nothing(*_: Any) -> None:
    pass
