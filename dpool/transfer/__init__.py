"""Moving stored values between hosts: node to node, and to and from TCP drivers.

A stored value is a segment whose layout describes itself (``objects._segment``), so a
transfer moves the segment's bytes verbatim, in ranges over several connections of its
own at once, never on a process's control connection.

- ``_pull``: a node pulls a segment from the node that holds it into its own store (or a
  TCP driver into its own memory); the holder's side (``serve``); remote references.
- ``_push``: a TCP driver uploads a large value into its node's store; the node's side
  (``Receiver``).
- ``_ranges``: what both share -- splitting a segment into ranges, running them in
  parallel, asking on a kept connection with one retry, receive buffers, chunk writes.
- ``_conns``: authenticated transfer connections, kept per node for the next transfer.
"""

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from dpool.transfer import _pull as pull
    from dpool.transfer import _push as push

# What other packages use, loaded on first use (PEP 562): importing this package
# loads none of its modules. A name in ``_LAZY`` is its module's; one in ``_MODULES``
# is the module itself, used as a namespace (``from dpool.transfer import pull as _pull``).
_MODULES = {
    "pull": "dpool.transfer._pull",
    "push": "dpool.transfer._push",
}
_LAZY: dict[str, str] = {}

__all__ = [
    "pull",
    "push",
]


def __getattr__(name: str) -> object:
    import importlib

    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted({*globals(), *_MODULES, *_LAZY})
