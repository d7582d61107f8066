"""Peak memory of the driver plus all its descendant processes.

A thread reads ``/proc/<pid>/smaps_rollup`` (RSS and PSS in one read) for
every process of the tree every few ms; the process list itself is refreshed
less often because walking ``/proc`` is comparatively slow. Three measures:

- RSS counts a shared-memory page once per process that maps it: one array in
  shared memory mapped by two workers counts twice.
- PSS splits a shared page between the processes mapping it, but misses
  shared memory nobody maps at that instant (a segment written with pwrite).
- *memory* = the tree's PSS without its shared-memory part (``Pss_Shmem``)
  plus the machine's shared memory (``Shmem`` in ``/proc/meminfo``): every
  page the tree uses counted once, mapped or not. This is the headline figure;
  it includes other programs' shared memory, so it is only meaningful as a
  delta on a machine not otherwise allocating shared memory.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class MemoryPeak:
    baseline_rss: int
    peak_rss: int
    baseline_pss: int
    peak_pss: int
    baseline_mem: int
    peak_mem: int
    samples: int
    processes: int

    @property
    def rss_delta(self) -> int:
        return self.peak_rss - self.baseline_rss

    @property
    def pss_delta(self) -> int:
        return self.peak_pss - self.baseline_pss

    @property
    def mem_delta(self) -> int:
        return self.peak_mem - self.baseline_mem


def _read_rollup(pid: int) -> tuple[int, int, int] | None:
    """(rss, pss, pss_shmem) in bytes, or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            data = fh.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    except OSError:
        return None
    rss = pss = shmem = 0
    for line in data.splitlines():
        if line.startswith(b"Rss:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith(b"Pss:"):
            pss = int(line.split()[1]) * 1024
        elif line.startswith(b"Pss_Shmem:"):
            shmem = int(line.split()[1]) * 1024
    return rss, pss, shmem


def _read_psutil(pid: int) -> tuple[int, int, int] | None:
    try:
        rss = psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return None
    return rss, rss, 0


def _system_shmem() -> int:
    """Shared memory in use on the machine (tmpfs/POSIX shm, mapped or not), bytes."""
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"Shmem:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


_READ = _read_rollup if os.path.exists(f"/proc/{os.getpid()}/smaps_rollup") else _read_psutil


class TreeMemorySampler:
    def __init__(self, interval_s: float = 0.005, refresh_s: float = 0.1) -> None:
        self._interval = interval_s
        self._refresh = refresh_s
        self._root = psutil.Process()
        self._pids: list[int] = []
        self._seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mem-sampler", daemon=True)
        self._baseline = (0, 0, 0)
        self._peak = (0, 0, 0)
        self._samples = 0

    def _refresh_pids(self) -> None:
        try:
            kids = [p.pid for p in self._root.children(recursive=True)]
        except psutil.Error:
            kids = []
        self._pids = [self._root.pid, *kids]
        self._seen.update(self._pids)

    def _total(self) -> tuple[int, int, int]:
        rss = pss = private = 0
        for pid in self._pids:
            got = _READ(pid)
            if got is not None:
                rss += got[0]
                pss += got[1]
                private += got[1] - got[2]
        return rss, pss, private + _system_shmem()

    def _loop(self) -> None:
        next_refresh = time.monotonic() + self._refresh
        while not self._stop.wait(self._interval):
            if time.monotonic() >= next_refresh:
                self._refresh_pids()
                next_refresh = time.monotonic() + self._refresh
            now = self._total()
            self._peak = (max(self._peak[0], now[0]), max(self._peak[1], now[1]),
                          max(self._peak[2], now[2]))
            self._samples += 1

    def __enter__(self) -> TreeMemorySampler:
        self._refresh_pids()
        self._baseline = self._peak = self._total()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def result(self) -> MemoryPeak:
        return MemoryPeak(
            baseline_rss=self._baseline[0],
            peak_rss=self._peak[0],
            baseline_pss=self._baseline[1],
            peak_pss=self._peak[1],
            baseline_mem=self._baseline[2],
            peak_mem=self._peak[2],
            samples=self._samples,
            processes=len(self._seen),
        )
