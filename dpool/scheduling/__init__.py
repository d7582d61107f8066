"""Scheduling: the per-host local scheduler, its worker groups, and the spill policy."""

from dpool.scheduling._policy import BatchPolicy, LocalOnlySpillPolicy, SpillPolicy
from dpool.scheduling._scheduler import GroupConfig, LocalScheduler

__all__ = ["LocalScheduler", "GroupConfig", "SpillPolicy", "LocalOnlySpillPolicy", "BatchPolicy"]
