"""The states of a task and of a worker in the local scheduler, and the only transitions
between them (``TRANSITIONS``; ``WORKER_TRANSITIONS``, drawn further down). The tables are
data: tests read them. A transition is a list lookup, made under the scheduler's lock.

                     ┌──────wait──────┐  ┌────requeue────┐
                     ▼                │  ▼               │
    NEW ──wait──▶ WAITING ──ready──▶ QUEUED ──send──▶ RUNNING ──finish──▶ DONE
     │                               ▲ ▲ │
     └─────────────ready─────────────┘ │ │
                                       │ └───spillback──▶ AWAY
                                       └───────return──────┘

- NEW: made, not yet accepted (``admit_locked``).
- WAITING: an input is not ready; or, found when it was about to be sent, an input has no
  room in the store or was lost and is being rebuilt. It holds a reference on each input.
- QUEUED: every input is ready; it waits in its worker group's queue (or, asking for
  resources, in ``WorkerGroup.by_request``). Its inputs are not pinned, unless it ran
  before (``requeue`` keeps its pins).
- RUNNING: sent to a worker (in ``WorkerHandle.inflight``: running, or next in the
  worker's batch). Its inputs are pinned (``pin_inputs_locked``).
- AWAY: sent to another node (spillback, ``node._spillback``); the other node runs it.
- DONE: its outcome is recorded. Nothing leaves DONE.

Every state but DONE may go to DONE (``finish``): a task fails or is cancelled wherever it
is. A stored argument block is pinned from ``admit_locked`` until DONE, whatever the state.
A transition the table does not list raises ``IllegalTransition``, naming the task, its
state and the event: two parts of the scheduler disagree about where the task is (a task
finished twice, a running task queued again), a bug to find, not to absorb.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from dpool.scheduling._records import Task, WorkerHandle

__all__ = ["NEW", "WAITING", "QUEUED", "RUNNING", "AWAY", "DONE", "STATES", "EVENTS",
           "WAIT", "READY", "SEND", "REQUEUE", "SPILLBACK", "RETURN", "FINISH",
           "TRANSITIONS", "NEXT", "IllegalTransition", "transition", "illegal",
           "W_STARTING", "W_READY", "W_STOPPING", "W_DEAD", "WORKER_STATES", "HELLO", "STOP",
           "CLOSED", "WORKER_EVENTS", "WORKER_TRANSITIONS", "IllegalWorkerTransition",
           "worker_transition"]

# states (small ints: a slot compare on the hot path)
NEW, WAITING, QUEUED, RUNNING, AWAY, DONE = range(6)
STATES = ("new", "waiting", "queued", "running", "away", "done")

# events
WAIT, READY, SEND, REQUEUE, SPILLBACK, RETURN, FINISH = range(7)
EVENTS = ("wait", "ready", "send", "requeue", "spillback", "return", "finish")

# (state, event) -> next state: the only legal moves
TRANSITIONS: dict[tuple[int, int], int] = {
    (NEW, WAIT): WAITING,  # admitted with an input not ready
    (NEW, READY): QUEUED,  # admitted with every input ready
    (WAITING, READY): QUEUED,  # its last input became ready (or room came)
    (QUEUED, SEND): RUNNING,  # sent to a worker; inputs pinned
    (QUEUED, WAIT): WAITING,  # at dispatch: an input found no room, or was lost
    (QUEUED, SPILLBACK): AWAY,  # sent to another node
    (RUNNING, REQUEUE): QUEUED,  # its worker died (attempts left) or handed it back
    (AWAY, RETURN): QUEUED,  # came back: no node took it, or the node was lost
    (NEW, FINISH): DONE,
    (WAITING, FINISH): DONE,
    (QUEUED, FINISH): DONE,
    (RUNNING, FINISH): DONE,
    (AWAY, FINISH): DONE,
}

# NEXT[state][event]: the next state, -1 if illegal (hot call sites look it up inline)
def _next_table(transitions: dict[tuple[int, int], int], states: tuple,
                events: tuple) -> list[list[int]]:
    """``table[state][event]``: the next state, -1 where ``transitions`` has no move."""
    table = [[-1] * len(events) for _ in states]
    for (state, event), to in transitions.items():
        table[state][event] = to
    return table


NEXT = _next_table(TRANSITIONS, STATES, EVENTS)


class IllegalTransition(RuntimeError):
    """The scheduler moved a task in a way its state table does not allow."""

    _what: str = "task"
    _states: tuple[str, ...] = STATES
    _events: tuple[str, ...] = EVENTS
    _table: str = "TRANSITIONS"

    def __init__(self, task_id: int, state: int, event: int) -> None:
        self.task_id = task_id  # (a worker's id, for a worker)
        self.state = self._states[state]
        self.event = self._events[event]
        shown = f"{task_id:#x}" if self._what == "task" else str(task_id)
        super().__init__(f"{self._what} {shown} is {self.state}: it cannot take event "
                         f"'{self.event}' (scheduling._states.{self._table})")


def transition(t: Task, event: int) -> int:
    """Move ``t`` on ``event``; returns the state it left. Raises ``IllegalTransition``."""
    state = t.state
    to = NEXT[state][event]
    if to < 0:
        raise IllegalTransition(t.task_id, state, event)
    t.state = to
    return state


def illegal(t: Task, event: int) -> IllegalTransition:
    """The error for ``t`` taking ``event`` (for call sites that check inline)."""
    return IllegalTransition(t.task_id, t.state, event)


# -- workers ------------------------------------------------------------------------------
#
#     STARTING ──hello──▶ READY ──stop──▶ STOPPING ──closed──▶ DEAD
#      │   │                │               ▲                   ▲ ▲
#      │   └─────stop───────┼───────────────┘                   │ │
#      │                    └─────────────────────closed────────┘ │
#      └──────────────────────────────────────────closed──────────┘
#
# - STARTING: its process was started; it has not said Hello (its initializer runs). It
#   may be sent tasks already; one that dies now never started a task, and no task is
#   charged for it (``_START_FAILURES`` such deaths in a row break its group).
# - READY: it said Hello; it runs what it is sent.
# - STOPPING: told to exit (its group retired or was terminated, the runtime stopped, or
#   it was retired: to change what GPUs it sees, or to free a process slot); it takes no
#   task. A Hello that crosses the order leaves it STOPPING.
# - DEAD: its socket closed and its process was reaped; it is gone from its group.
#
# Conditions a STARTING or READY worker may be in besides (flags of ``WorkerHandle``, not
# states: each combines with the others): ``blocked`` (in a nested wait: its CPU is given
# back), ``retiring`` (``max_tasks_per_child`` reached: it exits after what it holds),
# ``leased`` (lent to an attached driver, which sends its tasks), ``fenced`` (takes no
# task without a resource request).

W_STARTING, W_READY, W_STOPPING, W_DEAD = range(4)
WORKER_STATES = ("starting", "ready", "stopping", "dead")
HELLO, STOP, CLOSED = range(3)
WORKER_EVENTS = ("hello", "stop", "closed")

WORKER_TRANSITIONS: dict[tuple[int, int], int] = {
    (W_STARTING, HELLO): W_READY,
    (W_STARTING, STOP): W_STOPPING,
    (W_READY, STOP): W_STOPPING,
    (W_STOPPING, HELLO): W_STOPPING,  # (it said Hello before it read the order to stop)
    (W_STARTING, CLOSED): W_DEAD,  # it died starting
    (W_READY, CLOSED): W_DEAD,  # it died
    (W_STOPPING, CLOSED): W_DEAD,  # it exited as told
}
_WORKER_NEXT = _next_table(WORKER_TRANSITIONS, WORKER_STATES, WORKER_EVENTS)


class IllegalWorkerTransition(IllegalTransition):
    """The scheduler moved a worker in a way its state table does not allow."""

    _what, _states, _events, _table = ("worker", WORKER_STATES, WORKER_EVENTS,
                                       "WORKER_TRANSITIONS")


def worker_transition(w: WorkerHandle, event: int) -> int:
    """Move worker ``w`` on ``event``; returns the state it left."""
    state = w.state
    to = _WORKER_NEXT[state][event]
    if to < 0:
        raise IllegalWorkerTransition(w.worker_id, state, event)
    w.state = to
    return state
