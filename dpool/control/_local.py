"""In-process control store: the single-host implementation of ``ControlStore``.

Writers append ``(op, args)`` to a deque (one C-level append, safe from any thread);
``flush`` -- called by the scheduler's IO loop when it is idle or the backlog is large --
applies them to plain dicts. The task table keeps a row while its result object is alive
(that is the lineage needed to rebuild it) and drops it with the object; the event log is
a bounded ring.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable

from dpool.control._task_record import TaskRecord

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Optional

EVENT_LOG_SIZE = 200_000


class InProcessControlStore:
    def __init__(self, event_log_size: int = EVENT_LOG_SIZE) -> None:
        self._ops: collections.deque = collections.deque()
        self._apply_lock = threading.Lock()
        self._functions: dict[int, tuple[str, bytes]] = {}
        self._tasks: dict[int, tuple] = {}  # task id -> (add_task op, state, attempts)
        self._edges: dict[int, int] = {}  # an actor's call -> the call before it
        self._objects: dict[int, tuple[int, str]] = {}
        self._events: collections.deque = collections.deque(maxlen=event_log_size)
        self._push = self._ops.append

    # -- writes: each is one deque append on the caller's side ---------------------------
    def register_function(self, fn_id: int, name: str, payload: bytes) -> None:
        self._push((0, fn_id, name, payload))

    def add_task(self, task_id: int, fn_id: int, args: Optional[bytes], dep_ids: Optional[tuple],
                 group_id: int, at: Optional[float] = None, worker_id: int = 0) -> None:
        self._push((1, task_id, fn_id, args, dep_ids, group_id, at, worker_id))

    def set_task_state(self, task_id: int, state: str, attempts: int,
                       at: Optional[float] = None, error: Optional[bytes] = None,
                       size: Optional[int] = None) -> None:
        self._push((2, task_id, state, attempts, at))  # (no traceback kept on one host)

    def add_call_edge(self, task_id: int, after: int) -> None:
        self._push((9, task_id, after))

    def add_object(self, object_id: int, size: int, location: str) -> None:
        self._push((3, object_id, size, location))

    def remove_object(self, object_id: int) -> None:
        self._push((4, object_id))

    def log_event(self, task_id: int, kind: str, t: float, worker_id: int) -> None:
        self._push((5, task_id, kind, t, worker_id))

    def backlog(self) -> int:
        return len(self._ops)

    def flush(self) -> None:
        ops = self._ops
        tasks = self._tasks
        events = self._events
        with self._apply_lock:
            while ops:
                op = ops.popleft()
                code = op[0]
                if code == 5:
                    events.append(op)
                elif code == 1:
                    # a TaskRecord is built on read; tuples of plain values are not
                    # tracked by the garbage collector, so 100k rows cost it nothing
                    tasks[op[1]] = (op, "PENDING", 0)
                    if op[6] is not None:  # (the function's id kept for timelines)
                        events.append((5, op[1], "submit", op[6], op[7], op[2]))
                elif code == 2:
                    rec = tasks.get(op[1])
                    if rec is not None:
                        tasks[op[1]] = (rec[0], op[2], op[3])
                    if op[4] is not None:
                        events.append((5, op[1], "end" if op[2] == "FINISHED" else "error",
                                       op[4], 0))
                elif code == 0:
                    self._functions[op[1]] = (op[2], op[3])
                elif code == 3:
                    self._objects[op[1]] = (op[2], op[3])
                elif code == 4:
                    self._objects.pop(op[1], None)
                    tasks.pop(op[1], None)  # lineage no longer needed
                    self._edges.pop(op[1], None)
                elif code == 9:
                    self._edges[op[1]] = op[2]
                else:  # pragma: no cover - guards edits above
                    raise ValueError(f"unknown control-store op {code}")

    # -- reads ---------------------------------------------------------------------------
    def get_task(self, task_id: int) -> Optional[TaskRecord]:
        self.flush()
        rec = self._tasks.get(task_id)
        if rec is None:
            return None
        (_, tid, fn_id, args, dep_ids, group_id, _at, _w), state, attempts = rec
        return TaskRecord(tid, fn_id, args, dep_ids or (), group_id, state, attempts, (tid,),
                          self._edges.get(tid, 0))

    def get_function(self, fn_id: int) -> Optional[bytes]:
        self.flush()
        entry = self._functions.get(fn_id)
        return entry[1] if entry else None

    def get_object(self, object_id: int) -> Optional[tuple[int, str]]:
        self.flush()
        return self._objects.get(object_id)

    def events(self) -> list[tuple[int, str, float, int]]:
        self.flush()
        return [op[1:5] for op in self._events]

    def event_log(self, since: Optional[float] = None
                  ) -> tuple[list[tuple[int, str, float, int, str]], dict[int, int]]:
        """As ``RedisControlStore.event_log``: the events (since ``since``) with the node
        that logged them ("" here: one host), and each submitted task's function id."""
        self.flush()
        out = []
        fns = {}
        for op in list(self._events):
            if since is not None and op[3] < since:
                continue
            out.append((op[1], op[2], op[3], op[4], ""))
            if len(op) > 5:
                fns[op[1]] = op[5]
        return out, fns

    def function_names(self, fn_ids: Iterable[int]) -> dict[int, str]:
        """The registered name of each function (unnamed or unknown ones left out)."""
        self.flush()
        functions = self._functions
        return {fid: functions[fid][0] for fid in set(fn_ids)
                if fid in functions and functions[fid][0]}
