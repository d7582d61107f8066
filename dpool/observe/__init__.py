"""Seeing inside: what the runtime recorded, turned into things a person looks at.

- ``_timeline``: ``dpool.timeline`` -- the tasks that ran as a Chrome trace-event file,
  on the embedded runtime or a cluster (``dpool timeline``);
- ``_trace``: the event log -> the trace-event document (spans, lanes, instants);
- ``_progress``: ``dpool.progress`` -- a tqdm (or plain) bar over futures, map/imap
  iterators and AsyncResults;
- ``_live``: ``python -m dpool run --progress`` -- a live line on stderr (tasks done,
  running, queued, failed; CPUs in use per node) for an unmodified program;
- ``_cluster``: the cluster's control store, reached for reading (``NoClusterError``);
- ``_logs``: ``dpool logs`` -- task output kept by the nodes, daemon log files;
- ``_objects``: ``dpool objects`` -- the object table, largest first.
"""

from dpool._lazy import front_door
from dpool.observe._progress import progress
from dpool.observe._timeline import timeline

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from dpool.observe import _logs as logs
    from dpool.observe._cluster import NoClusterError, node_status, open_store
    from dpool.observe._live import LiveLine
    from dpool.observe._objects import format_rows, object_rows
    from dpool.observe._timeline import cluster_trace, parse_duration

# What other packages use, loaded on first use (PEP 562): importing this package
# loads none of its modules. A name in ``_LAZY`` is its module's; one in ``_MODULES``
# is the module itself, used as a namespace (``from dpool.observe import logs as _logs``).
_MODULES = {
    "logs": "dpool.observe._logs",
}
_LAZY = {
    **dict.fromkeys(("NoClusterError", "node_status", "open_store"), "dpool.observe._cluster"),
    "LiveLine": "dpool.observe._live",
    **dict.fromkeys(("format_rows", "object_rows"), "dpool.observe._objects"),
    **dict.fromkeys(("cluster_trace", "parse_duration"), "dpool.observe._timeline"),
}

__all__ = [
    "LiveLine",
    "NoClusterError",
    "cluster_trace",
    "format_rows",
    "logs",
    "node_status",
    "object_rows",
    "open_store",
    "parse_duration",
    "progress",
    "timeline",
]


__getattr__, __dir__ = front_door(__name__, _LAZY, _MODULES)
