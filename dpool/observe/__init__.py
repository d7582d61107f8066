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

from dpool.observe._progress import progress
from dpool.observe._timeline import timeline

__all__ = ["progress", "timeline"]
