"""dpool's object store: values as bytes, and the shared-memory store on each host.

The modules are imported on demand (``import dpool.objects._hoststore``); this package
imports nothing itself so that importing it stays cheap. Moving stored values between
hosts is ``dpool.transfer``'s; this package imports no other part of dpool but
``errors``.

Values as bytes:

- ``_serialization``: pickle protocol 5 with large buffers kept out-of-band; the stdlib's
  C pickler first, cloudpickle (loaded then) for what it cannot take.
- ``_mainref``: functions and classes of the main script by reference (by-value fallback),
  and the one main namespace that functions pickled by value share in a process.
- ``_byvalue``: a plain function's by-value fallback without cloudpickle.
- ``_payload``: how arguments, results, errors and functions become payloads (the
  encoding every process uses on the wire).
- ``_values``: the payload layouts -- a plain pickle, inline with its buffers, or stored
  (naming a segment) -- and the store threshold between them.
- ``_inline``: payloads that must mean something off this host (inline forms of stored
  values), and the serialization of a process with no store of its own.

The store:

- ``_segment``: one object per POSIX shared-memory segment; zero-copy, copy-on-write reads.
- ``_mapping``: this process's read mappings of large segments (in-use locks, cache).
- ``_recycle``: the pages of freed large segments, reused for the next large write.
- ``_writemaps``: writable mappings of recycled segments, kept for the next write into
  the same pages.
- ``_forkguard``: no ``fork()`` while a thread holds a segment's descriptor.
- ``_accounting``: the per-host bookkeeping (capacity, LRU eviction, reference and pin
  counts).
- ``_hoststore``: the host's store as the scheduler uses it (adopt, pin, drop; eviction
  as spilling to disk, and restoring).
"""
