"""Large values of a driver far from its node (attached over TCP, no store of its own).

    put / submit ──▶ dumps_value / dumps_call ── small: inline, in the control message
                                               └ large: pushed into the node's store on a
                                                 transfer connection (``transfer._push``);
                                                 the message names the node's segment
    reader thread ◀── ObjectValue ── small: inline, completed right there
                                   └ a reference (a stored result on the node):
    Fetches: up to _FETCHERS threads ── FetchSegment ranges ──▶ node (``transfer._pull``)
       ──▶ recv_into memory of this process ──▶ unpickled onto it ──▶ future set

A large result is pulled by a fetch thread, never by the reader (the only thread that
takes the node's messages, which a long pull would hold up) nor by a thread in
``result()`` (futures are also waited on through ``as_completed``, ``wait``, callbacks
and Pools). It is pulled from the node the driver was attached to when the reference
came, with no Python-level copy, into this process's memory (``_inline.private_memory``).

The node keeps the segment while this driver holds a handle to the object, and the fetch
thread holds the future until it is set. A segment found gone (spilled to the node's
disk meanwhile) is asked for again with ``GetObjects``, up to ``_ASK_AGAIN`` times: the
node brings it back and sends a fresh reference. A pull that fails because its node died
leaves the result to the task run again after the move (``Mover.lost_result``); else the
future fails with the error (``NodeLostError`` once the node is lost).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Optional

from dpool import _log
from dpool.errors import DeserializationError, NodeLostError
from dpool.futures import Future
from dpool.objects import Serialized
from dpool.objects import inline as _inline
from dpool.protocol import messages as m
from dpool.transfer import pull as _pull
from dpool.transfer import push as _push

log = _log.getLogger("dpool.runtime")

_FETCHERS = 4  # results pulled at once (each in up to 4 ranges: ``transfer._ranges.split``)
_LINGER_S = 2.0  # an idle fetch thread waits this long for the next result, then ends
_ASK_AGAIN = 2  # times a result found gone (spilled) on the node is asked for again


class TcpValues:
    """The large-value paths of one ``ClusterRuntime`` attached over TCP."""

    def __init__(self, rt: Any) -> None:
        self._rt = rt
        self._cv = threading.Condition(threading.Lock())
        self._jobs: deque = deque()
        self._threads = 0
        self._waiting = 0
        self._asked: dict[int, int] = {}  # object id -> times asked again

    # -- to the node -----------------------------------------------------------------------
    def dumps_value(self, value: Any, object_id: int) -> bytes:
        """A put value's payload; a large one is pushed as ``object_id`` first."""
        return _inline.dumps_value_inline(
            value, lambda ser: self._push(object_id, ser))

    def dumps_call(self, args: tuple, kwargs: dict) -> Optional[bytes]:
        """A call's arguments' payload; large ones are pushed first (an id of their own,
        as a local driver's argument block has)."""
        return _inline.dumps_call_inline(
            args, kwargs, lambda ser: self._push(self._rt.new_id(), ser))

    def _push(self, object_id: int, ser: Serialized) -> bytes:
        t = self._rt.target
        if self._rt._lost is not None:
            raise NodeLostError(self._rt._lost)
        return _push.push(t.host, t.port, t.token, object_id, ser)

    # -- from the node ---------------------------------------------------------------------
    def fetch(self, fut: Future, object_id: int, ref: tuple) -> None:
        """Complete ``fut`` with the stored value ``ref`` names (reader thread)."""
        mover = self._rt.mover
        gen = mover.generation if mover is not None else 0
        with self._cv:
            self._jobs.append((fut, object_id, ref, self._rt.target, gen))
            if self._waiting:
                self._cv.notify()
                return
            if self._threads >= _FETCHERS:
                return  # a busy one takes it next
            self._threads += 1
        threading.Thread(target=self._run, daemon=True, name="dpool-result-fetch").start()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._jobs:
                    self._waiting += 1
                    self._cv.wait(_LINGER_S)
                    self._waiting -= 1
                    if not self._jobs:
                        self._threads -= 1
                        return
                fut, oid, ref, target, gen = self._jobs.popleft()
            try:
                self._pull(fut, oid, ref, target, gen)
            except Exception:  # noqa: BLE001 - this thread serves the next ones
                log.exception("dpool: pulling result %#x failed", oid)
            del fut  # hold no result once delivered: its reader may release it

    def _pull(self, fut: Future, oid: int, ref: tuple, t: Any, gen: int) -> None:
        size, _holder, name = ref
        rt = self._rt
        mover = rt.mover
        try:
            # From the node this driver is attached to (the holder is that node: the
            # driver reached it at this address; the node's own may be another name).
            data = _inline.private_memory(size)
            with memoryview(data) as view:
                _pull.fetch_into(t.address, t.token, name, view)
        except _pull.Gone as exc:
            if mover is not None and mover.generation != gen \
                    and mover.lost_result(fut, oid, gen):
                return  # moved: the task ran again on the new node
            asked = self._asked.get(oid, 0)
            if asked < _ASK_AGAIN and not fut.done() and rt._lost is None:
                self._asked[oid] = asked + 1
                other = rt._futures.setdefault(oid, fut)
                if other is not fut:  # another get() asked meanwhile: its answer serves both
                    other.add_done_callback(lambda f, fut=fut: _copy_outcome(f, fut))
                    return
                try:
                    rt._send([m.GetObjects((oid,))])  # the node restores it, sends anew
                    return
                except NodeLostError as lost:
                    rt._futures.pop(oid, None)
                    _set(fut, exc=lost)
                    return
            self._asked.pop(oid, None)
            _set(fut, exc=exc)
            return
        except BaseException as exc:  # noqa: BLE001 - reported on the future
            self._asked.pop(oid, None)
            if mover is not None and isinstance(exc, Exception) \
                    and mover.lost_result(fut, oid, gen):
                return  # its node died: the task ran again on the one the driver moved to
            if rt._lost is not None:  # the node is gone: as every other future hears
                node_lost = NodeLostError(rt._lost)
                node_lost.__cause__ = exc
                exc = node_lost
            _set(fut, exc=exc)
            return
        self._asked.pop(oid, None)
        if mover is not None:
            mover.records.pop(oid, None)
        try:
            value = _inline.loads_fetched(data, name)
        except BaseException as exc:  # noqa: BLE001 - SystemExit too
            _set(fut, exc=DeserializationError.wrap("the task's result", exc))
            return
        del data
        _set(fut, value)
        value = None  # the future holds it; this frame must not (bpo-14406)


def _set(fut: Future, value: Any = None, exc: Optional[BaseException] = None) -> None:
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(value)
    except Exception:  # noqa: BLE001 - InvalidStateError: cancelled meanwhile
        pass


def _copy_outcome(src: Future, dst: Future) -> None:
    """``dst`` gets ``src``'s result or exception (a pull that re-asked and found another
    waiter's request under way)."""
    if src.cancelled():
        _set(dst, exc=NodeLostError("the result's request was cancelled"))
        return
    exc = src.exception()
    if exc is not None:
        _set(dst, exc=exc)
    else:
        _set(dst, src.result())
