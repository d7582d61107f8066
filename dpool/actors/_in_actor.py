"""What runs in an actor's process: its boot and its method calls.

The actor's worker runs ``boot`` as its initializer (before it says Hello, so no call
starts before the instance exists): the instance comes from a checkpoint (a pickled
instance: ``__getstate__``/``__setstate__`` apply) or from the constructor, then the
recorded calls of a restart are replayed in order, their outcomes dropped (a call that
raised the first time raises again; a ``@dpool.readonly`` method is skipped). A call is a
task whose function is a ``MethodCall``: it runs the method on the instance.

With ``max_concurrency=N`` the worker runs up to N calls at once, on threads (they start
in order). With ``checkpoint_every=N``, after every N calls of methods that are not read-only the
worker sends the results it holds, then ``ActorCheckpoint`` with the pickled instance: a
restart replays only the calls after it.
"""

from __future__ import annotations

from dpool.objects import payload as _payload
from dpool.protocol import messages as m
from dpool.runtime import current as _current

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

_instance: Any = None  # the actor's instance, in its process
_every = 0  # checkpoint after this many calls (0: never)
_since = 0  # calls since the last checkpoint


class MethodCall:
    """The function of an actor call: ``name`` on the process's actor instance."""

    __slots__ = ("name", "readonly", "__weakref__")

    def __init__(self, name: str, readonly: bool) -> None:
        self.name = name
        self.readonly = readonly

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        global _since
        instance = _instance
        if instance is None:
            raise RuntimeError(f"actor method {self.name!r} called outside its actor")
        if _every and not self.readonly:
            _since += 1
        return getattr(instance, self.name)(*args, **kwargs)

    def __reduce__(self) -> tuple:
        return (method_call, (self.name, self.readonly))

    def __repr__(self) -> str:
        return f"<actor method {self.name}>"


_calls: dict[tuple[str, bool], MethodCall] = {}


def method_call(name: str, readonly: bool = False) -> MethodCall:
    """The one ``MethodCall`` of this process for ``name`` (so that its function id, which
    the driver gives it on first use, is the same for every call)."""
    key = (name, readonly)
    call = _calls.get(key)
    if call is None:
        call = _calls[key] = MethodCall(name, readonly)
    return call


def is_readonly(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` (a method) is marked ``@dpool.readonly``."""
    return bool(getattr(fn, "__dpool_readonly__", False))


def boot(ctor: bytes, checkpoint: Optional[bytes], replay: list, every: int,
         concurrency: int = 1) -> None:
    """The actor worker's initializer (see the module docstring)."""
    global _instance, _every, _since
    if checkpoint is not None:
        _instance = _payload.loads(checkpoint)
    else:
        cls, args, kwargs = _payload.loads(ctor)
        _instance = cls(*args, **kwargs)
    replayed = 0
    for fn_payload, args_payload, deps in replay:
        fn = _payload.loads(fn_payload)
        if getattr(fn, "readonly", False):
            continue
        try:
            args, kwargs = ((), {}) if args_payload is None else _payload.loads(args_payload)
            if deps:
                args, kwargs = _payload.resolve_inputs(args, kwargs, deps)
            fn(*args, **kwargs)
        except Exception:  # noqa: BLE001, S110 - it raised when it first ran too
            pass
        replayed += 1
    _every = every
    _since = replayed % every if every else 0
    worker = _current.this_worker()
    if worker is not None:
        if every:
            worker.after_task = _maybe_checkpoint
        if concurrency > 1:
            worker.run_concurrently(concurrency)


def _maybe_checkpoint(worker: Any) -> None:
    """After a call: every ``_every`` calls, the state, after the results it follows."""
    global _since
    if _since < _every:
        return
    _since = 0
    worker.flush()  # (the calls' callers first: taking the state is off their path)
    worker.send([m.ActorCheckpoint(_payload.dumps(_instance))])
