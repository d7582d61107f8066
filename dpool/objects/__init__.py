"""dpool's object store: values as bytes, and the shared-memory store on each host.

This package's ``__init__`` imports nothing, so importing it stays cheap; its modules are
imported on demand (``import dpool.objects._hoststore``). They import no other part of
dpool but ``errors``, ``_log`` and ``_task_future`` (``TracebackText``). Moving stored
values between hosts is ``dpool.transfer``'s.

Values as bytes:

- ``_serialization``: pickle protocol 5 with large buffers kept out-of-band; the stdlib's
  C pickler first, cloudpickle (loaded then) for what it cannot take.
- ``_mainref``: functions and classes of the main script by reference (by-value fallback),
  and the one main namespace that functions pickled by value share in a process.
- ``_byvalue``: a plain function's by-value fallback without cloudpickle.
- ``_payload``: how arguments, results, errors and functions become payloads.
- ``_values``: the payload layouts (plain pickle, inline, stored) and the store threshold.
- ``_inline``: inline forms of stored values, for processes off this host's store.

The store:

- ``_owners``: segment names, whether their owner lives, reaping a dead owner's segments.
- ``_segment``: one object per POSIX shared-memory segment; zero-copy, copy-on-write reads.
- ``_mapping``: this process's read mappings of large segments (in-use locks, cache).
- ``_recycle``, ``_writemaps``: freed large segments' pages reused for the next write.
- ``_forkguard``: no ``fork()`` while a thread holds a segment's descriptor.
- ``_accounting``, ``_hoststore``: the per-host bookkeeping and the store as the
  scheduler uses it (adopt, pin, drop, spill to disk, restore).
"""

from dpool._lazy import front_door

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from dpool.objects import _forkguard as forkguard
    from dpool.objects import _inline as inline
    from dpool.objects import _mainref as mainref
    from dpool.objects import _mapping as mapping
    from dpool.objects import _owners as owners
    from dpool.objects import _payload as payload
    from dpool.objects import _segment as segment
    from dpool.objects import _values as values
    from dpool.objects import _writemaps as writemaps
    from dpool.objects._hoststore import HostStore
    from dpool.objects._serialization import Serialized
    from dpool.objects._values import stored_size

# What other packages use, loaded on first use (PEP 562): importing this package
# loads none of its modules. A name in ``_LAZY`` is its module's; one in ``_MODULES``
# is the module itself, used as a namespace (``from dpool.objects import payload as _payload``).
_MODULES = {
    "forkguard": "dpool.objects._forkguard",
    "inline": "dpool.objects._inline",
    "mainref": "dpool.objects._mainref",
    "mapping": "dpool.objects._mapping",
    "owners": "dpool.objects._owners",
    "payload": "dpool.objects._payload",
    "segment": "dpool.objects._segment",
    "values": "dpool.objects._values",
    "writemaps": "dpool.objects._writemaps",
}
_LAZY = {
    "HostStore": "dpool.objects._hoststore",
    "Serialized": "dpool.objects._serialization",
    "stored_size": "dpool.objects._values",
}

__all__ = [
    "HostStore",
    "Serialized",
    "forkguard",
    "inline",
    "mainref",
    "mapping",
    "owners",
    "payload",
    "segment",
    "stored_size",
    "values",
    "writemaps",
]


__getattr__, __dir__ = front_door(__name__, _LAZY, _MODULES)
