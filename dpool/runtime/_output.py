"""What the workers of a cluster driver's tasks print, on the driver's own stdout/stderr.

Output arrives as ``Output`` chunks from the node's connection and from leased workers'
(two reader threads), in pieces that need not end at a line or even at a character: each
(node, pid, stream) keeps its unfinished line and its UTF-8 decoder, and only whole lines
are written, prefixed with the worker's pid and node when it ran on another node (as Ray
prints ``(pid=..., ip=...)``). ``flush`` ends the unfinished lines when the driver closes.
"""

from __future__ import annotations

import codecs
import sys
import threading
from typing import Any

from dpool.protocol import messages as m


class OutputPrinter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._partial: dict[tuple, str] = {}  # unfinished output lines, per worker stream
        self._decoders: dict[tuple, Any] = {}

    def print(self, msg: m.Output) -> None:
        """Write the whole lines ``msg`` completes (any thread)."""
        with self._lock:
            self._print_locked(msg)

    def flush(self) -> None:
        """End every unfinished line (the driver is closing)."""
        with self._lock:
            for node, pid, stream in list(self._partial):
                self._print_locked(m.Output(0, pid, node, stream, b"\n"))

    def _print_locked(self, msg: m.Output) -> None:
        key = (msg.node, msg.pid, msg.stream)
        decoder = self._decoders.get(key)
        if decoder is None:  # a character split over two chunks decodes whole
            decoder = self._decoders[key] = codecs.getincrementaldecoder("utf-8")("replace")
        text = self._partial.pop(key, "") + decoder.decode(msg.data)
        lines = text.split("\n")
        rest = lines.pop()
        if rest:
            self._partial[key] = rest
        if not lines:
            return
        prefix = f"(pid={msg.pid}, node={msg.node}) " if msg.node else ""
        out = sys.stdout if msg.stream == 1 else sys.stderr
        try:
            out.write("".join(f"{prefix}{line}\n" for line in lines))
            out.flush()
        except (OSError, ValueError):
            pass  # the driver's stream is closed
