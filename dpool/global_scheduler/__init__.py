"""A global scheduler replica: places the tasks nodes spill (``python -m dpool.global_scheduler``).

- ``_daemon``: ``GlobalScheduler``, the stateless daemon (links from nodes, their load
  reports, forwarding each spilled task).
- ``_placement``: the built-in rule, pure over load reports: the node with the lowest
  estimated wait (unit-tested without processes, tests/global_scheduler/test_placement.py).
  It is one ``PlacementPolicy`` (``dpool.placement``) among others: the daemon places
  through whichever ``--placement-policy`` names (tests/placement/).
- ``_watch``: its heartbeat and its watch over the nodes: which are alive in the node
  table, and declaring dead those that stopped heartbeating or whose link closed with
  nothing listening at their address any more.
- ``_placement_groups``: placement groups owned by this replica: all bundles of a group placed at
  once (``placement.GangTable``), held on the nodes, and the tasks in a bundle forwarded
  to the node holding it.
"""

# Nothing here is for other packages: a global scheduler is a process of its own
# (``python -m dpool.global_scheduler``).
__all__: list[str] = []
