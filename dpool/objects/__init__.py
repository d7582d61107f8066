"""dpool's shared-memory object store.

The modules are imported on demand (``import dpool.objects._store``); this package
imports nothing itself so that importing it stays cheap:

- ``_serialization``: cloudpickle protocol 5 with large buffers kept out-of-band.
- ``_mainref``: functions and classes of the main script by reference (by-value fallback),
  and the one main namespace that functions pickled by value share in a process.
- ``_segment``: one object per POSIX shared-memory segment; zero-copy, copy-on-write reads.
- ``_store``: the per-host bookkeeping (capacity, LRU eviction, reference and pin counts).
"""
