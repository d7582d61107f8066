"""Child → parent protocol: one JSON object per stdout line, behind a marker.

Each metric is emitted as soon as it is measured, so a peer that crashes or
hangs part-way still reports what it finished. Anything a library prints to
stdout without the marker is ignored by the parent.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from peers import Unsupported

MARKER = "@@dpool-bench@@ "


class Recorder:
    def emit(self, kind: str, **payload: Any) -> None:
        line = json.dumps({"type": kind, **payload}, default=float)
        sys.stdout.write(MARKER + line + "\n")
        sys.stdout.flush()

    def meta(self, **info: Any) -> None:
        self.emit("meta", **info)

    def metric(self, key: str, value: float, **extra: Any) -> None:
        self.emit("metric", key=key, value=value, extra=extra)
        print(f"  {key} = {value:.6g}", file=sys.stderr, flush=True)

    def skip_metric(self, key: str, reason: str) -> None:
        self.emit("metric_skipped", key=key, reason=reason)

    def error(self, key: str, message: str) -> None:
        self.emit("metric_error", key=key, error=message)

    def note(self, text: str) -> None:
        self.emit("note", text=text)

    def skip_peer(self, reason: str) -> None:
        self.emit("skip", reason=reason)

    def done(self) -> None:
        self.emit("done")

    @contextmanager
    def workload(self, *keys: str) -> Iterator[None]:
        """Run one workload; an exception marks its metric(s) failed, not the run."""
        t0 = time.perf_counter()
        try:
            yield
        except Unsupported as exc:
            for key in keys:
                self.skip_metric(key, str(exc))
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            for key in keys:
                self.error(key, f"{type(exc).__name__}: {exc}")
        finally:
            print(f"  [{'/'.join(keys)}: {time.perf_counter() - t0:.2f}s]", file=sys.stderr, flush=True)
