"""Segment names and their owners: the naming scheme, whether an owner process lives,
and reaping the segments of one that died.

Segment names are ``/dpool_<ownerpid>_<hex object id>`` (:func:`segment_name`), so that
the segments of a store whose owner died can be found and unlinked: by the owner's
workers before they exit (:func:`reap_owner`), and by :func:`reap_orphans` when any
runtime starts or creates an executor. ``_segment`` (which writes and reads segments)
re-exports these names; they live apart so that starting a runtime, which reaps, does
not load the store's writing and mapping machinery a program may never use.
"""

from __future__ import annotations

import os

from dpool import _log

__all__ = [
    "SHM_DIR",
    "segment_name",
    "owner_of",
    "unlink",
    "process_state",
    "owner_started",
    "owner_dead",
    "reap_orphans",
    "reap_owner",
    "shm_free_bytes",
    "shm_total_bytes",
]

logger = _log.getLogger("dpool.objects")

SHM_DIR = "/dev/shm"
"""Where Linux exposes POSIX shared memory as files (used for free space and reaping)."""

_PREFIX = "dpool_"

def segment_name(owner_pid: int, object_id: int) -> str:
    """The segment name of object ``object_id`` in the store owned by process ``owner_pid``.

    The only place that knows the naming scheme (with ``_owner_of`` reading it back).
    Object ids must be unique per owner process (not just per executor) for names not
    to collide.
    """
    if owner_pid <= 0 or object_id < 0:
        raise ValueError(f"bad owner pid {owner_pid} or object id {object_id}")
    return f"/{_PREFIX}{owner_pid}_{object_id:x}"


def shm_free_bytes() -> int | None:
    """Bytes still free in ``/dev/shm`` (None where there is no such directory)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def shm_total_bytes() -> int | None:
    """Size of the ``/dev/shm`` file system (None where there is no such directory)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def owner_of(name: str) -> int:
    """The owner pid in a segment's name (``dpool_<pid>_<id>``: ASCII digits, then ASCII
    letters and digits), 0 for any other name. (String tests, not a regular expression:
    compiling one cost every program's start ~0.4 M instructions.)"""
    body = name.lstrip("/")
    if not body.startswith(_PREFIX):
        return 0
    pid, sep, rest = body[len(_PREFIX):].partition("_")
    if (sep and pid.isascii() and pid.isdigit() and rest.isascii() and rest.isalnum()):
        return int(pid)
    return 0


def unlink(name: str) -> bool:
    """Remove segment ``name``; False if it did not exist. Existing mappings stay valid."""
    import posix_ipc

    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        return False
    logger.debug("unlinked segment %s", name)
    return True


_boot_time: float | None = None


def process_state(pid: int) -> tuple[bool, float] | None:
    """(whether it is a zombie, when it started) of process ``pid``, None if there is no
    such process; raises ``OSError`` when that cannot be told (e.g. access denied).

    The start time is psutil's ``create_time()`` (seconds since the epoch). On Linux it
    is read from ``/proc`` directly: importing psutil was a good part of every program's
    start-up (bench/NOTES.md), for one file read here.
    """
    global _boot_time
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        if not os.path.isdir("/proc/self"):  # no procfs: not Linux
            return _process_state_psutil(pid)
        try:
            os.kill(pid, 0)  # where /proc hides it, it may exist: OSError (EPERM)
        except ProcessLookupError:
            return None
        raise
    # after the command name (which may hold spaces and parentheses): state, ..., and the
    # start time in clock ticks after boot, the 22nd field of the line (proc(5))
    fields = stat[stat.rindex(b")") + 2:].split()
    if _boot_time is None:
        with open("/proc/stat", "rb") as f:
            _boot_time = next(float(line.split()[1]) for line in f
                              if line.startswith(b"btime"))
    return fields[0] == b"Z", int(fields[19]) / _CLOCK_TICKS + _boot_time


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _process_state_psutil(pid: int) -> tuple[bool, float] | None:
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc.status() == psutil.STATUS_ZOMBIE, proc.create_time()
    except psutil.NoSuchProcess:
        return None
    except psutil.Error as exc:
        raise OSError(f"process {pid}: {exc}") from exc


def owner_started(pid: int) -> float | None:
    """When process ``pid`` started (to tell it from a later process given the same
    pid), or None if there is no such process."""
    try:
        state = process_state(pid)
    except OSError:
        return None
    return None if state is None else state[1]


def owner_dead(pid: int, started: float | None = None) -> bool:
    """Whether the store owner ``pid`` is gone, so its segments are orphans.

    A zombie is dead (it can create or use nothing). ``started`` (:func:`owner_started`
    while it lived) tells a reused pid apart: a different live process under the same pid
    means the owner died, but the segment names ``dpool_<pid>_*`` may now be that
    process's own, so they are left alone (False), until that process exits too.
    """
    try:
        state = process_state(pid)
    except OSError:  # e.g. access denied: it exists, leave it alone
        return False
    if state is None or state[0]:  # gone, or a zombie
        return True
    return False  # alive (under ``started``, or a later process under the same pid)


def _reap_entry(entry: str) -> bool:
    path = os.path.join(SHM_DIR, entry)
    if os.path.isdir(path):  # a dead owner's recycling pool (_recycle)
        import shutil

        shutil.rmtree(path, ignore_errors=True)  # several reapers may race: harmless
        return not os.path.exists(path)
    try:  # (on Linux a segment is this file: no posix_ipc import to reap one)
        os.unlink(path)
    except OSError:  # another reaper was first, or another user's: not ours to remove
        return False
    logger.debug("unlinked segment /%s", entry)
    return True


def reap_orphans() -> list[str]:
    """Unlink every ``dpool_<pid>_*`` segment whose owner process is not alive.

    Called when a runtime starts and when an executor or Pool is created, so the
    segments of a driver that was SIGKILLed (and whose workers did not clean up, see
    :func:`reap_owner`) are reclaimed. Returns the names unlinked. A dead owner's pid that
    has been reused by a live process keeps its segments until that process exits too.
    """
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return []
    dead: dict[int, bool] = {}
    reaped: list[str] = []
    for entry in entries:
        pid = owner_of(entry)
        if not pid:
            continue
        if pid not in dead:
            dead[pid] = owner_dead(pid)
        if dead[pid] and _reap_entry(entry):
            reaped.append("/" + entry)
    if reaped:
        logger.info("reaped %d orphaned shared-memory segments", len(reaped))
    return reaped


def reap_owner(pid: int, started: float | None = None, exiting: bool = False,
               timeout: float = 2.0) -> list[str]:
    """Unlink the segments (and recycling pool) of store owner ``pid`` if it is dead.

    For a worker whose driver died: it removes what the dead owner left before it exits,
    so nothing stays in ``/dev/shm`` even if no dpool program starts again. ``started``:
    see :func:`owner_dead`. ``exiting`` (the caller is about to exit): hold off this
    process's segment writes first, for good, waiting up to ``timeout`` s for those under
    way, so that none is created after the listing. Several workers may do this at once:
    each name is unlinked by one of them, the others find it gone. Returns the names this
    call unlinked.
    """
    if not owner_dead(pid, started):
        return []
    if exiting:
        from dpool.objects import _forkguard

        _forkguard.hold(timeout)
    prefix = f"{_PREFIX}{pid}_"
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return []
    reaped = ["/" + e for e in entries
              if e.startswith(prefix) and owner_of(e) and _reap_entry(e)]
    if reaped:
        logger.info("reaped %d shared-memory segments of dead owner %d", len(reaped), pid)
    return reaped
