"""``dpool dashboard``: a live page of a cluster, served from the head's side.

::

    Redis shards ──(read only)──▶ Collector ──snapshot──▶ DashboardServer ──▶ browser
    node table, events stream     (a thread)   (a dict)    (http.server,     (the page,
    task table, shard health                                token or cookie)  polls /fragment)

Modules:

- ``_source``: where the cluster and its control store are (``locate``), and the
  read-only reader of the tables and the event stream (``ControlReader``).
- ``_activity``: tasks per second, running tasks and recent failures, from the events.
- ``_collect``: the thread that reads every second and builds the snapshot.
- ``_render``: the page, its live fragment and the SVG chart (no JS library, nothing
  fetched from the internet).
- ``_server``: the HTTP server and its login (nothing without the token).

The cluster's processes do nothing for the dashboard: it reads what they record anyway,
off every task's path. ``cli/_dashboard`` starts it.
"""

from typing import TYPE_CHECKING

from dpool._lazy import front_door

if TYPE_CHECKING:
    from dpool.dashboard._collect import Collector
    from dpool.dashboard._server import DashboardServer
    from dpool.dashboard._source import ControlReader, locate

# What other packages use, loaded on first use (PEP 562) from the module that
# defines it: importing this package loads none of its modules.
_LAZY = {
    "Collector": "dpool.dashboard._collect",
    "DashboardServer": "dpool.dashboard._server",
    **dict.fromkeys(("ControlReader", "locate"), "dpool.dashboard._source"),
}

__all__ = [
    "Collector",
    "ControlReader",
    "DashboardServer",
    "locate",
]


__getattr__, __dir__ = front_door(__name__, _LAZY)
