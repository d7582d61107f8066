"""The node daemon: one per host, the local scheduler of the cluster (see ``_daemon``)."""
