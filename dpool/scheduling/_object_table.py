"""The local scheduler's object table: every task result and put value of this host.

An entry (``ObjectEntry``) counts references (``refs``: the driver's future or ref, a
worker's nested future or put, one per input of each unfinished task that takes it) and
lists what waits for it to be ready (tasks, workers, callbacks). A ready entry whose
references reach zero is dropped, and its value freed in the store (``objects._hoststore``).
Handles released in any thread, from ``__del__`` too, go through a lock-free deque
(``release``), applied at the next scheduler event (a submit, a read, the tick).

A reader of a value evicted to disk gets it back in shared memory first
(``_resident_value_locked``); when its spill file is gone, the value is rebuilt from
lineage and the reader waits as for any pending object, or gets ``ObjectLostError``
(``_lineage``). A value for a connection with ``remote_values`` (an attached driver, a peer)
is made by the ``DriverService``.

Waiting for room: a task pins its inputs when it is sent to a worker, not while it is
queued (``pin_inputs_locked``). One whose inputs find no room, because other tasks' pins
fill the store, pins nothing and waits on the input that found none
(``wait_for_room_locked``); each finish that releases pins lets the waiting tasks try
again, in order (``room_freed_locked``). It fails with ``ObjectStoreFullError`` instead when
its inputs could never fit together, or when every pin is held by tasks that wait on
others (``_pins_may_clear_locked``, ``fail_stuck_room_waiters_locked``).

Lock rule: ``put``, ``subscribe``, ``reread`` and ``collect_releases`` take the lock;
``release`` takes none (safe from ``__del__``); the other methods expect it held.
"""

from __future__ import annotations

from dpool import errors
from dpool.errors import ObjectLostError, ObjectStoreFullError
from dpool.objects import payload as _payload
from dpool.objects import stored_size
from dpool.protocol import messages as m
from dpool.scheduling._lineage import STORED, Lineage
from dpool.scheduling._records import ObjectEntry, Task, WorkerHandle
from dpool.scheduling._states import WAIT, transition

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional


class ObjectTable(Lineage):
    _room_waiters: dict[int, None]  # ready inputs that tasks wait on for room (in order)

    # -- public (any thread) -------------------------------------------------------------
    def put(self, object_id: int, payload: bytes) -> None:
        """Store a value under ``object_id`` with one reference (the caller's handle)."""
        with self.lock:
            try:
                self.store.adopt(payload)  # raises ObjectStoreFullError at the put() call
            finally:
                if self.store.has_news:  # adopting may have spilled others
                    self._forget_mappings_locked()
            obj = ObjectEntry()
            obj.ready = True
            obj.payload = payload
            obj.refs = 1
            self._objects[object_id] = obj
        self.control.add_object(object_id, stored_size(payload), "host")

    def subscribe(self, object_id: int, callback: Callable[[bool, bytes], None]) -> None:
        """Call ``callback(ok, payload)`` once the object is ready (maybe right away)."""
        with self.lock:
            obj = self._objects.get(object_id)
            got: Optional[tuple[bool, bytes]] = None
            if obj is None:
                got = False, _payload.dumps_error(ObjectLostError(
                    f"object {object_id:#x} is unknown here: its last reference was "
                    "released or it was created by another runtime"))
            elif obj.ready:
                got = self._resident_value_locked(object_id, obj)
            if got is None:  # pending (maybe being rebuilt just now)
                obj.add_waiter(callback)  # type: ignore[union-attr]
            out = self.take_out_locked()  # a rebuild may have dispatched or failed others
        self.deliver(out)
        if got is not None:
            callback(*got)

    def reread(self, future: Any, tries: int = 3) -> None:
        """Complete a driver ``future`` whose stored result was evicted (spilled) between
        its task's finish and ``deliver`` mapping it: the segment is gone, the value is
        on disk. Read it again through the object table, which brings it back (or
        rebuilds it, ``_lineage``); a few tries, as each read races later evictions.
        Call *without* the lock."""

        def got(ok: bool, payload: bytes) -> None:
            if not ok:
                future.set_exception(_payload.loads_error(payload))
                return
            try:
                value = _payload.loads(payload)
            except FileNotFoundError as exc:
                if tries > 1:
                    self.reread(future, tries - 1)
                else:
                    future.set_exception(errors.DeserializationError.wrap("the task's result", exc))
                return
            except BaseException as exc:  # noqa: BLE001 - report on the future
                future.set_exception(errors.DeserializationError.wrap("the task's result", exc))
                return
            future.set_result(value)

        try:
            self.subscribe(future._oid, got)
        except Exception as exc:
            from concurrent.futures import InvalidStateError  # (loaded: it was raised)

            if not isinstance(exc, InvalidStateError):  # else cancelled meanwhile
                raise

    def collect_releases(self) -> None:
        """Apply the handle releases queued by ``release`` now rather than at the next
        scheduler event (before a large write, so it can reuse the freed pages)."""
        if self._releases:
            with self.lock:
                self._drain_releases_locked()
                out = self.take_out_locked()
            self.deliver(out)

    def release(self, object_id: int) -> None:
        """Drop one handle's reference. Safe from ``__del__`` in any thread (no lock)."""
        self._releases.append(object_id)
        if self.io.idle:  # the tick drains them: it must run (``protocol._ioloop``)
            self.io.poke()

    # -- entries (lock held) -------------------------------------------------------------
    def object_locked(self, oid: int) -> Optional[ObjectEntry]:
        return self._objects.get(oid)

    def pending_object_locked(self, oid: int) -> ObjectEntry:
        obj = ObjectEntry()
        obj.refs = 1  # its owner's handle
        self._objects[oid] = obj
        return obj

    def resolve_object_locked(self, oid: int, ok: bool, payload: bytes) -> None:
        obj = self._objects.get(oid)
        if obj is None or obj.ready:  # released meanwhile: nobody can use it
            self.store.discard(payload if ok else None)
            return
        ok, payload = self._adopt_result_locked(ok, payload)
        obj.ready, obj.ok, obj.payload = True, ok, payload
        self.control.add_object(oid, stored_size(payload), "host")
        if obj.waiters:
            self._wake_waiters_locked(obj, oid)
        if obj.refs <= 0:
            self._drop_object_locked(oid)

    def take_object_locked(self, oid: int) -> Optional[ObjectEntry]:
        return self._objects.pop(oid, None)

    def decref_locked(self, oid: int, n: int = 1) -> None:
        obj = self._objects.get(oid)
        if obj is None:
            return
        obj.refs -= n
        if obj.refs <= 0 and obj.ready:
            self._drop_object_locked(oid)

    def _drop_object_locked(self, oid: int) -> None:
        obj = self._objects.pop(oid)
        if obj.ok:
            self.store.drop(obj.payload)
        if self._lineage:
            self.forget_lineage_locked(oid)
        self.control.remove_object(oid)

    def _drain_releases_locked(self) -> None:
        rel = self._releases
        while rel:
            self.decref_locked(rel.popleft())

    # -- a task's inputs (lock held) -------------------------------------------------
    def pin_inputs_locked(self, t: Task) -> bool:
        """``t`` is about to be sent to a worker: pin its inputs now (once: a task sent
        back to the queue keeps them). A task not yet sent pins none -- inputs it will not
        read for a while must not keep other values (a running task's result, a rebuilt
        one) out of the store. False if ``t`` cannot start now: it waits for room or for a
        lost input's rebuild, or it failed."""
        if t.deps is None and t.dep_ids:
            return self._build_deps_locked(t)
        return True

    def unpin_inputs_locked(self, t: Task) -> None:
        """``t`` goes back to its queue unsent: it releases the pins it took for it."""
        deps = t.deps
        if deps is not None:
            t.deps = None
            for _oid, ok, payload in deps:
                self.store.unpin(payload if ok else None)

    def only_to_idle_locked(self, t: Task) -> bool:
        """Whether ``t`` goes only to a worker that runs it at once: sent ahead to a busy
        one, it would pin large stored inputs that nothing pins yet while the store is
        over half full, and they could keep out the room the running task's result needs
        (a value many tasks read, pinned by the running ones, costs no more room)."""
        store = self.store
        if t.deps is not None or not store.under_pressure:
            return False  # (pinned already: a task that went back to the queue)
        objects = self._objects
        for oid in t.dep_ids or ():
            d = objects.get(oid)
            if d is not None and d.ok and d.payload is not None and \
                    d.payload[:1] == STORED and not store.pinned(d.payload):
                return True
        return False

    def inputs_locked(self, t: Task) -> tuple:
        """``t``'s inputs as ``(oid, ok, payload)``: those pinned for it, else the table's
        (a task that never started here: sent to another node, or failed queued)."""
        if t.deps is not None:
            return t.deps
        objects = self._objects
        return tuple((oid, d.ok, d.payload) for oid in t.dep_ids or ()
                     if (d := objects.get(oid)) is not None and d.ready)

    def _build_deps_locked(self, t: Task) -> bool:
        """Attach ready dependency values to ``t``, pinning stored ones; False if it
        cannot start now (``pin_inputs_locked``)."""
        objects = self._objects
        deps = []
        try:
            for oid in t.dep_ids or ():
                d = objects[oid]
                self.store.pin(d.payload if d.ok else None)
                deps.append((oid, d.ok, d.payload))
        except ObjectStoreFullError as exc:
            for _oid, ok, payload in deps:
                self.store.unpin(payload if ok else None)
            # Other pending tasks' inputs fill the store: ``t`` waits, pinning nothing,
            # until their finish makes room (``_object_table``) -- it failed here, and so did
            # readers queued behind others under memory pressure. Unless it never fits.
            if not self.wait_for_room_locked(t, oid):
                self.finish_locked(t, False, _payload.dumps_error(exc))
            return False
        except ObjectLostError as exc:  # its spill file is gone: rebuild it (``_lineage``)
            for _oid, ok, payload in deps:
                self.store.unpin(payload if ok else None)
            self.dep_lost_locked(t, oid, exc)  # t waits for it, or fails
            return False
        t.deps = tuple(deps)
        return True

    # -- waiting for room (lock held) ---------------------------------------------------
    def wait_for_room_locked(self, t: Task, oid: int) -> bool:
        """``t``'s input ``oid`` found no room in the store, which pending tasks pin (``t``
        pins nothing now): ``t`` waits on it as on a pending input, and tries again when
        pins are released. False if its inputs (and arguments) can never fit together:
        waiting would never end."""
        objects = self._objects
        payloads = [d.payload for d in (objects[i] for i in t.dep_ids or ()) if d.ok]
        payloads.append(t.args)
        if not self.store.fit_together(payloads) or not self._pins_may_clear_locked():
            return False
        transition(t, WAIT)
        t.missing += 1
        objects[oid].add_waiter(t)  # (a ready entry has no other waiters)
        self._room_waiters[oid] = None
        return True

    def _pins_may_clear_locked(self) -> bool:
        """Whether a task holding pins can still finish and release them: one queued, or
        running on a worker that is not blocked in a nested wait. If every pin is held by
        tasks that wait on others (perhaps on the very task that waits for room), waiting
        for room would never end: it fails with ObjectStoreFullError instead."""
        for g in self._groups.values():
            if any(t.deps or t.args is not None for t in g.queue):
                return True
            if any(t.deps or t.args is not None for q in g.by_request.values() for t in q):
                return True
            for w in g.workers:
                if w.alive and not w.blocked and any(
                        t.deps or t.args is not None for t in w.inflight.values()):
                    return True
        return False

    def fail_stuck_room_waiters_locked(self) -> None:
        """A worker blocked in a nested wait: if no pin can be released any more, the
        tasks waiting for room fail (``_pins_may_clear_locked``) rather than wait forever."""
        if not self._room_waiters or self._pins_may_clear_locked():
            return
        waiting, self._room_waiters = self._room_waiters, {}
        exc = ObjectStoreFullError(
            "the object store is full: the room the waiting tasks' inputs need is pinned by "
            "tasks that are themselves waiting on other tasks")
        err = _payload.dumps_error(exc)
        for oid in waiting:
            obj = self._objects.get(oid)
            if obj is None or not obj.waiters:
                continue
            tasks = [w for w in obj.waiters if isinstance(w, Task)]
            obj.waiters = [w for w in obj.waiters if not isinstance(w, Task)] or None
            for t in tasks:
                t.missing -= 1
                self.finish_locked(t, False, err)

    def room_freed_locked(self) -> None:
        """A finished task released pins: the tasks waiting for room try again, in the
        order they began to wait (one that still finds none waits again)."""
        waiting, self._room_waiters = self._room_waiters, {}
        objects = self._objects
        for oid in waiting:
            obj = objects.get(oid)  # (held by its waiting tasks' references)
            if obj is not None and obj.ready and obj.waiters:
                self._wake_waiters_locked(obj, oid)
            # (not ready: lost and being rebuilt meanwhile -- its waiters wake with it)

    # -- values to readers (lock held) ---------------------------------------------------
    def _resident_value_locked(self, oid: int, obj: ObjectEntry) -> Optional[tuple[bool, bytes]]:
        """A ready object's (ok, payload), brought back from disk first if it was spilled;
        None if its spill file was gone and it is being rebuilt (``_lineage``): the caller
        waits on ``obj`` as on any pending object."""
        ok = obj.ok
        payload: bytes = obj.payload  # type: ignore[assignment]  # ready: it is set
        if ok:
            try:
                self.store.restore_payload(payload)
            except ObjectStoreFullError as exc:
                ok, payload = False, _payload.dumps_error(exc)
            except ObjectLostError as exc:
                return self.recover_locked(oid, obj, exc)
        return ok, payload

    def _send_object_locked(self, w: WorkerHandle, oid: int, obj: ObjectEntry) -> None:
        got = self._resident_value_locked(oid, obj)
        if got is None:
            obj.add_waiter(w)  # sent when the rebuilt value is ready
            return
        self.send_locked(w, [self._value_message_locked(w, oid, *got)])

    def _value_message_locked(self, w: WorkerHandle, oid: int, ok: bool,
                              payload: bytes) -> m.ObjectValue:
        if w.remote_values:  # a driver or a peer: on a node, which has its drivers' service
            return self._sessions.value_message(w, oid, ok, payload)  # type: ignore[union-attr]
        return m.ObjectValue(oid, ok, payload)

    def _forget_mappings_locked(self) -> None:
        """Large segments were freed or spilled, or pooled pages given back: workers (and
        this process) unmap cached mappings nobody can use any more."""
        from dpool.objects import mapping as _mapping  # (the store's: news came from it)
        from dpool.objects import writemaps as _writemaps

        names = self.store.take_news()
        _mapping.prune()
        _writemaps.prune()  # (kept write mappings of those: the timer would, within 1 s)
        msg = [m.Forget(names)]
        for g in self._groups.values():
            for w in g.workers:
                if w.alive:
                    self.send_locked(w, msg)
        if self._sessions is not None:  # drivers on this host map our segments too
            for d in self._sessions.local_drivers_locked():
                self.send_locked(d, msg)
