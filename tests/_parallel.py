"""Running the suite in several processes (pytest-xdist: ``-n 3 --dist loadfile
--no-loadscope-reorder`` in pyproject.toml), with nothing shared that a test could trip
over. Files go to the workers whole (a module-scoped cluster starts once), in collection
order: the long cluster files first, the many short ones after, filling the gaps.

What the test processes (xdist *workers*) could share, and what keeps them apart:

- **Loopback addresses and ports.** A cluster test's nodes listen on a block of loopback
  addresses of their worker's own (``host``: ``127.0.<worker>.<n>``; 127.0.0.n without
  xdist), so no two workers' nodes meet; Redis shards and everything else listen on a
  port of their own address or on port 0.
- **State directories.** Each worker has its own base temp dir (xdist's); every node's
  state dir is a ``tmp_path`` in it; no test uses the default state dir.
- **/dev/shm.** Segment names carry their owner's pid, so two workers never create the
  same name. But dpool removes a *dead* owner's segments from any process (each new
  runtime and executor does, and ``dpool stop``). A test whose assertions are about who
  removes a dead owner's segments, or that needs them to stay until it looks, is marked
  ``exclusive``: it runs while no other test runs, in any worker (``Turns``); so is a
  test that a busy machine would break. The leak check (tests/conftest.py) counts a dead
  owner's segments as its own worker's unless another worker started that owner
  (``started_elsewhere``): each worker writes down the pids of the processes it starts
  (``track_started``, ``note``).

Both conftests (tests/, compat/) call ``install``; without xdist (``-n 0``) nothing
changes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

WORKER: Optional[str] = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ...
INDEX = int(WORKER[2:]) if WORKER and WORKER[2:].isdigit() else 0


def host(n: int) -> str:
    """Loopback address ``n`` of this worker's block (127.0.0.n without xdist)."""
    return f"127.0.{INDEX}.{n}"


def shared_dir(config: pytest.Config) -> Optional[Path]:
    """A directory all workers of this run share (the parent of their base temp dirs);
    None without xdist."""
    if WORKER is None or not config.option.basetemp:
        return None
    return Path(config.option.basetemp).parent


class Turns:
    """Whose turn it is to run a test, among the workers: any number of *shared* turns at
    once, or one *exclusive* turn alone.

    Two ``flock`` locks on files every worker opens: ``run`` (shared by running tests,
    exclusive for an exclusive one) and ``gate``, held by an exclusive test while it
    waits, so that new shared turns queue behind it instead of starving it."""

    def __init__(self, folder: Path) -> None:
        def lock_file(name: str) -> int:
            return os.open(folder / f"dpool-tests-{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)

        self._gate, self._run = lock_file("gate"), lock_file("run")

    @contextlib.contextmanager
    def turn(self, exclusive: bool) -> Iterator[None]:
        if exclusive:
            fcntl.flock(self._gate, fcntl.LOCK_EX)
            fcntl.flock(self._run, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._run, fcntl.LOCK_UN)
                fcntl.flock(self._gate, fcntl.LOCK_UN)
        else:
            fcntl.flock(self._gate, fcntl.LOCK_SH)  # passes unless an exclusive one waits
            fcntl.flock(self._run, fcntl.LOCK_SH)
            fcntl.flock(self._gate, fcntl.LOCK_UN)
            try:
                yield
            finally:
                fcntl.flock(self._run, fcntl.LOCK_UN)


class Plugin:
    """The hook, registered once per test process (``install``)."""

    def __init__(self, config: pytest.Config) -> None:
        folder = shared_dir(config)
        self.turns = Turns(folder) if folder is not None else None

    # the outermost wrapper: waiting for a turn counts against no test's timeout
    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        """Run ``item`` -- setup, call, teardown, module fixtures included -- in its turn."""
        if self.turns is None:
            yield
            return
        with self.turns.turn(exclusive=item.get_closest_marker("exclusive") is not None):
            yield


_PLUGIN = "dpool-tests-parallel"


def install(config: pytest.Config) -> None:
    """Register the hooks and start ``track_started``, once per test process."""
    if config.pluginmanager.has_plugin(_PLUGIN):
        return
    config.pluginmanager.register(Plugin(config), _PLUGIN)
    track_started(config)


# -- who started which process (for the leak check) --------------------------------------

_REGISTRY_PREFIX = "dpool-tests-started-"
_registry: Optional[Path] = None


def track_started(config: pytest.Config) -> None:
    """From now on, write down the pid of every process this worker starts with
    ``subprocess`` (drivers, ``dpool`` commands); nodes are written down by ``note``."""
    global _registry
    folder = shared_dir(config)
    if folder is None or _registry is not None:
        return
    _registry = folder / f"{_REGISTRY_PREFIX}{WORKER}"
    _registry.touch()
    init = subprocess.Popen.__init__

    def __init__(self: subprocess.Popen, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        note(self.pid)

    subprocess.Popen.__init__ = __init__  # type: ignore[method-assign]


def note(pid: int) -> None:
    """Write down that this worker started ``pid``."""
    if _registry is not None:
        with open(_registry, "a") as f:
            f.write(f"{pid}\n")


def started_elsewhere() -> set[int]:
    """Pids that another worker of this run started."""
    if _registry is None:
        return set()
    out: set[int] = set()
    for path in _registry.parent.glob(f"{_REGISTRY_PREFIX}*"):
        if path != _registry:
            with contextlib.suppress(OSError):
                out.update(int(x) for x in path.read_text().split() if x.isdigit())
    return out
