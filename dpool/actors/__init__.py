"""Actors: stateful workers whose method calls return futures (``executor.actor``).

- ``_handle``: ``ActorHandle`` and ``ActorMethod`` (calling an actor from a driver, a
  task or another actor), ``create`` (``executor.actor``), ``get_actor``, ``kill``,
  ``readonly``.
- ``_in_actor``: what runs in the actor's process: its boot (constructor, or checkpoint,
  then the replay of a restart) and ``MethodCall``, the function of a call.

The scheduler's side -- one worker per actor, calls in order, the log of calls a restart
replays -- is ``dpool.scheduling._actors``.
"""

from dpool._lazy import front_door

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from dpool.actors._handle import (
        ACTOR_OPTIONS,
        ActorHandle,
        ActorMethod,
        create,
        get_actor,
        kill,
        readonly,
        run_in_actor,
    )

_LAZY = dict.fromkeys(("ACTOR_OPTIONS", "ActorHandle", "ActorMethod", "create", "get_actor",
                       "kill", "readonly", "run_in_actor"), "dpool.actors._handle")
_MODULES: dict = {}

__all__ = ["ACTOR_OPTIONS", "ActorHandle", "ActorMethod", "create", "get_actor", "kill",
           "readonly", "run_in_actor"]

__getattr__, __dir__ = front_door(__name__, _LAZY, _MODULES)
