"""A ``SchedulerAPI`` without processes or sockets, for unit tests of the node's services.

Groups, tasks and objects are the scheduler's real records; what the scheduler would do
with them (finish a task, send messages, requeue, dispatch) is recorded instead, so a
test drives a service's decision and reads what it asked for. The fake implements every
member of ``SchedulerAPI`` (``tests/node`` checks it), so it cannot drift from the API.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import threading
from collections.abc import ValuesView
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, Optional

from dpool.control import InProcessControlStore
from dpool.protocol import _messages as m
from dpool.scheduling import BatchPolicy, ObjectEntry, Task, WorkerGroup, WorkerHandle
from dpool.scheduling._api import (
    ActorService,
    DriverService,
    Handler,
    LeaseService,
    SpillbackService,
)
from dpool.scheduling._resources import Ledger


class FakeStore:
    """The host store's calls the services make, recorded; values are never stored."""

    def __init__(self) -> None:
        self.owner_pid = 4242
        self.capacity = 1 << 30
        self.store = SimpleNamespace(used=0)
        self.on_freed: Any = None
        self.unlinked: list[str] = []
        self.adopted: list[bytes] = []

    def restore_payload(self, payload: bytes) -> None:
        pass

    def adopt(self, payload: Optional[bytes]) -> None:
        if payload is not None:
            self.adopted.append(payload)

    def discard(self, payload: Optional[bytes]) -> None:
        pass

    def unlink_unadopted(self, name: str) -> None:
        self.unlinked.append(name)


class FakeIO:
    def __init__(self) -> None:
        self.added: list = []

    def add(self, handle: Any) -> None:
        self.added.append(handle)

    def want_write(self, handle: Any) -> None:
        pass


class FakeScheduler:
    def __init__(self, cpu_limit: Optional[int] = 4) -> None:
        self.lock = threading.Lock()
        self.io = FakeIO()
        self.store = FakeStore()
        self.batch = BatchPolicy()
        self.control = InProcessControlStore()
        self.cpu_limit = cpu_limit
        self.closed = False
        self.busy = 0  # what busy_cpus_locked says
        self.groups: dict[int, WorkerGroup] = {}
        self.functions: dict[int, bytes] = {}
        self.objects: dict[int, ObjectEntry] = {}
        # the scheduler's own handlers, which services may wrap
        self.handlers: dict[int, Handler] = {
            m.SubmitTask.CODE: lambda w, msg: self.submitted.append(msg),
            m.PutObject.CODE: lambda w, msg: self.put.append(msg),
        }
        self.sessions: Optional[DriverService] = None
        self.spillback: Optional[SpillbackService] = None
        self.leases: Optional[LeaseService] = None
        self.actors: Optional[ActorService] = None
        # what was asked of it
        self.submitted: list = []
        self.put: list = []
        self.sent: list[tuple[Any, list]] = []
        self.finished: list[tuple[Task, bool, bytes]] = []
        self.returned: list[Task] = []  # return_task_locked: back at the head of the queue
        self.unrunnable: list[tuple[Task, str]] = []
        self.closed_groups: list[WorkerGroup] = []
        self.failed_groups: list[tuple[WorkerGroup, str]] = []
        self.dropped_handles: list[WorkerHandle] = []
        self.released: list[int] = []

    # -- plugging in -------------------------------------------------------------------
    def register_handler(self, code: int, handler: Handler) -> Optional[Handler]:
        old = self.handlers.get(code)
        self.handlers[code] = handler
        return old

    def attach_services(self, *, sessions: Optional[DriverService] = None,
                        spillback: Optional[SpillbackService] = None,
                        leases: Optional[LeaseService] = None,
                        actors: Optional[ActorService] = None) -> None:
        self.sessions = sessions or self.sessions
        self.spillback = spillback or self.spillback
        self.leases = leases or self.leases
        self.actors = actors or self.actors

    def set_control(self, control: Any) -> None:
        self.control = control

    # -- any thread --------------------------------------------------------------------
    def group(self, group_id: int) -> Optional[WorkerGroup]:
        return self.groups.get(group_id)

    def function_payload(self, fn_id: int) -> bytes:
        return self.functions[fn_id]

    def deliver(self, out: list) -> None:
        pass

    def release(self, object_id: int) -> None:
        self.released.append(object_id)

    def ended_actor(self, group_id: int) -> Optional[bytes]:
        return None

    def find_actor(self, name: str) -> Optional[tuple]:
        return None

    def name_actor(self, name: str, record: tuple) -> bool:
        return True

    def terminate_group(self, group: WorkerGroup, reason: str) -> None:
        self.failed_groups.append((group, reason))

    def wait_group_exited(self, group: WorkerGroup, timeout: float = 30.0) -> None:
        pass

    # -- lock held ---------------------------------------------------------------------
    def groups_locked(self) -> ValuesView[WorkerGroup]:
        return self.groups.values()

    def insert_group_locked(self, g: WorkerGroup) -> None:
        self.groups[g.group_id] = g

    def close_group_locked(self, g: WorkerGroup) -> None:
        g.closed = True
        self.closed_groups.append(g)

    def kill_actor_locked(self, g: WorkerGroup, reason: str) -> bool:
        self.failed_groups.append((g, reason))
        return True

    def actor_ran_locked(self, t: Task) -> None:
        g = t.group
        g.actor.log.append((t.fn_id, t.args, t.deps))  # type: ignore[union-attr]

    def actor_saved_locked(self, g: WorkerGroup, state: bytes, calls: int) -> None:
        g.actor.checkpoint = state  # type: ignore[union-attr]
        del g.actor.log[:calls]  # type: ignore[union-attr]

    def actor_boot_locked(self, g: WorkerGroup, inline: bool) -> bytes:
        return repr((g.actor.checkpoint, g.actor.log, inline)).encode()  # type: ignore[union-attr]

    def break_group_locked(self, g: WorkerGroup, reason: str) -> None:
        self.fail_group_locked(g, reason)

    def fail_group_locked(self, g: WorkerGroup, reason: str) -> None:
        self.failed_groups.append((g, reason))

    def admit_locked(self, t: Task) -> None:
        t.group.queue.append(t)

    def finish_locked(self, t: Task, ok: bool, payload: bytes, counted: bool = True) -> None:
        self.finished.append((t, ok, payload))

    def skip_cancelled_locked(self, t: Task) -> None:
        t.future = None
        self.finished.append((t, False, b"cancelled"))

    def fail_unmet_locked(self, t: Task, reason: str) -> None:
        self.unrunnable.append((t, reason))

    def inputs_locked(self, t: Task) -> tuple:
        return t.deps or ()

    def away_locked(self, t: Task) -> None:
        pass  # (its tasks are put in queues directly: they have no state to move)

    def back_locked(self, t: Task) -> None:
        pass

    def return_task_locked(self, t: Task) -> None:
        t.group.queue.appendleft(t)
        self.returned.append(t)

    def cpu_freed_locked(self) -> None:
        pass

    def busy_cpus_locked(self) -> int:
        return self.busy

    def hold_bundle_locked(self, pg_id: int, index: int, req: Any,
                           host_cpus: int = 0) -> Optional[str]:
        return "the fake scheduler holds no bundle"

    def bundles_held_locked(self) -> list:
        return []

    def free_bundles_locked(self, pg_id: int, index: Optional[int] = None) -> int:
        return 0

    def resources_locked(self) -> Ledger:
        return Ledger()

    def set_function_locked(self, fn_id: int, payload: bytes) -> None:
        self.functions[fn_id] = payload

    def spawn_locked(self, g: WorkerGroup, gpus: Optional[tuple] = None,
                     lease: Optional[socket.socket] = None) -> WorkerHandle:
        raise OSError("a fake scheduler starts no process")

    def send_locked(self, w: WorkerHandle, msgs: list) -> None:
        self.sent.append((w, list(msgs)))

    def take_out_locked(self) -> list:
        return []

    def drop_handles_locked(self, w: WorkerHandle) -> None:
        self.dropped_handles.append(w)

    def object_locked(self, oid: int) -> Optional[ObjectEntry]:
        return self.objects.get(oid)

    def pending_object_locked(self, oid: int) -> ObjectEntry:
        obj = self.objects[oid] = ObjectEntry()
        obj.refs = 1
        return obj

    def resolve_object_locked(self, oid: int, ok: bool, payload: bytes) -> None:
        obj = self.objects[oid]
        obj.ready, obj.ok, obj.payload = True, ok, payload

    def take_object_locked(self, oid: int) -> Optional[ObjectEntry]:
        return self.objects.pop(oid, None)

    def decref_locked(self, oid: int, n: int = 1) -> None:
        obj = self.objects.get(oid)
        if obj is not None:
            obj.refs -= n

    # -- building records for a test ---------------------------------------------------
    def new_group(self, group_id: int = 1, max_workers: int = 4,
                  max_attempts: int = 3) -> WorkerGroup:
        g = WorkerGroup(group_id, max_workers, mp.get_context(), None, None, max_attempts)
        self.groups[group_id] = g
        return g

    def queue_tasks(self, g: WorkerGroup, task_ids: range, fn_id: int = 7) -> list[Task]:
        self.functions.setdefault(fn_id, b"fn")
        tasks = [Task(tid, fn_id, b"args", None, g, None, Future()) for tid in task_ids]
        g.queue.extend(tasks)
        return tasks
