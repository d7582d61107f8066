"""A global scheduler replica: places tasks that nodes spill (see ``_daemon``)."""
