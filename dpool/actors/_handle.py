"""Actor handles: how a driver, a task or another actor calls an actor.

``executor.actor(cls, *args, **kwargs)`` (``create``) makes a worker group of one worker
for the actor (``scheduling._actors``) and returns an ``ActorHandle``. Each public method
of ``cls`` is an ``ActorMethod`` of the handle: ``handle.step.submit(x)`` returns a
future (the executor's kind: a ``concurrent.futures.Future``) and ``handle.step(x)``
waits for it, as a ``multiprocessing.Manager`` proxy's method does. A handle pickles into
tasks and other actors as the group's id; there its calls go through the worker's client,
on the same scheduler.
"""

from __future__ import annotations

import threading
import weakref

from dpool import errors
from dpool.actors._in_actor import boot, is_readonly, method_call
from dpool.objects import payload as _payload
from dpool.runtime import current as _current
from dpool.scheduling import ActorConfig, WorkerGroupConfig

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

    from dpool._executor_core import ExecutorCore
    from dpool._task_future import TaskFuture

ACTOR_OPTIONS = ("name", "lifetime", "max_restarts", "checkpoint_every", "max_concurrency")

_named: dict[str, ActorHandle] = {}  # name= -> its handle (this driver's actors)
_named_lock = threading.Lock()


class ActorMethod:
    """One method of an actor, through a handle: ``submit`` it, or call it and wait."""

    __slots__ = ("_handle", "_call", "__name__")

    def __init__(self, handle: ActorHandle, name: str, readonly: bool) -> None:
        self._handle = handle
        self._call = method_call(name, readonly)
        self.__name__ = name

    def submit(self, *args: Any, **kwargs: Any) -> TaskFuture:
        """Queue a call of this method; returns a future of its outcome. Calls run in the
        order they were made, one at a time."""
        h = self._handle
        return _current.client().submit(h._target(), self._call, args, kwargs, None,
                                         h._future_type)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the method and wait for its result (its exception is raised here)."""
        return self.submit(*args, **kwargs).result()

    def __repr__(self) -> str:
        return f"<ActorMethod {self._handle._name}.{self.__name__}>"


def run_in_actor(handle: ActorHandle, fn: Callable[..., Any], *args: Any) -> TaskFuture:
    """Queue ``fn(*args)`` to run in ``handle``'s actor process, in order with its calls
    (dpool's own functions there: ``dpool.collective`` joins a group so). A function
    whose ``readonly`` attribute is true is not replayed by a restart."""
    return _current.client().submit(handle._target(), fn, args, {}, None,
                                     handle._future_type)


class ActorHandle:
    """A handle on an actor: its methods are ``ActorMethod``s. Pickles into tasks and
    other actors (of the same runtime)."""

    __slots__ = ("_group", "_group_id", "_name", "_methods", "_future_type", "_bound",
                 "_host", "__weakref__")

    def __init__(self, group: Any, group_id: int, name: str, methods: dict[str, bool],
                 future_type: type, host: str = "") -> None:
        self._group = group  # the scheduler's group in the driver; None in a worker
        self._group_id = group_id
        self._name = name
        self._methods = methods  # method name -> whether it is read-only
        self._future_type = future_type
        self._bound: dict[str, ActorMethod] = {}
        self._host = host  # the node that hosts it (a cluster's); "" on one host

    def _target(self) -> Any:
        """What this process's client submits to: the group, or its id in a worker
        (whose node learns first where the actor lives, if that is another node)."""
        g = self._group
        if g is not None:
            return g
        if self._host:
            _current.client().actor_route(self._group_id, self._host, self._name)
        return self._group_id

    def __getattr__(self, attr: str) -> ActorMethod:
        if attr.startswith("__") or attr not in self._methods:
            raise AttributeError(f"actor {self._name} has no method {attr!r}")
        method = self._bound.get(attr)
        if method is None:
            method = self._bound[attr] = ActorMethod(self, attr, self._methods[attr])
        return method

    def __dir__(self) -> list[str]:
        return sorted(self._methods)

    def __reduce__(self) -> tuple:
        return (_rebuild, (self._group_id, self._name, self._methods, self._host))

    def __repr__(self) -> str:
        return f"<ActorHandle {self._name}>"


def _rebuild(group_id: int, name: str, methods: dict[str, bool], host: str = ""
             ) -> ActorHandle:
    from dpool.futures import Future

    group = None
    if not _current.in_worker():  # (a driver: its group record)
        driver = _current.driver()
        group = driver.group_of(group_id)
        if group is None and host:  # another driver's, on the same cluster
            group = driver.foreign_actor(group_id, name, host)
        if group is None:
            raise errors.Error(f"actor {name} is not one of this driver's: an actor "
                               "handle works only in the runtime that created it")
    return ActorHandle(group, group_id, name, methods, Future, host)


def public_methods(cls: type) -> dict[str, bool]:
    """The methods a handle on an instance of ``cls`` offers: name -> read-only."""
    out = {}
    for name in dir(cls):
        if name.startswith("_"):
            continue
        attr = getattr(cls, name, None)
        if callable(attr):
            out[name] = is_readonly(attr)
    return out


def create(executor: ExecutorCore, cls: Callable[..., Any], args: tuple, kwargs: dict,
           options: Optional[dict] = None, req: Any = None) -> ActorHandle:
    """``executor.actor(cls, *args, **kwargs)`` with ``options`` (see ``ACTOR_OPTIONS``)
    and ``req``, the resources it holds while it lives (a ``Request``; None: none)."""
    if not isinstance(cls, type):
        raise TypeError(f"actor() takes a class, got {type(cls).__name__} {cls!r}")
    opts = dict(options or {})
    name = opts.pop("name", None)
    lifetime = opts.pop("lifetime", None)
    max_restarts = opts.pop("max_restarts", 0)
    every = opts.pop("checkpoint_every", 0)
    concurrency = opts.pop("max_concurrency", 1)
    if opts:
        raise TypeError(f"actor() got unknown options {sorted(opts)}")
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"name= must be a non-empty str, got {name!r}")
    if lifetime not in (None, "detached"):
        raise ValueError(f"lifetime= must be None or 'detached', got {lifetime!r}")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < -1:
        raise ValueError(f"max_restarts= must be an int >= 0, or -1 (no limit), got "
                         f"{max_restarts!r}")
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ValueError(f"checkpoint_every= must be an int >= 0, got {every!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"max_concurrency= must be an int >= 1, got {concurrency!r}")
    if concurrency > 1 and (every or max_restarts):
        raise ValueError("max_concurrency= above 1 takes no checkpoint_every= or "
                         "max_restarts=: calls running at once have no one order to replay")
    driver = executor._driver
    if driver is None:
        raise errors.Error("actors are created by a driver's executor, not inside a task")
    if executor._shutdown_thread:
        raise RuntimeError("cannot create an actor after shutdown")
    try:
        ctor = _payload.dumps((cls, tuple(args), dict(kwargs)))
    except Exception as exc:
        raise errors.SerializationError(
            f"cannot pickle actor {cls.__qualname__}'s class or constructor arguments: "
            f"{exc}") from exc
    label = name or f"{cls.__qualname__}"
    with _named_lock:  # (whether the name is free: the runtime's directory says)
        cfg = ActorConfig(label, boot, ctor, max_restarts, every, concurrency,
                          lifetime == "detached", req, name is None)
        initializer = _payload.dumps((boot, (ctor, None, [], every, concurrency)))
        group: Any = driver.add_group(
            WorkerGroupConfig(1, executor._mp_context, initializer, None, 1, None, None, cfg),
            executor)
        methods = public_methods(cls)
        host = getattr(driver, "node_id", "")
        handle = ActorHandle(group, group.group_id, cfg.name, methods,
                             executor._future_type, host)
        if name is not None:
            try:  # where every driver (and task) of the runtime finds it
                driver.name_actor(name, (group.group_id, cfg.name, methods, host))
            except BaseException:
                driver.terminate_group(group, f"its name {name!r} is taken")
                raise
            _named[name] = handle
    if lifetime != "detached":
        executor._actor_groups.append(group)  # shut down with the executor
        weakref.finalize(executor, driver.close_group_soon, group).atexit = False
    return handle


def _alive(handle: ActorHandle) -> bool:
    g = handle._group
    return g is not None and g.broken is None and not g.closed


def get_actor(name: str) -> ActorHandle:
    """The handle of the live actor created with ``name=``: by this driver, or, on a
    cluster, by any driver (also from a task)."""
    if not isinstance(name, str):
        raise TypeError(f"get_actor() takes the actor's name, a str, got {name!r}")
    if not _current.in_worker():
        with _named_lock:
            handle = _named.get(name)
        if handle is not None and _alive(handle):
            return handle
    record = _current.client().find_actor(name)
    if record is None:
        raise ValueError(f"no live actor named {name!r}")
    from dpool.futures import Future

    group_id, label, methods, host = record
    group = None
    if not _current.in_worker():
        driver = _current.driver()
        group = driver.group_of(group_id) or driver.foreign_actor(group_id, label, host)
    return ActorHandle(group, group_id, label, methods, Future, host)


def kill(handle: ActorHandle) -> None:
    """End the actor now: its process is killed; its pending and later calls raise
    ``dpool.ActorDiedError``."""
    if not isinstance(handle, ActorHandle):
        raise TypeError(f"kill() takes an actor handle, got {type(handle).__name__}")
    _current.client().kill_actor(handle._group_id, handle._host, "it was killed (dpool.kill)")


def readonly(method: Callable[..., Any]) -> Callable[..., Any]:
    """Mark an actor method as not changing the actor's state: a restart does not replay
    its calls, and they do not count towards ``checkpoint_every``."""
    method.__dpool_readonly__ = True  # type: ignore[attr-defined]
    return method
