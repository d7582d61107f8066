"""The control store: all control state (task/lineage, function, object tables, event log).

``ControlStore`` is the interface; ``InProcessControlStore`` is the single-host
implementation used when ``DPOOL_ADDRESS`` is unset. A Redis-sharded implementation of the
same interface backs the cluster.
"""

from dpool.control._interface import ControlStore, TaskRecord
from dpool.control._local import InProcessControlStore

__all__ = ["ControlStore", "TaskRecord", "InProcessControlStore"]
