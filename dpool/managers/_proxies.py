"""Proxies of a manager's objects, as the stdlib's ``multiprocessing.managers`` has them.

A proxy holds its manager server's actor handle, the object's id, its typeid and the
methods it exposes; ``_callmethod`` calls one on the server (an actor call, so it works
from a driver, a task or another actor alike) and returns the value, or raises what the
method raised. A method listed in the proxy type's ``_method_to_typeid_`` returns a
proxy of a new server object instead (``dict.__iter__``: an ``IteratorProxy``). A proxy
pickles into tasks, ``initargs`` and other actors.
"""

from __future__ import annotations

import os
import threading

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional


class NewObject:
    """What the server returns for a method in ``_method_to_typeid_``: a new object."""

    __slots__ = ("typeid", "oid", "exposed")

    def __init__(self, typeid: str, oid: int, exposed: tuple) -> None:
        self.typeid = typeid
        self.oid = oid
        self.exposed = exposed

    def __reduce__(self) -> tuple:
        return (NewObject, (self.typeid, self.oid, self.exposed))


class BaseProxy:
    """A proxy of one object of a manager (the stdlib's ``BaseProxy``)."""

    _exposed_: Optional[tuple] = None
    _method_to_typeid_: Optional[dict] = None

    def __init__(self, server: Any, oid: int, typeid: str, exposed: tuple,
                 manager_class: Any = None) -> None:
        self._server = server  # the manager server's ActorHandle
        self._id = oid
        self._typeid = typeid
        self._exposed = exposed
        self._manager_class = manager_class  # whose registry names the proxy types

    def _callmethod(self, methodname: str, args: tuple = (), kwds: Optional[dict] = None) -> Any:
        """Call ``methodname`` of the object on the server; its value (or its error)."""
        value = self._server.call(self._id, methodname, tuple(args), dict(kwds or {}),
                                  (os.getpid(), threading.get_ident()))
        if isinstance(value, NewObject):
            return self._proxy_for(value)
        return value

    def _proxy_for(self, new: NewObject) -> BaseProxy:
        registry = getattr(self._manager_class, "_registry", None) or {}
        entry = registry.get(new.typeid)
        proxytype = entry[3] if entry is not None else AutoProxy
        return proxytype(self._server, new.oid, new.typeid, new.exposed, self._manager_class)

    def _getvalue(self) -> Any:
        """A copy of the referent."""
        return self._server.get_value(self._id)

    def __reduce__(self) -> tuple:
        cls: Optional[type] = type(self)
        if cls is not None and cls.__name__.startswith("AutoProxy["):
            cls = None  # (made on the fly: remade from ``exposed`` where it lands)
        return (_rebuild, (cls, self._server, self._id, self._typeid, self._exposed,
                           self._manager_class))

    def __deepcopy__(self, memo: dict) -> Any:
        return self._getvalue()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} object, typeid {self._typeid!r} at {id(self):#x}>"

    def __str__(self) -> str:
        try:
            return self._callmethod("__repr__")
        except Exception:  # noqa: BLE001 - as the stdlib's: a repr that says it failed
            return repr(self)[:-1] + "; '__str__()' failed>"


def _rebuild(cls: Optional[type], server: Any, oid: int, typeid: str, exposed: tuple,
             manager_class: Any) -> BaseProxy:
    if cls is None:
        return AutoProxy(server, oid, typeid, exposed, manager_class)
    return cls(server, oid, typeid, exposed, manager_class)  # type: ignore[no-any-return]


_proxy_types: dict[tuple, type] = {}


def MakeProxyType(name: str, exposed: tuple) -> type:  # noqa: N802 - the stdlib's name
    """A ``BaseProxy`` subclass whose methods ``exposed`` call the referent's."""
    exposed = tuple(exposed)
    key = (name, exposed)
    made = _proxy_types.get(key)
    if made is not None:
        return made
    namespace: dict = {"_exposed_": exposed}
    for meth in exposed:
        namespace[meth] = _forwarder(meth)
    made = _proxy_types[key] = type(name, (BaseProxy,), namespace)
    return made


def _forwarder(meth: str) -> Callable[..., Any]:
    def call(self: BaseProxy, /, *args: Any, **kwds: Any) -> Any:
        return self._callmethod(meth, args, kwds)

    call.__name__ = meth
    return call


def AutoProxy(server: Any, oid: int, typeid: str, exposed: tuple,  # noqa: N802
              manager_class: Any = None) -> BaseProxy:
    """A proxy whose type is made from the methods the object exposes."""
    cls = MakeProxyType(f"AutoProxy[{typeid}]", exposed)
    return cls(server, oid, typeid, exposed, manager_class)


class IteratorProxy(BaseProxy):
    _exposed_ = ("__next__", "send", "throw", "close")

    def __iter__(self) -> IteratorProxy:
        return self

    def __next__(self, *args: Any) -> Any:
        return self._callmethod("__next__", args)

    def send(self, *args: Any) -> Any:
        return self._callmethod("send", args)

    def throw(self, *args: Any) -> Any:
        return self._callmethod("throw", args)

    def close(self, *args: Any) -> Any:
        return self._callmethod("close", args)


class AcquirerProxy(BaseProxy):
    _exposed_: Optional[tuple] = ("acquire", "release")

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> Any:
        args = (blocking,) if timeout is None else (blocking, timeout)
        return self._callmethod("acquire", args)

    def release(self) -> Any:
        return self._callmethod("release")

    def __enter__(self) -> Any:
        return self._callmethod("acquire")

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> Any:
        return self._callmethod("release")


class ConditionProxy(AcquirerProxy):
    _exposed_ = ("acquire", "release", "wait", "notify", "notify_all")

    def wait(self, timeout: Optional[float] = None) -> Any:
        return self._callmethod("wait", (timeout,))

    def notify(self, n: int = 1) -> Any:
        return self._callmethod("notify", (n,))

    def notify_all(self) -> Any:
        return self._callmethod("notify_all")

    def wait_for(self, predicate: Callable[[], Any], timeout: Optional[float] = None) -> Any:
        import time

        result = predicate()
        if result:
            return result
        end = None if timeout is None else time.monotonic() + timeout
        while not result:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                break
            self.wait(left)
            result = predicate()
        return result


class EventProxy(BaseProxy):
    _exposed_ = ("is_set", "set", "clear", "wait")

    def is_set(self) -> Any:
        return self._callmethod("is_set")

    def set(self) -> Any:
        return self._callmethod("set")

    def clear(self) -> Any:
        return self._callmethod("clear")

    def wait(self, timeout: Optional[float] = None) -> Any:
        return self._callmethod("wait", (timeout,))


class BarrierProxy(BaseProxy):
    _exposed_ = ("__getattribute__", "wait", "abort", "reset")

    def wait(self, timeout: Optional[float] = None) -> Any:
        return self._callmethod("wait", (timeout,))

    def abort(self) -> Any:
        return self._callmethod("abort")

    def reset(self) -> Any:
        return self._callmethod("reset")

    @property
    def parties(self) -> Any:
        return self._callmethod("__getattribute__", ("parties",))

    @property
    def n_waiting(self) -> Any:
        return self._callmethod("__getattribute__", ("n_waiting",))

    @property
    def broken(self) -> Any:
        return self._callmethod("__getattribute__", ("broken",))


class NamespaceProxy(BaseProxy):
    _exposed_ = ("__getattribute__", "__setattr__", "__delattr__")

    def __getattr__(self, key: str) -> Any:
        if key[0] == "_":
            return object.__getattribute__(self, key)
        return self._callmethod("__getattribute__", (key,))

    def __setattr__(self, key: str, value: Any) -> None:
        if key[0] == "_":
            object.__setattr__(self, key, value)
            return
        self._callmethod("__setattr__", (key, value))

    def __delattr__(self, key: str) -> None:
        if key[0] == "_":
            object.__delattr__(self, key)
            return
        self._callmethod("__delattr__", (key,))


class ValueProxy(BaseProxy):
    _exposed_ = ("get", "set")

    def get(self) -> Any:
        return self._callmethod("get")

    def set(self, value: Any) -> Any:
        return self._callmethod("set", (value,))

    value = property(get, set)


BaseListProxy = MakeProxyType("BaseListProxy", (
    "__add__", "__contains__", "__delitem__", "__getitem__", "__len__", "__mul__",
    "__reversed__", "__rmul__", "__setitem__", "append", "count", "extend", "index",
    "insert", "pop", "remove", "reverse", "sort", "__imul__"))


class ListProxy(BaseListProxy):  # type: ignore[valid-type,misc]
    def __iadd__(self, value: Any) -> ListProxy:
        self._callmethod("extend", (value,))
        return self

    def __imul__(self, value: Any) -> ListProxy:
        self._callmethod("__imul__", (value,))
        return self


_BaseDictProxy = MakeProxyType("DictProxy", (
    "__contains__", "__delitem__", "__getitem__", "__iter__", "__len__", "__setitem__",
    "clear", "copy", "get", "items", "keys", "pop", "popitem", "setdefault", "update",
    "values"))


class DictProxy(_BaseDictProxy):  # type: ignore[valid-type,misc]
    _method_to_typeid_ = {"__iter__": "Iterator"}


ArrayProxy = MakeProxyType("ArrayProxy", ("__len__", "__getitem__", "__setitem__"))


BasePoolProxy = MakeProxyType("PoolProxy", (
    "apply", "apply_async", "close", "imap", "imap_unordered", "join", "map", "map_async",
    "starmap", "starmap_async", "terminate"))
BasePoolProxy._method_to_typeid_ = {  # type: ignore[attr-defined]
    "apply_async": "AsyncResult", "map_async": "AsyncResult",
    "starmap_async": "AsyncResult", "imap": "Iterator", "imap_unordered": "Iterator"}


class PoolProxy(BasePoolProxy):  # type: ignore[valid-type,misc]
    """``manager.Pool(...)``'s proxy: the pool's methods; ``with`` terminates it."""

    def __enter__(self) -> PoolProxy:
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        self.terminate()
