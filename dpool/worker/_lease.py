"""A worker lent to a driver on its node's host (cluster mode): the worker's side.

    driver ──ExecuteTask/RegisterFunction──▶ lease channel ──▶ _Worker (main thread)
           ◀─────────────── TaskDone ──────────────────────────┘
    node   ◀── everything else (nested submits, gets, puts, output, LeaseEnded) ──▶

The node starts the worker with the driver's lease connection as a second channel
(``scheduling._workers``). The driver sends a task over it only while the worker is idle,
so one leased task runs at a time and its result goes straight back: no hop through the
node on the latency path. When the driver closes the lease (idle, recalled by the node,
or gone), the worker tells the node and serves it as an ordinary worker again.
"""

from __future__ import annotations

import os
import select
import socket
from typing import Any, Optional

from dpool.errors import ProtocolError
from dpool.protocol import Channel, ChannelClosed, decode_batch, encode_batch
from dpool.protocol import messages as m


def _unlink_stored(payload: bytes) -> None:
    from dpool.objects import segment as _segment
    from dpool.objects import values as _values

    info = _values.stored(payload)
    if info is not None:
        _segment.unlink(info[1])


class LeaseLink:
    def __init__(self, worker: Any, sock: socket.socket) -> None:
        self.worker = worker
        self.chan = Channel(sock, blocking=True)
        self.tasks: set[int] = set()  # ids of the tasks that came over the lease
        self._poll = select.poll()
        self._poll.register(self.chan.fileno, select.POLLIN)
        self._node_polled = False
        self._wake_r: Optional[int] = None

    def ready(self) -> None:
        """Tell the driver the worker is up (its initializer ran); what the worker prints
        goes to it directly from now on, in order with the results."""
        out = self.worker.output
        msgs = [] if out is None else out.drain()  # what its initializer printed, first
        msgs.append(m.LeaseReady(self.worker.cfg.worker_id, os.getpid()))
        try:
            self.chan.send(encode_batch(msgs))
        except ChannelClosed:
            self.end()
            return
        if out is not None:  # from now on (after LeaseReady)
            out.chan = self.chan

    def receive(self) -> None:
        """Block until the driver or the node sends something; handle what came."""
        w = self.worker
        client = w.client
        if client is not None and client.receiving:  # the node's socket is the receiver's
            if self._node_polled:
                self._poll.unregister(w.chan.fileno)
                self._node_polled = False
            if self._wake_r is None:  # its thread wakes us when it queues something
                self._wake_r, wake_w = os.pipe()
                os.set_blocking(self._wake_r, False)
                os.set_blocking(wake_w, False)
                self._poll.register(self._wake_r, select.POLLIN)
                client.wake_fd = wake_w
            msgs = client.poll_messages()
            if not msgs:
                for fd, _ in self._poll.poll():
                    if fd == self.chan.fileno:
                        self._read()
                    else:
                        try:
                            os.read(self._wake_r, 4096)
                        except BlockingIOError:
                            pass
                msgs = client.poll_messages()
            for msg in msgs:
                w.handle(msg)
            return
        if not self._node_polled:
            self._poll.register(w.chan.fileno, select.POLLIN)
            self._node_polled = True
        for fd, _ in self._poll.poll():
            if fd == self.chan.fileno:
                self._read()
            else:
                for frame in w.chan.recv_ready():
                    for msg in decode_batch(frame):
                        w.handle(msg)

    def _read(self) -> None:
        w = self.worker
        try:
            frames = self.chan.recv_ready()
        except ChannelClosed:
            self.end()
            return
        for frame in frames:
            for msg in decode_batch(frame):
                code = msg.CODE
                if code == m.ExecuteTask.CODE:
                    self.tasks.add(msg.task_id)
                    w.pending.append(msg)
                elif code == m.RegisterFunction.CODE:
                    w.fn_payloads[msg.fn_id] = msg.payload
                else:
                    raise ProtocolError(f"unexpected {type(msg).__name__} on a lease")

    def send_done(self, done: m.TaskDone) -> None:
        self.tasks.discard(done.task_id)
        w_out = self.worker.output
        client = self.worker.client
        if client is not None:  # handles the task dropped: to the node that keeps them
            released = client.take_releases()
            if released:
                self.worker.send(released)
        msgs = [done] if w_out is None else [*w_out.drain(), done]
        try:
            self.chan.send(encode_batch(msgs))
        except ChannelClosed:  # the driver is gone: so is whoever wanted this result
            if done.ok:  # a result this worker wrote into the store: nobody adopts it
                _unlink_stored(done.payload)
            self.end()

    def end(self) -> None:
        """The lease is over: serve the node only, from now on."""
        w = self.worker
        if w.lease is not self:
            return
        w.lease = None
        if w.output is not None:
            w.output.chan = w.chan
        self.chan.close()
        w.send([m.LeaseEnded()])
