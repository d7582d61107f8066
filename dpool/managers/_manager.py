"""``BaseManager``, ``SyncManager`` and ``Manager()``: the stdlib's managers on an actor.

A started manager is one actor (``_server.ManagerServer``) that holds its objects; its
typeids are registered on the class (``register``), as in the stdlib, and each makes an
object on the server and returns its proxy. ``address=`` names the manager's actor, so
that ``BaseManager(address=name).connect()`` in the same driver reaches it; ``authkey``
is accepted and unused (calls go through the runtime's own connections).
"""

from __future__ import annotations

import queue
import threading
from multiprocessing.managers import RemoteError  # noqa: F401 - the stdlib's, re-exported

from dpool.managers import _server
from dpool.managers._proxies import (
    AcquirerProxy,
    ArrayProxy,
    AutoProxy,
    BarrierProxy,
    BaseProxy,
    ConditionProxy,
    DictProxy,
    EventProxy,
    IteratorProxy,
    ListProxy,
    NamespaceProxy,
    PoolProxy,
    ValueProxy,
)

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

# Server threads: calls that may run at once (each blocking call holds one), as the
# stdlib's manager has a thread per connection.
SERVER_THREADS = 256


class BaseManager:
    """The stdlib's ``multiprocessing.managers.BaseManager``, on dpool's runtime."""

    _registry: dict = {}  # typeid -> (callable, exposed, method_to_typeid, proxytype)

    def __init__(self, address: Any = None, authkey: Optional[bytes] = None,
                 serializer: str = "pickle", ctx: Any = None, *,
                 shutdown_timeout: float = 1.0) -> None:
        if address is not None and not isinstance(address, str):
            raise TypeError(f"address= must be None or a str naming the manager, got "
                            f"{address!r}")
        self._address = address
        self._authkey = authkey
        self._server: Any = None  # the ManagerServer's ActorHandle once started/connected
        self._executor: Any = None
        self._shut = False

    @classmethod
    def register(cls, typeid: str, callable: Optional[Callable[..., Any]] = None,
                 proxytype: Any = None, exposed: Optional[Any] = None,
                 method_to_typeid: Optional[dict] = None, create_method: bool = True) -> None:
        """Register ``typeid``: ``manager.typeid(*args)`` makes ``callable(*args)`` on the
        server and returns its proxy (a ``proxytype``; default: one made from the
        object's public methods, or ``exposed``)."""
        if "_registry" not in cls.__dict__:
            cls._registry = cls._registry.copy()
        if proxytype is None:
            proxytype = AutoProxy
        exposed = exposed or getattr(proxytype, "_exposed_", None)
        method_to_typeid = method_to_typeid or getattr(proxytype, "_method_to_typeid_", None)
        cls._registry[typeid] = (callable, tuple(exposed) if exposed else None,
                                 dict(method_to_typeid) if method_to_typeid else None,
                                 proxytype)
        if create_method:
            def make(self: BaseManager, /, *args: Any, **kwds: Any) -> Any:
                return self._create(typeid, args, kwds)

            make.__name__ = typeid
            setattr(cls, typeid, make)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, initializer: Optional[Callable[..., Any]] = None,
              initargs: tuple = ()) -> None:
        """Start the manager's server (an actor)."""
        from multiprocessing import ProcessError

        if self._server is not None:
            raise ProcessError("Already started server")
        if self._shut:
            raise ProcessError("Manager has shut down")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        from dpool.executor import ProcessPoolExecutor

        registry = {t: entry[:3] for t, entry in type(self)._registry.items()}
        self._executor = ProcessPoolExecutor(1)
        opts: dict = {"max_concurrency": SERVER_THREADS}
        if self._address is not None:
            opts["name"] = self._address
        self._server = self._executor.options(**opts).actor(
            _server.ManagerServer, registry, initializer, tuple(initargs))

    def connect(self) -> None:
        """Reach the running manager named ``address`` (made by this driver)."""
        import dpool

        if self._address is None:
            raise ValueError("connect() needs the address= of a started manager")
        self._server = dpool.get_actor(self._address)

    def shutdown(self) -> None:
        """Stop the server: its objects are gone, their proxies raise."""
        if self._server is None or self._shut:
            return
        self._shut = True
        if self._executor is not None:  # (a connected manager does not own the server)
            import dpool

            try:
                self._server.close()  # (its pools' workers stop before it is killed)
            except Exception:  # noqa: BLE001, S110 - killed all the same
                pass
            dpool.kill(self._server)
            self._executor.shutdown(wait=True)

    def join(self, timeout: Optional[float] = None) -> None:
        """The stdlib's: wait for the server process (here: nothing to wait for)."""

    def get_server(self) -> Any:
        raise NotImplementedError("dpool's managers serve through an actor: use start()")

    def __enter__(self) -> BaseManager:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        self.shutdown()

    @property
    def address(self) -> Any:
        return self._address

    def _create(self, typeid: str, args: tuple, kwds: dict) -> BaseProxy:
        if self._server is None:
            from multiprocessing import ProcessError

            raise ProcessError("Manager has not been started" if not self._shut
                               else "Manager has shut down")
        oid, exposed = self._server.create(typeid, args, kwds)
        proxytype: Any = type(self)._registry[typeid][3]
        proxy: BaseProxy = proxytype(self._server, oid, typeid, exposed, type(self))
        return proxy

    def _debug_info(self) -> str:
        return f"{self._server.count()} objects"


class SyncManager(BaseManager):
    """The stdlib's ``SyncManager``: shared ``dict``, ``list``, ``Namespace``, locks,
    queues and values (``dpool.Manager()`` returns one, started)."""


def _register_sync_types() -> None:
    reg = SyncManager.register
    reg("Queue", queue.Queue)
    reg("JoinableQueue", queue.Queue)
    reg("Event", threading.Event, EventProxy)
    reg("Lock", _server.Lock, AcquirerProxy)
    reg("RLock", _server.CallerRLock, AcquirerProxy)
    reg("Semaphore", threading.Semaphore, AcquirerProxy)
    reg("BoundedSemaphore", threading.BoundedSemaphore, AcquirerProxy)
    reg("Condition", _server.CallerCondition, ConditionProxy)
    reg("Barrier", threading.Barrier, BarrierProxy)
    reg("list", list, ListProxy)
    reg("dict", dict, DictProxy)
    reg("Value", _server.Value, ValueProxy)
    reg("Array", _server.Array, ArrayProxy)
    reg("Namespace", _server.Namespace, NamespaceProxy)
    reg("Iterator", proxytype=IteratorProxy, create_method=False)
    reg("AsyncResult", create_method=False)
    reg("Pool", _server.ServerPool, PoolProxy)


_register_sync_types()


def Manager() -> SyncManager:  # noqa: N802 - the stdlib's name
    """``multiprocessing.Manager()``: a started ``SyncManager`` whose server is an actor."""
    m = SyncManager()
    m.start()
    return m
