"""What every dpool daemon process does the same way (node daemon, global scheduler).

``dpool start`` runs each as ``python -m ...`` with the token in ``$DPOOL_TOKEN`` (never
on the command line, where ``ps`` shows it) and a pipe on ``--ready-fd``: the daemon
writes one line there, ``READY <what>`` once it serves or ``ERROR <why>`` if it cannot,
so ``dpool start`` returns only when it answers. It runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import sys
import threading
from typing import Optional


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--redis", default="", help="control-store shards, comma-separated")
    p.add_argument("--ready-fd", type=int, default=None)
    p.add_argument("--log-level", default=os.environ.get("DPOOL_LOG_LEVEL", "INFO"))


class DaemonProcess:
    def __init__(self, name: str, args: argparse.Namespace) -> None:
        logging.basicConfig(level=args.log_level,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
        self.name = name
        self.token = os.environ.pop("DPOOL_TOKEN", "")
        self.redis = [a for a in args.redis.split(",") if a]
        self._ready = os.fdopen(args.ready_fd, "w") if args.ready_fd is not None else None
        self._stop = threading.Event()

    def _report(self, line: str) -> None:
        if self._ready is not None:
            self._ready.write(line + "\n")
            self._ready.close()
            self._ready = None

    def failed(self, why: str) -> int:
        """It cannot start: say why (to ``dpool start`` and stderr); the exit status."""
        self._report(f"ERROR {why}")
        sys.stderr.write(f"{self.name}: {why}\n")
        return 1

    def serving(self, what: str) -> None:
        self._report(f"READY {what}")

    def run_until_stopped(self, poll_s: float = 5.0) -> None:
        """Sleep until SIGTERM or SIGINT. The main thread waits on the signal wakeup fd,
        which the C-level handler writes whichever thread the signal hits (a wait on a
        lock would not be interrupted then), so it needs no polling; ``poll_s`` is a
        safety net."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        try:
            while not self._stop.is_set():
                select.select([r], [], [], poll_s)  # the Python handler runs after it
                try:
                    while os.read(r, 512):
                        pass
                except BlockingIOError:
                    pass
        finally:
            signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)

    def missing_token(self) -> Optional[int]:
        """The exit status if ``$DPOOL_TOKEN`` was not given, else None."""
        if self.token:
            return None
        sys.stderr.write(f"{self.name}: $DPOOL_TOKEN is not set\n")
        return 2
