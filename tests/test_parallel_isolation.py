"""What keeps two xdist workers apart (tests/_parallel.py) does: exclusive turns run
alone, each worker has its own loopback block, the leak check knows who started what.

Two ``Turns`` opened separately contend as two workers would: ``flock`` locks taken
through different open files conflict even within one process."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests import _parallel
from tests._parallel import Turns


class _Held:
    """A turn held in a thread of its own until ``release``."""

    def __init__(self, turns: Turns, exclusive: bool) -> None:
        self.entered = threading.Event()
        self._release = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(turns, exclusive))
        self._thread.start()

    def _run(self, turns: Turns, exclusive: bool) -> None:
        with turns.turn(exclusive):
            self.entered.set()
            self._release.wait(30)

    def release(self) -> None:
        self._release.set()
        self._thread.join(30)


def test_shared_turns_run_together(tmp_path: Path) -> None:
    first = _Held(Turns(tmp_path), exclusive=False)
    second = _Held(Turns(tmp_path), exclusive=False)
    try:
        assert first.entered.wait(10) and second.entered.wait(10)
    finally:
        first.release()
        second.release()


def test_an_exclusive_turn_waits_for_the_running_one_and_holds_off_new_ones(tmp_path: Path):
    running = _Held(Turns(tmp_path), exclusive=False)
    assert running.entered.wait(10)
    exclusive = _Held(Turns(tmp_path), exclusive=True)
    time.sleep(0.2)
    assert not exclusive.entered.is_set()  # the running test goes on alone
    later = _Held(Turns(tmp_path), exclusive=False)
    time.sleep(0.2)
    assert not later.entered.is_set()  # queued behind the exclusive one
    running.release()
    assert exclusive.entered.wait(10)
    time.sleep(0.2)
    assert not later.entered.is_set()  # nothing runs beside an exclusive turn
    exclusive.release()
    assert later.entered.wait(10)
    later.release()


def test_each_worker_has_its_own_loopback_block(monkeypatch) -> None:
    monkeypatch.setattr(_parallel, "INDEX", 0)
    assert _parallel.host(2) == "127.0.0.2"  # as without xdist
    monkeypatch.setattr(_parallel, "INDEX", 1)
    assert _parallel.host(2) == "127.0.1.2"


def test_the_leak_check_knows_what_other_workers_started(tmp_path: Path, monkeypatch) -> None:
    mine, theirs = tmp_path / "dpool-tests-started-gw0", tmp_path / "dpool-tests-started-gw1"
    mine.touch()
    theirs.write_text("4242\n4343\n")
    monkeypatch.setattr(_parallel, "_registry", mine)
    _parallel.note(5151)
    assert mine.read_text() == "5151\n"
    assert _parallel.started_elsewhere() == {4242, 4343}
