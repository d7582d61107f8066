"""``dpool.Manager()`` and ``dpool.managers``: the stdlib's ``multiprocessing.managers``
whose server is an actor.

- ``_manager``: ``BaseManager`` (``register``, ``start``, ``connect``, ``shutdown``),
  ``SyncManager`` (``dict``, ``list``, ``Namespace``, ``Lock``, ``RLock``, ``Semaphore``,
  ``BoundedSemaphore``, ``Condition``, ``Event``, ``Barrier``, ``Queue``,
  ``JoinableQueue``, ``Value``, ``Array``), ``Manager()``, ``RemoteError``.
- ``_proxies``: ``BaseProxy`` and the proxy types; ``MakeProxyType``, ``AutoProxy``.
- ``_server``: ``ManagerServer``, the actor that holds a manager's objects, and the
  objects the stdlib's module defines itself (``Namespace``, ``Value``, ``Array``) or
  that must be owned by a caller rather than a server thread (locks, conditions).
"""

from dpool._lazy import front_door

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from dpool.managers._manager import BaseManager, Manager, RemoteError, SyncManager
    from dpool.managers._proxies import (
        AcquirerProxy,
        ArrayProxy,
        AutoProxy,
        BarrierProxy,
        BaseListProxy,
        BaseProxy,
        ConditionProxy,
        DictProxy,
        EventProxy,
        IteratorProxy,
        ListProxy,
        MakeProxyType,
        NamespaceProxy,
        PoolProxy,
        ValueProxy,
    )
    from dpool.managers._server import Namespace, Value

_LAZY = {
    **dict.fromkeys(("BaseManager", "Manager", "RemoteError", "SyncManager"),
                    "dpool.managers._manager"),
    **dict.fromkeys(("AcquirerProxy", "ArrayProxy", "AutoProxy", "BarrierProxy",
                     "BaseListProxy", "BaseProxy", "ConditionProxy", "DictProxy",
                     "EventProxy", "IteratorProxy", "ListProxy", "MakeProxyType",
                     "NamespaceProxy", "PoolProxy", "ValueProxy"),
                    "dpool.managers._proxies"),
    **dict.fromkeys(("Namespace", "Value"), "dpool.managers._server"),
}
_MODULES: dict = {}

__all__ = [
    "AcquirerProxy", "ArrayProxy", "AutoProxy", "BarrierProxy", "BaseListProxy",
    "BaseManager", "BaseProxy", "ConditionProxy", "DictProxy", "EventProxy",
    "IteratorProxy", "ListProxy", "MakeProxyType", "Manager", "Namespace", "NamespaceProxy",
    "PoolProxy", "RemoteError", "SyncManager", "Value", "ValueProxy",
]

__getattr__, __dir__ = front_door(__name__, _LAZY, _MODULES)
