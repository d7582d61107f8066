"""A task's named states in the local scheduler, and the only transitions between them.

    NEW ──wait──▶ WAITING ──ready──▶ QUEUED ──send──▶ RUNNING ──finish──▶ DONE
     │               ▲                │  ▲  ▲            │
     └──ready────────┼───────────────▶│  │  └──requeue───┘
                     └─────wait───────┘  │
                       QUEUED ──spillback──▶ AWAY ──return──┘

- NEW: made, not yet accepted (``admit_locked``).
- WAITING: an input is not ready, or, found at dispatch, it has no room in the store or
  was lost and is being rebuilt. It holds a reference on each input, no pin.
- QUEUED: every input is ready; it waits in its worker group's queue (or, asking for
  resources, in ``Group.rq``). It pins nothing.
- RUNNING: sent to a worker (in ``WorkerHandle.inflight``: running, or next in the
  worker's batch). Its inputs are pinned.
- AWAY: sent to another node (spillback, ``node._spill``); the other node runs it.
- DONE: its outcome is recorded. Nothing leaves DONE.

Every state may go to DONE (``finish``): a task fails or is cancelled wherever it is. A
transition the table does not list raises ``IllegalTransition``, naming the task, its
state and the event: two parts of the scheduler disagree about where the task is (a task
finished twice, a running task queued again), which is a bug to find, not to absorb.

The table is data: tests read it, and ``transition`` is a list lookup (this is on the path
of every task: three transitions each).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from dpool.scheduling._records import Task

__all__ = ["NEW", "WAITING", "QUEUED", "RUNNING", "AWAY", "DONE", "STATES", "EVENTS",
           "WAIT", "READY", "SEND", "REQUEUE", "SPILLBACK", "RETURN", "FINISH",
           "TRANSITIONS", "NEXT", "IllegalTransition", "transition", "illegal"]

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
NEXT: list[list[int]] = [[-1] * len(EVENTS) for _ in STATES]
for (_state, _event), _to in TRANSITIONS.items():
    NEXT[_state][_event] = _to
del _state, _event, _to


class IllegalTransition(RuntimeError):
    """The scheduler moved a task in a way its state table does not allow."""

    def __init__(self, task_id: int, state: int, event: int) -> None:
        self.task_id = task_id
        self.state = STATES[state]
        self.event = EVENTS[event]
        super().__init__(f"task {task_id:#x} is {self.state}: it cannot take event "
                         f"'{self.event}' (scheduling._states.TRANSITIONS)")


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
