"""Lineage rebuilds on this host: a stored value whose every copy is gone is made again.

    finish_locked ──(ok, a stored result)──▶ keep_lineage_locked: _lineage[oid] = _Record
                                               (function id, inline argument bytes, the
                                                inputs it read, group, request, attempts)
    a reader (dpool.get, a worker's get)  ─┐
    a task that takes it as an input      ─┴▶ HostStore.restore: spill file gone
                                               ──ObjectLostError──▶ recover_locked(oid)
        rebuildable: the entry goes back to pending, its task is admitted again (its own
                     lost inputs are rebuilt the same way, recursively), and every reader
                     and dependent waits for the new value as for any pending result;
        not:         the entry fails with ``ObjectLostError`` naming the object, saying
                     its spill file was lost and why it cannot be made again.

A value leaves shared memory only by eviction to a spill file (``objects._hoststore``);
this module answers a spill file deleted or cut short under it. A rebuilt result that
finds no room goes straight to a spill file (``HostStore.adopt_or_spill``), so a rebuild
never fails for want of room now. Only tasks whose results are stored in shared memory are
recorded, inputs small ones verbatim and stored ones by id; no value is kept alive for
lineage. A record lives as long as its object table entry, and longer while a later record
holds it (``holds``: ``a -> b`` can be rebuilt after ``a`` was released), up to
``MAX_KEPT`` records kept that way.

Not rebuilt (readers get ``ObjectLostError``): a ``dpool.put`` value; a result of a
function marked ``@dpool.no_rebuild`` (read from the function only when a rebuild is due);
a result whose task got its arguments as a stored block (freed when it finished); one
whose task used its ``max_attempts`` (each rebuild is an attempt); one of an executor shut
down or broken; one whose record was let go. A rebuild runs the function again with the same
arguments, in a worker of the same executor: its side effects happen again.

Lock rule: every method here expects the scheduler's lock held.
"""

from __future__ import annotations

from dpool import _log
from dpool.errors import ObjectLostError
from dpool.objects import payload as _payload
from dpool.objects import values as _values
from dpool.scheduling._core import SchedulerCore
from dpool.scheduling._records import ObjectEntry, Task
from dpool.scheduling._states import READY, WAIT, transition

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Optional

log = _log.getLogger("dpool.scheduling")

# The attribute ``dpool.no_rebuild`` sets on a function (``runtime._rebuild._MARK``;
# tests/runtime/test_lineage_rebuild.py checks that the two agree through the public API).
NO_REBUILD_MARK = "__dpool_no_rebuild__"
_MARK_BYTES = NO_REBUILD_MARK.encode()
STORED = bytes([_values.TAG_STORED])  # a payload's first byte: a value in shared memory
# Records kept only because later records hold them (their values were released): at
# most this many. A loop ``x = f(x)`` that keeps only its last result would otherwise
# keep one record per iteration for good. At the cap, the record of an entry dropped is
# let go at once, with the kept records that only it held (``forget_lineage_locked``):
# in such a loop, the whole chain kept so far. A rebuild that needs one of them fails
# with ObjectLostError.
MAX_KEPT = 10_000


class _Record:
    """What re-running a finished task needs."""

    __slots__ = ("args", "attempts", "dep_ids", "fn_id", "group", "holds", "inputs", "kept",
                 "live", "req", "why_not")

    def __init__(self, t: Task, why_not: Optional[str]) -> None:
        self.fn_id = t.fn_id
        self.args = None if why_not else t.args
        self.dep_ids = t.dep_ids
        # per input: its payload when small (kept verbatim), None when stored (by id)
        self.inputs: dict[int, Optional[tuple[bool, bytes]]] = {}
        self.group = t.group
        self.req = t.req
        self.attempts = t.attempts
        self.holds = 0  # records of live results that read this one's value
        self.live = True  # its object table entry exists
        self.kept = False  # no entry, kept only for the records that hold it (counted)
        self.why_not = why_not


class Lineage(SchedulerCore):
    _lineage: dict[int, _Record]
    _function_refusals: dict[int, Optional[str]]
    _lineage_kept = 0  # records with ``kept`` set

    if TYPE_CHECKING:  # LocalScheduler's
        def _enqueue_locked(self, t: Task) -> None: ...

    # -- recording (finish / drop) ---------------------------------------------------------
    def keep_lineage_locked(self, t: Task) -> None:
        """``t`` finished with a stored result: keep what re-running it needs."""
        oid = t.task_id
        rec = self._lineage.get(oid)
        if rec is not None:  # a rebuild finished: the record stays, its attempts count
            rec.attempts = t.attempts
            return
        if oid not in self._objects:
            return  # nobody holds the result: nobody will read it again
        why_not = None
        if t.args is not None and t.args[:1] == STORED:
            why_not = ("its task's arguments were a large stored block, freed when it "
                       "finished (pass large arguments with dpool.put or as futures)")
        rec = self._lineage[oid] = _Record(t, why_not)
        if why_not is None:
            lineage = self._lineage
            for dep, ok, payload in self.inputs_locked(t):
                if dep in rec.inputs:  # the same input twice: held once
                    continue
                if ok and payload[:1] == STORED:
                    rec.inputs[dep] = None
                    held = lineage.get(dep)
                    if held is not None:
                        held.holds += 1
                else:
                    rec.inputs[dep] = (ok, payload)

    def rebuilding_locked(self, t: Task) -> bool:
        """Whether ``t`` is a rebuild (a record is kept only once its first run ended)."""
        return t.task_id in self._lineage

    def forget_lineage_locked(self, oid: int) -> None:
        """The object table dropped ``oid``: its record goes unless a later one holds it."""
        rec = self._lineage.get(oid)
        if rec is None:
            return
        rec.live = False
        if rec.holds == 0 or self._lineage_kept >= MAX_KEPT:
            self._release_record_locked(oid)  # (past the cap, its holders lose it)
        else:
            rec.kept = True
            self._lineage_kept += 1

    def _release_record_locked(self, oid: int) -> None:
        lineage = self._lineage
        stack = [oid]
        while stack:
            rec = lineage.pop(stack.pop())
            if rec.kept:
                self._lineage_kept -= 1
            for dep, kept in rec.inputs.items():
                held = lineage.get(dep) if kept is None else None
                if held is not None:
                    held.holds -= 1
                    if held.holds <= 0 and not held.live:
                        stack.append(dep)

    # -- a lost value (restore failed) -----------------------------------------------------
    def recover_locked(self, oid: int, obj: ObjectEntry,
                       lost: ObjectLostError) -> Optional[tuple[bool, bytes]]:
        """``oid``'s stored value is gone (``lost`` says how). Rebuild it: None, the entry
        is pending again (wait on it as on any pending object). Otherwise the entry
        fails with ``ObjectLostError`` and that outcome is returned."""
        why = self._start_rebuild_locked(oid, obj)
        if why is None:
            if not obj.ready:
                return None
            return obj.ok, obj.payload  # type: ignore[return-value] # settled at once
        err = ObjectLostError(f"{lost}; it cannot be rebuilt: {why}", object_id=oid)
        payload = _payload.dumps_error(err)
        if obj.ready:
            if obj.ok:
                self.store.drop(obj.payload)  # the lost copy's accounting goes
            obj.ok, obj.payload = False, payload
        log.warning("object %#x is lost and cannot be rebuilt: %s", oid, why)
        return False, payload

    def dep_lost_locked(self, t: Task, oid: int, lost: ObjectLostError) -> None:
        """An input ``oid`` of ``t`` was found lost while ``t``'s inputs were being pinned
        (``_build_deps_locked``, which unpinned the others): ``t`` waits for its rebuild,
        or fails with the loss."""
        obj = self._objects[oid]
        got = self.recover_locked(oid, obj, lost)
        if got is None:
            transition(t, WAIT)
            t.missing += 1
            obj.add_waiter(t)
        elif got[0]:  # (cannot happen: a rebuild never ends inside this call) try again
            self._enqueue_locked(t)
        else:
            self.finish_locked(t, False, got[1])

    def _start_rebuild_locked(self, oid: int, obj: ObjectEntry) -> Optional[str]:
        """Admit ``oid``'s task again; the reason why not, if it cannot be."""
        rec = self._lineage.get(oid)
        if rec is None:
            return ("no task made it (a dpool.put value, or a result whose task's record "
                    "is gone): put it again")
        if rec.why_not:
            return rec.why_not
        g = rec.group
        if g.closed or g.broken is not None or self._groups.get(g.group_id) is not g:
            return "the executor that ran its task was shut down"
        if rec.attempts >= g.max_attempts:
            return (f"its task has used all its attempts ({rec.attempts} of "
                    f"max_attempts={g.max_attempts})")
        refusal = self._refusal_locked(rec.fn_id)
        if refusal is not None:
            return refusal
        if obj.ready and obj.ok:
            self.store.drop(obj.payload)  # the lost copy's accounting goes
        obj.ready, obj.ok, obj.payload = False, True, None
        rec.live = True
        if rec.kept:
            rec.kept = False
            self._lineage_kept -= 1
        log.warning("object %#x was lost: running its task again (attempt %d of %d)",
                    oid, rec.attempts + 1, g.max_attempts)
        t = Task(oid, rec.fn_id, rec.args, rec.dep_ids, g, None, None)
        t.attempts = rec.attempts
        t.started = True  # no future to move to RUNNING
        t.req = rec.req
        g.outstanding += 1
        objects = self._objects
        for dep in rec.dep_ids or ():
            if dep not in objects:
                self._revive_input_locked(dep, rec, oid)
        t.deps_counted = True
        for dep in rec.dep_ids or ():
            d = objects[dep]
            d.refs += 1
            if not d.ready:
                t.missing += 1
                d.add_waiter(t)
        if t.missing:
            transition(t, WAIT)
        else:
            transition(t, READY)
            self._enqueue_locked(t)
        return None

    def _revive_input_locked(self, dep: int, rec: _Record, oid: int) -> None:
        """An input of a task being rebuilt left the object table: put an entry back
        (with no handle: the task's own reference, taken next, holds it) -- its small
        value as kept, or a rebuild of its own, or the reason it cannot be had."""
        obj = self._objects[dep] = ObjectEntry()
        kept = rec.inputs.get(dep)
        if kept is not None:
            obj.ready = True
            obj.ok, obj.payload = kept
            return
        why = self._start_rebuild_locked(dep, obj)
        if why is not None and not obj.ready:
            obj.ready, obj.ok = True, False
            obj.payload = _payload.dumps_error(ObjectLostError(
                f"object {dep:#x}, an input of the task that made object {oid:#x} (being "
                f"rebuilt), was released and cannot be made again: {why}",
                object_id=dep))

    def _refusal_locked(self, fn_id: int) -> Optional[str]:
        """Why ``fn_id``'s tasks may not run again (``dpool.no_rebuild``), or None."""
        cache = self._function_refusals
        if fn_id in cache:
            return cache[fn_id]
        payload = self._functions.get(fn_id)
        why: Optional[str] = None
        if payload is None:
            why = "its function is no longer registered"
        elif _MARK_BYTES in payload:  # a function pickled by value carries its mark
            why = "its function is marked @dpool.no_rebuild"
        else:
            try:  # by reference: the function itself says (only here, never on submit)
                fn = _payload.loads(payload)
            except Exception as exc:  # noqa: BLE001 - cannot tell: do not run it twice
                why = (f"its function could not be loaded here to check for "
                       f"@dpool.no_rebuild ({type(exc).__name__}: {exc})")
            else:
                if getattr(fn, NO_REBUILD_MARK, False):
                    name = getattr(fn, "__qualname__", repr(fn))
                    why = f"its function {name} is marked @dpool.no_rebuild"
        cache[fn_id] = why
        return why
