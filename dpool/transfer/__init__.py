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

from dpool._lazy import front_door

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


__getattr__, __dir__ = front_door(__name__, _LAZY, _MODULES)
