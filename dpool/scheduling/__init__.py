"""Scheduling: the per-host local scheduler, its worker groups, spilling and placement."""

from dpool.scheduling._policy import BatchPolicy
from dpool.scheduling._scheduler import GroupConfig, LocalScheduler

__all__ = ["LocalScheduler", "GroupConfig", "BatchPolicy"]
