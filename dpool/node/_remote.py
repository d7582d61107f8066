"""Bottom-up scheduling, the executing node's half: running tasks other nodes spilled.

A ``RemoteTask`` placed here runs in a *mirror* of its worker group, one per origin node
and group (same settings, ``max_workers`` at least 1; the origin's working directory and
``sys.path``), under this node's CPU limit; its function and the task get local ids, so
ids of different origins never collide. Mirror groups never spill again and close after
``idle_retire_s`` idle; each tick offers idle CPUs to those with queued tasks.

The origin hears ``Accepted`` at once and ``TaskResult`` when the task is done: the value
inline, or, for a stored result of ``REFERENCE_MIN`` (1 MiB) or more, a reference the
origin pulls; that result is *lent*, kept until the origin says ``ReleaseLent`` or
``lend_timeout_s`` passes. A task the origin points at a result lent from here runs on
that segment (pinned while it runs); if the lend is gone it fails with
``ObjectLostError`` naming this node, and the origin sends it again with its own copy.

Inputs held by another node are pulled into this node's store once (``transfer._pull``,
trying the other copies the object table lists), shared by every task here that needs
them, pinned while one does, and freed when their holder says ``ReleaseLent`` or after
``copy_ttl_s`` unused. ``TasksQuery`` is answered (``TasksKnown``) on the link the results
take, so the answer never overtakes a result sent before it.

Handlers and ``tick_locked`` run under the scheduler's lock; fetching a driver's code or
an input runs on a thread of its own, which takes the lock to run the tasks that waited.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import threading
import time
from typing import Any, Callable, Optional

from dpool.control import ClusterControlStore
from dpool.errors import Error, ObjectLostError, actor_died
from dpool.node._attach import PeerHandle
from dpool.node._remote_actors import RemoteActors
from dpool.node._workdirs import WorkdirCache
from dpool.objects import inline as _inline
from dpool.objects import payload as _payload
from dpool.objects import segment as _segment
from dpool.objects import values as _values
from dpool.protocol import map_path
from dpool.protocol import messages as m
from dpool.scheduling import ActorState, SchedulerAPI, Task, WorkerGroup
from dpool.scheduling import resources as _resources
from dpool.transfer import pull as _pull

log = logging.getLogger("dpool.scheduling")

def _no_one(ok: bool, payload: bytes) -> None:
    """The outcome of a task given back to its origin (``give_back_locked``)."""


_LOCAL_IDS = 1 << 62  # ids of remote tasks and functions here: above drivers' and workers'
REFERENCE_MIN = 1 << 20  # results this large are lent by reference, not sent inline


class _Copy:
    """This node's copy of an input held by another node (being fetched until then)."""

    __slots__ = ("oid", "size", "payload", "error", "last", "released")

    def __init__(self, oid: int, size: int) -> None:
        self.oid = oid
        self.size = size
        self.payload: Optional[bytes] = None
        self.error: Optional[BaseException] = None
        self.last = time.monotonic()
        self.released = False  # the holder freed the object: free the copy once unpinned


class RemoteRunner(RemoteActors):
    def __init__(self, scheduler: SchedulerAPI, node_id: str,
                 send: Callable[[str, list], None], idle_retire_s: float = 30.0,
                 workdirs: Optional[WorkdirCache] = None,
                 fetch_workdir: Optional[Callable[[str], Optional[bytes]]] = None) -> None:
        self._s = scheduler
        self.node_id = node_id
        self._send = send
        self.idle_retire_s = idle_retire_s
        self._ids = itertools.count(_LOCAL_IDS)
        self._groups: dict[tuple, WorkerGroup] = {}  # (origin, group id) -> mirror group
        self._last_used: dict[int, float] = {}
        self._fns: dict[tuple, int] = {}  # (origin, fn id) -> local fn id
        self.mirror_ids: set[int] = set()
        self._origin: dict[int, tuple] = {}  # mirror group id -> (origin, its group id)
        self.workdirs = workdirs
        self.fetch_workdir = fetch_workdir  # digest -> archive (the control store's copy)
        self._fetching: dict[str, list] = {}  # digest -> tasks waiting for its code
        self.token = b""  # the cluster token, for fetching inputs from other nodes
        # The control store (a node in a cluster): the object table lists this node's
        # copies, and a fetch that fails at the holder tries the nodes it lists.
        self.control: Optional[ClusterControlStore] = None
        self._copies: dict[tuple, _Copy] = {}  # remote inputs fetched (or being fetched)
        self._held: list = []  # tasks waiting for their remote inputs
        # An input copy is freed when its holder says it freed the object (ReleaseLent),
        # once no task here has it pinned; or when no task pinned it for this long (a
        # holder that went away without saying so).
        self.copy_ttl_s = 30.0
        self.address = node_id  # where other nodes reach this one (its node id)
        # result segments lent: name -> (local id, since, payload)
        self._lent: dict[str, tuple] = {}
        self.lend_timeout_s = 60.0  # a result not fetched by then is freed
        self._remote: dict[int, tuple] = {}  # local task id -> (origin, its task id)
        self.draining = ""  # why this node takes no more tasks (``give_back_locked``)
        self._relay: dict[int, list] = {}  # actor calls waiting for their actor's node
        # group id -> {this node's id: the origin's} of the calls of actors placed here
        self._calls: dict[int, dict[int, int]] = {}
        self._proxied: set[int] = set()  # calls admitted to a proxy here, not yet answered
        self._hosted: dict[int, int] = {}  # a driver's id of an actor placed here -> ours
        scheduler.register_handler(m.RemoteTask.CODE, self._on_task_locked)
        scheduler.register_handler(m.DropGroup.CODE, self._on_drop_locked)
        scheduler.register_handler(m.ReleaseLent.CODE, self._on_release_lent_locked)
        scheduler.register_handler(m.TasksQuery.CODE, self._on_query_locked)

    def set_id_base(self, base: int) -> None:
        """Ids from ``base`` on (a cluster-unique prefix of the node's)."""
        self._ids = itertools.count(base)

    def is_mirror(self, g: WorkerGroup) -> bool:
        return g.group_id in self.mirror_ids

    def origin_of(self, g: WorkerGroup) -> "tuple | None":
        """(origin node address, the origin's group id) of a mirror group, else None."""
        return self._origin.get(g.group_id)

    def _group_locked(self, msg: m.RemoteTask) -> WorkerGroup:
        key = (msg.origin, msg.group_id)
        g = self._groups.get(key)
        if g is not None and self._s.group(g.group_id) is not None and not g.closed:
            return g
        max_workers, method, initializer, max_tasks, max_attempts = msg.group_cfg
        try:
            ctx = mp.get_context(method or None)
        except ValueError:
            ctx = mp.get_context()
        # (at least one worker: a pool its driver sized at 0 CPUs must not strand its
        # tasks in this node's queue)
        g = WorkerGroup(next(self._ids), max(1, max_workers), ctx, initializer, max_tasks,
                  max_attempts)
        self._paths(g, msg)
        self._groups[key] = g
        self._s.insert_group_locked(g)
        self.mirror_ids.add(g.group_id)
        self._origin[g.group_id] = key
        return g

    def _paths(self, g: WorkerGroup, msg: m.RemoteTask) -> None:
        """``g``'s working directory and ``sys.path``: the origin driver's, or this node's
        copy of its shipped code."""
        g.cwd = msg.cwd
        g.sys_path = list(msg.sys_path)
        if msg.workdir and self.workdirs is not None:
            digest, root = msg.workdir
            here = self.workdirs.path(digest) or root
            g.cwd = map_path(msg.cwd, root, here)
            g.sys_path = [here, *(map_path(p, root, here) for p in msg.sys_path)]
            g.workdir = (digest, here)

    def _on_task_locked(self, h: Any, msg: m.RemoteTask) -> None:
        if isinstance(h, PeerHandle):
            h.tasks_in += 1  # (read with the load it changes: ``ClusterAgent._load``)
        if self.draining and msg.group_cfg:  # (stopping: back to its origin, uncharged)
            self._send(msg.origin, [m.SpillbackRejected(msg.task_id, self.draining)])
            return
        if msg.workdir and self.workdirs is not None and \
                self.workdirs.path(msg.workdir[0]) is None:
            self._send(msg.origin, [m.Accepted(msg.task_id, self.node_id)])
            waiting = self._fetching.get(msg.workdir[0])
            if waiting is not None:
                waiting.append(msg)
                return
            self._fetching[msg.workdir[0]] = [msg]
            threading.Thread(target=self._fetch, args=(msg.workdir[0],), daemon=True,
                             name="dpool-fetch-workdir").start()
            return
        self._run_locked(msg)

    def _fetch(self, digest: str) -> None:
        """Bring a driver's code from the control store, then run what waited for it."""
        s = self._s
        error: Optional[BaseException] = None
        try:
            archive = self.fetch_workdir(digest) if self.fetch_workdir else None
            if archive is None or self.workdirs is None:
                raise Error(f"the driver's working directory {digest} is not in the "
                            "control store (expired or never stored)")
            self.workdirs.add(digest, archive)
        except Exception as exc:  # noqa: BLE001 - reported on each waiting task
            error = exc
        with s.lock:
            waiting = self._fetching.pop(digest, [])
            for msg in waiting:
                if error is None:
                    self._run_locked(msg, accepted=True)
                else:
                    self._send(msg.origin, [m.TaskResult(
                        msg.task_id, False, _payload.dumps_error(error), 0.0)])
            out = s.take_out_locked()
        s.deliver(out)

    # -- large inputs held by other nodes (transfer._pull) ------------------------------
    def _remote_inputs(self, msg: m.RemoteTask) -> dict:
        """The task's inputs that live on another node, by key ("args"|"dep", holder's
        address, segment name, task id or 0) -> size. An argument block is the task's
        own; a dependency is fetched once per node and shared by every task that needs
        it."""
        keys = {}
        ref = _pull.parse_remote(msg.args)
        if ref is not None:
            keys[("args", ref[1], ref[2], msg.task_id)] = ref[0]
        for _oid, ok, p in msg.deps or ():
            ref = _pull.parse_remote(p) if ok else None
            if ref is not None and ref[1] != self.address:  # (own: lent from here)
                keys[("dep", ref[1], ref[2], 0)] = ref[0]
        return keys

    def _own_lent(self, ref: tuple) -> bool:
        """Whether remote reference ``ref`` names a result this node lends: its origin
        pulled it and points the tasks that take it here (``_spillback.lent_copies``)."""
        return ref[1] == self.address and ref[2] in self._lent

    def _start_fetch_locked(self, key: tuple, size: int) -> None:
        if key in self._copies:
            return
        self._copies[key] = _Copy(next(self._ids), size)
        threading.Thread(target=self._fetch_object, args=(key,), daemon=True,
                         name="dpool-fetch-object").start()

    def _fetch_object(self, key: tuple) -> None:
        """Copy one input from its holder into this node's store (own thread), then run
        the tasks that were waiting for it."""
        s = self._s
        kind, address, name, _ = key
        copy = self._copies[key]
        payload: Optional[bytes] = None
        error: Optional[BaseException] = None
        held_oid = _pull._held_id(name)
        others = (lambda: self._other_copies(held_oid)) if kind == "dep" and held_oid \
            else None
        try:
            payload = _pull.fetch(address, self.token, name, copy.oid, s.store.owner_pid,
                                  copy.size, others=others)
        except Exception as exc:  # noqa: BLE001 - reported on each task that needed it
            error = exc
        with s.lock:
            if payload is not None and kind == "dep":
                try:
                    s.store.adopt(payload)  # the node's copy, shared by its tasks
                except Exception as exc:  # noqa: BLE001 - e.g. the store is full
                    _segment.unlink(_values.stored(payload)[1])  # type: ignore[index]
                    payload, error = None, exc
            copy.payload, copy.error, copy.last = payload, error, time.monotonic()
            if payload is not None and kind == "dep" and held_oid and self.control is not None:
                # readers elsewhere may use it (a queued write: under the lock, so that
                # it precedes the drop's remove_copy)
                self.control.add_copy(held_oid, self.node_id)
            held, self._held = self._held, []
            for msg in held:
                self._run_locked(msg, accepted=True)
            out = s.take_out_locked()
        s.deliver(out)

    def _localize_locked(self, msg: m.RemoteTask, keys: dict) -> Optional[m.RemoteTask]:
        """``msg`` with its remote inputs replaced by this node's copies (None: one of
        them could not be fetched; the origin has been told)."""
        s = self._s
        args, deps = msg.args, msg.deps
        failed = next((k for k in keys if self._copies[k].error is not None), None)
        gone = next((ref for _oid, ok, p in msg.deps or () if ok
                     for ref in (_pull.parse_remote(p),)
                     if ref is not None and ref[1] == self.address
                     and ref[2] not in self._lent), None)
        if failed is not None or gone is not None:
            err: BaseException
            if failed is not None:
                copy = self._copies[failed]
                err = copy.error if isinstance(copy.error, ObjectLostError) else \
                    ObjectLostError(f"input {failed[2]} of this task, held by node "
                                    f"{failed[1]}, could not be fetched: {copy.error}")
            elif gone is not None:  # (its origin sends it again with its copy: _spillback)
                err = ObjectLostError(f"input {gone[2]} of this task is no longer lent "
                                      f"by this node", node=self.address)
            for key in keys:  # the task's own argument copy goes with it
                if key[0] == "args":
                    own = self._copies.pop(key)
                    if own.payload is not None:
                        _segment.unlink(_values.stored(own.payload)[1])  # type: ignore[index]
            self._send(msg.origin, [m.TaskResult(msg.task_id, False,
                                                 _payload.dumps_error(err), 0.0)])
            return None
        for key in keys:
            copy = self._copies[key]
            copy.last = time.monotonic()
            if key[0] == "args":
                args = copy.payload
                del self._copies[key]  # the task's own: adopted and dropped with it
        if deps:
            new = []
            for oid, ok, p in deps:
                ref = _pull.parse_remote(p) if ok else None
                if ref is not None and self._own_lent(ref):
                    lid, _since, p = self._lent[ref[2]]
                    self._lent[ref[2]] = (lid, time.monotonic(), p)  # in use: kept longer
                    s.store.pin(p)
                elif ref is not None:
                    p = self._copies[("dep", ref[1], ref[2], 0)].payload
                    s.store.pin(p)  # while this task needs it (unpinned at its finish)
                new.append((oid, ok, p))
            deps = tuple(new)
        return m.RemoteTask(msg.task_id, msg.origin, msg.group_id, msg.group_cfg, msg.fn_id,
                            msg.fn_payload, args, deps, msg.cwd, msg.sys_path, msg.workdir,
                            msg.req)

    def _on_release_lent_locked(self, h: Any, msg: m.ReleaseLent) -> None:
        lent = self._lent.pop(msg.name, None)
        if lent is not None:
            self._s.decref_locked(lent[0])  # the result's only reference was the lend
            return
        # The holder freed an object of its own that this node copied (segment names
        # are unique in the cluster: owner pid and a cluster-unique id).
        for key, copy in self._copies.items():
            if key[0] == "dep" and key[2] == msg.name:
                copy.released = True
        self._drop_idle_copies_locked(time.monotonic())

    def _other_copies(self, held: int) -> list:
        """Nodes the object table lists as keeping a copy of object ``held`` (any
        thread; the holder's own entry among them)."""
        if self.control is None:
            return []
        _size, nodes = self.control.object_locations(held)
        return sorted(n for n in nodes if n != self.node_id)

    def copy_of(self, name: str) -> Optional[str]:
        """This node's copy of another node's segment ``name``, as a segment name here
        (any thread: the node serves it to readers whose holder failed them)."""
        for key, copy in list(self._copies.items()):
            if key[0] == "dep" and key[2] == name and copy.payload is not None:
                stored = _values.stored(copy.payload)
                return stored[1] if stored is not None else None
        return None

    def fetching_locked(self) -> int:
        """Tasks placed here that wait for their driver's code (queued, for the load)."""
        return sum(len(v) for v in self._fetching.values())

    def holds(self) -> tuple:
        """Inputs this node has a copy of now, as placement names them (any thread)."""
        return tuple(f"{k[1]}|{k[2]}" for k, c in list(self._copies.items())
                     if k[0] == "dep" and c.payload is not None)

    def _drop_idle_copies_locked(self, now: float) -> None:
        """Shared copies that no task has pinned are freed once their holder freed the
        object, or after ``copy_ttl_s`` unused."""
        s = self._s
        for key, copy in list(self._copies.items()):
            if key[0] != "dep" or copy.payload is None and copy.error is None:
                continue
            if copy.error is not None or (
                    (copy.released or now - copy.last > self.copy_ttl_s)
                    and not s.store.store.pincount(copy.oid)):
                del self._copies[key]
                if copy.payload is not None:
                    s.store.drop(copy.payload)
                    held = _pull._held_id(key[2])
                    if self.control is not None and held:
                        self.control.remove_copy(held, self.node_id)

    def _run_locked(self, msg: m.RemoteTask, accepted: bool = False) -> None:
        s = self._s
        if self.draining and msg.group_cfg:  # (its code or inputs came after the SIGTERM)
            self._send(msg.origin, [m.SpillbackRejected(msg.task_id, self.draining)])
            return
        if msg.group_cfg[:1] == ("actor",):
            self._host_actor_locked(msg)
            return
        if not msg.group_cfg:  # an actor's call: its proxy here passes it on to its node
            p = s.group(self._hosted.get(msg.group_id, msg.group_id))
            host = p.actor.host if p is not None and p.actor is not None else ""
            if host and p.actor.cfg.max_restarts and p.actor.cfg.boot is not None:  # type: ignore[union-attr]
                host = ""  # a call of a driver's actor placed elsewhere that may be
                # rebuilt: a task of this node's proxy (its log has every call)
            elif host == ActorState.PLACING:  # (its origin knows it is held here)
                if not accepted:
                    self._send(msg.origin, [m.Accepted(msg.task_id, self.node_id)])
                self._relay.setdefault(msg.group_id, []).append(msg)
                return
            if host:
                self._send(host, [msg])  # (its answers go to its origin from there)
                return
        keys = self._remote_inputs(msg)
        if not msg.group_cfg and any(not h.group_cfg and h.group_id == msg.group_id
                                     for h in self._held):
            # an actor's calls run in the order sent: behind one that waits for inputs
            if not accepted:
                self._send(msg.origin, [m.Accepted(msg.task_id, self.node_id)])
            self._held.append(msg)
            return
        if keys:
            if not all(k in self._copies and (self._copies[k].payload is not None or
                                              self._copies[k].error is not None)
                       for k in keys):
                if not accepted:
                    self._send(msg.origin, [m.Accepted(msg.task_id, self.node_id)])
                self._held.append(msg)
                for k, size in keys.items():
                    self._start_fetch_locked(k, size)
                return
            localized = self._localize_locked(msg, keys)
            if localized is None:
                return
            msg = localized
        elif any(ref is not None and ref[1] == self.address
                 for _oid, ok, p in msg.deps or () if ok
                 for ref in (_pull.parse_remote(p),)):
            localized = self._localize_locked(msg, keys)  # inputs lent from here
            if localized is None:
                return
            msg = localized
        if msg.group_cfg:
            g = self._group_locked(msg)
            self._last_used[g.group_id] = time.monotonic()
        else:  # a call of an actor of this node's
            g = s.group(self._hosted.get(msg.group_id, msg.group_id))  # type: ignore[assignment]
            if g is None or g.actor is None or (g.actor.host and not g.actor.cfg.max_restarts):
                err = s.ended_actor(msg.group_id) or _payload.dumps_error(actor_died(
                    f"#{msg.group_id}", f"it is not on node {self.node_id} (it ended, or "
                    "its node restarted)"))
                self._send(msg.origin, [m.TaskResult(msg.task_id, False, err, 0.0)])
                return
        fkey = (msg.origin, msg.fn_id)
        fn_id = self._fns.get(fkey)
        if fn_id is None:
            fn_id = self._fns[fkey] = next(self._ids)
            s.set_function_locked(fn_id, msg.fn_payload)
        local_id = next(self._ids)
        origin, origin_id = msg.origin, msg.task_id

        def done(ok: bool, payload: bytes) -> None:  # outside the lock, on the IO thread
            self._remote.pop(local_id, None)
            self._proxied.discard(local_id)
            stored = _values.stored(payload) if ok else None
            if stored is not None and stored[2] >= REFERENCE_MIN:
                # large: lent by reference; the origin pulls it, then says ReleaseLent
                value = _pull.remote_ref(payload, self.address)
                self._lent[stored[1]] = (local_id, time.monotonic(), payload)
            else:
                try:
                    value = _inline.inline_payload(payload) if ok else payload
                except Exception as exc:  # noqa: BLE001 - the origin must hear *something*
                    ok, value = False, _payload.dumps_error(exc)
                finally:
                    s.release(local_id)  # the origin holds the result now
            self._send(origin, [m.TaskResult(origin_id, ok, value,
                                             s.batch.estimate(fn_id))])

        if not msg.group_cfg and g.actor.cfg.max_restarts and \
                g.actor.cfg.checkpoint_every and g.group_id in self._origin:  # type: ignore[union-attr]
            # a call of an actor placed here that its driver's node may rebuild: a
            # checkpoint says which of that node's calls it holds (``origin_call``)
            self._calls.setdefault(g.group_id, {})[local_id] = origin_id
        elif not msg.group_cfg and g.actor.host:  # type: ignore[union-attr]
            self._proxied.add(local_id)  # (passed on by this node's proxy: it has it)
        t = Task(local_id, fn_id, msg.args, None, g, None, done)
        if msg.req is not None:  # the global scheduler chose this node for it
            t.req = _resources.from_wire(msg.req)
        t.started = True  # no future to move to RUNNING: ``done`` is a plain callback
        self._remote[local_id] = (origin, origin_id)
        t.deps = msg.deps
        if not accepted:
            self._send(origin, [m.Accepted(origin_id, self.node_id)])
        # timelines: this task runs the origin's task ``origin_id`` (worker-id field)
        s.control.log_event(local_id, "remote", time.time(), origin_id)
        s.admit_locked(t)

    def give_back_locked(self, reason: str, running_too: bool) -> int:
        """A stopping node (SIGTERM) hands other nodes' tasks back to their origins, which
        run them again elsewhere uncharged (``SpillbackRejected``): those not started
        yet, and with ``running_too`` (its grace period over) those still running, whose
        outcome is then no one's. Actors' calls stay (the actor ends with the node).
        Returns how many went back."""
        n = 0
        waiting = [*self._held, *(x for v in self._fetching.values() for x in v)]
        for msg in waiting:  # (not admitted yet: their inputs or code were on the way)
            if msg.group_cfg:
                self._send(msg.origin, [m.SpillbackRejected(msg.task_id, reason)])
                n += 1
        self._held = [x for x in self._held if not x.group_cfg]
        for digest, v in list(self._fetching.items()):
            self._fetching[digest] = [x for x in v if not x.group_cfg]
        for g in list(self._groups.values()):
            if g.actor is not None:
                continue
            for q in (g.queue, *g.by_request.values()):
                for t in [t for t in q if t.task_id in self._remote]:
                    q.remove(t)
                    self._give_back_locked(t, reason)
                    self._s.finish_locked(t, False, _payload.dumps_error(Error(reason)))
                    n += 1
            if running_too:
                for w in g.workers:
                    for t in list(w.inflight.values()):
                        if t.task_id in self._remote:
                            self._give_back_locked(t, reason)
                            n += 1
        return n

    def _give_back_locked(self, t: Task, reason: str) -> None:
        origin, origin_id = self._remote.pop(t.task_id)
        t.future = _no_one  # (its outcome, if it comes, is sent to no one)
        self._send(origin, [m.SpillbackRejected(origin_id, reason)])

    def _on_query_locked(self, h: Any, msg: m.TasksQuery) -> None:
        """The origin asks which of the tasks this node accepted from it are still here
        (``_spillback``'s safety net): answered on the link its results take, after them."""
        have = self.tasks_of_locked(msg.origin)
        known = tuple(t for t in msg.task_ids if t in have)
        unknown = tuple(t for t in msg.task_ids if t not in have)
        if unknown:
            log.warning("node %s asked for tasks this node has no trace of: %s",
                        msg.origin, ", ".join(f"{t:#x}" for t in unknown))
        self._send(msg.origin, [m.TasksKnown(self.node_id, known, unknown)])

    def tasks_of_locked(self, origin: str) -> set:
        """The ids (the origin's) of the tasks of ``origin`` this node has now: waiting
        for their code or inputs, queued or waiting for resources in a mirror group, or
        running on one of its workers. A task admitted here but in none of those is
        lost, whatever its record says."""
        ids = {msg.task_id for msg in self._held if msg.origin == origin}
        ids.update(msg.task_id for msgs in self._relay.values() for msg in msgs
                   if msg.origin == origin)
        ids.update(msg.task_id for waiting in self._fetching.values() for msg in waiting
                   if msg.origin == origin)
        here: set = set(list(self._proxied))
        for g in list(self._s.groups_locked()):
            if self._origin.get(g.group_id, ("",))[0] != origin and g.actor is None:
                continue  # (an actor's calls may come from any node)
            here.update(t.task_id for t in g.queue)
            if g.actor is not None:
                here.update(t.task_id for t in g.actor.order)
            for waiting in g.by_request.values():
                here.update(t.task_id for t in waiting)
            for w in g.workers:
                here.update(w.inflight)
        ids.update(oid for lid, (o, oid) in list(self._remote.items())
                   if o == origin and lid in here)
        return ids

    def _on_drop_locked(self, h: Any, msg: m.DropGroup) -> None:
        """The origin's group is gone: terminate its mirror here (lock held, so in a
        thread: terminating takes the lock and waits for workers)."""
        g = self._groups.pop((msg.origin, msg.group_id), None)
        if g is not None:
            self._forget_locked(g)
            threading.Thread(target=self._s.terminate_group, args=(g, msg.reason),
                             daemon=True, name="dpool-drop-group").start()

    def _forget_locked(self, g: WorkerGroup) -> None:
        """A mirror group ends: drop what this runner kept for it."""
        self._last_used.pop(g.group_id, None)
        self._origin.pop(g.group_id, None)
        self.mirror_ids.discard(g.group_id)

    def tick_locked(self) -> None:
        """Retire mirror groups idle for a while, free idle input copies."""
        now = time.monotonic()
        self._drop_idle_copies_locked(now)
        for name, (oid, since, _p) in list(self._lent.items()):
            if now - since > self.lend_timeout_s:  # the origin never came for it
                del self._lent[name]
                self._s.decref_locked(oid)
        for key, g in list(self._groups.items()):
            if g.outstanding == 0 and now - self._last_used.get(g.group_id, now) \
                    > self.idle_retire_s:
                del self._groups[key]
                self._forget_locked(g)
                self._s.close_group_locked(g)  # (idle: its workers stop now)
        s = self._s
        limit = s.cpu_limit
        if (limit is None or s.busy_cpus_locked() < limit) \
                and any(g.queue for g in self._groups.values()):
            s.cpu_freed_locked()  # (dispatched on the IO thread's next tick)
