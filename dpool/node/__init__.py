"""The node daemon: one per host, the local scheduler of a cluster (``python -m dpool.node``).

- ``_daemon``: ``NodeDaemon``, which builds the services below around one
  ``scheduling.LocalScheduler`` and runs them; ``_process``: what the node and global
  scheduler daemons share as processes (token, readiness, signals, logging).
- Services plugged into the scheduler (``scheduling.SchedulerAPI``): ``_attach``
  (drivers attached over the unix socket or TCP), ``_leases`` (workers lent to drivers
  of this host), ``_spill`` (tasks sent to other nodes through a global scheduler;
  with ``_spill_waits``: tasks asking for resources this node lacks, and the safety
  nets; ``_spill_results``: outcomes and lent results coming back; ``_spill_base``:
  what those parts share), ``_remote`` (tasks other nodes sent here), ``_pgroups``
  (placement groups: its drivers' groups relayed to a global scheduler, bundles held).
- Connections: ``_server`` (the listeners: authentication, hand-off, object transfers;
  used by the global scheduler too), ``_links`` (outgoing links to global schedulers and
  other nodes).
- ``_agent``: heartbeats and load reports, discovery of global schedulers, dead nodes.
- ``_ids``: cluster-unique id prefixes; ``_workdirs``: the cache of drivers' shipped code.
"""
