"""A global scheduler replica: places the tasks nodes spill (``python -m dpool.global_scheduler``).

- ``_daemon``: ``GlobalScheduler``, the stateless daemon (links from nodes, their load
  reports, forwarding each spilled task, heartbeats in the control store).
- ``_placement``: the built-in rule, pure over load reports: the node with the lowest
  estimated wait (unit-tested without processes, tests/global_scheduler/test_placement.py).
  It is one ``PlacementPolicy`` (``scheduling._placement_policy``) among others: the
  daemon places through whichever ``--placement-policy`` names (tests/placement/).
- ``_groups``: placement groups owned by this replica: all bundles of a group placed at
  once (``scheduling._gangs``), held on the nodes, and the tasks in a bundle forwarded
  to the node holding it.
"""
