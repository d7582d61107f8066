"""The origin's results (``_spillback.Spillback``): a spilled task's outcome coming back, its lent
result pulled, and the lenders kept for data locality.

Data locality: after pulling a lent result, this node leaves it lent (``lent_copies``,
released when its own copy is freed) and, for ``LEND_USE_S``, sends the tasks that take
it a reference to the *lender's* copy. The global scheduler's policy then sees the input
on the lender (``missing_bytes`` 0 there) and places them there when it can start them
soon enough; the lender runs them on its copy, with nothing to pull. A task that finds
that copy gone (``ObjectLostError`` from the lender) is offered again, uncharged, with
this node's copy; a lender that goes away is forgotten (``_lost_locked``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Optional

from dpool.errors import ObjectLostError
from dpool.node._spillback_base import SpillbackBase, _Away
from dpool.objects import inline as _inline
from dpool.objects import payload as _payload
from dpool.objects import segment as _segment
from dpool.objects import values as _values
from dpool.protocol import messages as m
from dpool.scheduling import Task
from dpool.transfer import pull as _pull

log = logging.getLogger("dpool.scheduling")


class SpillbackResults(SpillbackBase):
    """Part of ``Spillback``: outcomes, pulls of lent results, and lenders."""

    def _freed_locked(self, name: str) -> None:
        """Segment ``name`` of this node's store was freed (its last reference died):
        the nodes that may keep a copy of it free theirs (``_remote``), and the node
        that lent it, if it still does."""
        for node in self._borrowers.pop(name, ()):
            self._send(node, [m.ReleaseLent(name)])
        lent = self.lent_copies.pop(name, None)
        if lent is not None:
            for node in {lent[0], *self._borrowers.pop(lent[1], ())}:
                self._send(node, [m.ReleaseLent(lent[1])])

    def _lender_lost_locked(self, t: Task, a: _Away, payload: bytes) -> bool:
        """``t`` failed with its input gone from the lender it was pointed at (the
        lender died, or no longer lends it): forget that lender's copies and offer
        the task again, uncharged, with this node's own copies (True)."""
        try:
            err = _payload.loads_error(payload)
        except Exception:  # noqa: BLE001 - not an error this node can read: the task's
            return False
        if not isinstance(err, ObjectLostError) or (
                err.node is not None and err.node not in a.lenders):
            return False
        self._forget_lenders_locked(a.lenders)
        log.warning("task %#x: an input lent by %s is gone (%s): sending it again with "
                    "this node's copy", t.task_id, ", ".join(sorted(a.lenders)), err)
        self._home_locked(t, charge=False)
        return True

    def _forget_lenders_locked(self, nodes: set) -> None:
        for name, lent in list(self.lent_copies.items()):
            if lent[0] in nodes:
                del self.lent_copies[name]

    def _on_result_locked(self, h: Any, msg: m.TaskResult) -> None:
        a = self.away.get(msg.task_id)
        if a is not None and a.task.group.actor is not None and h is not None and \
                not {a.node, a.gs} & {h.address, h.peer_id}:
            return  # (an actor's call sent again elsewhere: a late answer from before)
        t = self._take_locked(msg.task_id)
        if t is None:
            return  # a late duplicate: it was retried and finished already
        if a is not None and a.lenders and not msg.ok and \
                self._lender_lost_locked(t, a, msg.payload):
            return
        self._unmet.pop(t.task_id, None)
        self._homeless.pop(t.task_id, None)
        if t.group.actor is not None and self.actor_logs is not None:
            self.actor_logs.ran_locked(t)  # (a placed actor's call: its driver's node's log)
        s = self._s
        s.batch.observe(t.fn_id, msg.duration)
        ok, payload = msg.ok, msg.payload
        ref = _pull.parse_remote(payload) if ok else None
        if ref is not None:  # a large result, lent: pull it into this node's store
            a = self.away[t.task_id] = _Away(t, "", time.monotonic())  # out till pulled
            a.node, a.pulling = ref[1], True
            gid = t.group.group_id
            self._away_per_group[gid] = self._away_per_group.get(gid, 0) + 1
            threading.Thread(target=self._pull_result, args=(t, ref), daemon=True,
                             name="dpool-pull-result").start()
            return
        if ok:  # a large result joins this node's store: its drivers and workers map it
            name = _segment.segment_name(s.store.owner_pid, t.task_id)
            stored = None
            try:
                stored = _inline.into_store(payload, name) or payload
                s.store.adopt(stored)
                payload = stored
            except Exception as exc:  # noqa: BLE001 - e.g. full: the task fails with it
                if stored is not None and stored is not payload:
                    _segment.unlink(name)
                ok, payload = False, _payload.dumps_error(exc)
        s.finish_locked(t, ok, payload)
        g = t.group
        if g.queue:
            self.consider_locked(g)  # room away again: do not wait for the next tick

    def _pull_result(self, t: Task, ref: tuple) -> None:
        """Fetch a lent result (own thread), then finish its task and release the lend."""
        s = self._s
        size, holder, name = ref
        lost: Optional[ObjectLostError] = None
        try:
            payload = _pull.fetch(holder, self.token, name, t.task_id, s.store.owner_pid,
                                  size)
            ok = True
        except ObjectLostError as exc:  # the holder died (part-way) or freed it
            lost = ObjectLostError(
                f"the result of task {t.task_id:#x} is lost: its only copy was on node "
                f"{holder}, which ran the task ({exc})", object_id=t.task_id, node=holder)
            lost.__cause__ = exc
            payload, ok = _payload.dumps_error(lost), False
        except Exception as exc:  # noqa: BLE001 - the task fails with it
            payload, ok = _payload.dumps_error(exc), False
        with s.lock:
            t_away = self._take_locked(t.task_id)
            g = t.group
            if t_away is None:  # the group failed meanwhile: the task is finished
                if ok:
                    _segment.unlink(_values.stored(payload)[1])  # type: ignore[index]
            elif lost is not None and t.attempts < g.max_attempts and g.broken is None:
                # As if the node had died running it (``_lost``): run it again.
                log.warning("%s: running it again", lost)
                self._home_locked(t, charge=True)
            else:
                if ok:
                    try:
                        s.store.adopt(payload)
                    except Exception as exc:  # noqa: BLE001 - e.g. the store is full
                        _segment.unlink(_values.stored(payload)[1])  # type: ignore[index]
                        payload, ok = _payload.dumps_error(exc), False
                if ok:  # the lender keeps its copy until ours is freed (``_freed_locked``)
                    ours = _values.stored(payload)[1]  # type: ignore[index]
                    self.lent_copies[ours] = (holder, name, size, time.monotonic())
                    name = ""
                s.finish_locked(t, ok, payload)
            out = s.take_out_locked()
        s.deliver(out)
        if name:
            self._send(holder, [m.ReleaseLent(name)])
