"""Large numpy arrays travel through shared memory, with no code change.

The same ProcessPoolExecutor program the stdlib runs: here the 64 MB array is stored once
in POSIX shared memory and every task maps it without copying (and may write to its own
view: copy-on-write, the original never changes).
"""

import time

import numpy as np

import dpool
from dpool import ProcessPoolExecutor


def column_sums(a: np.ndarray, start: int) -> float:
    a[start] = 0.0  # writing to the argument is fine: only this task's view changes
    return float(a[start:].sum())


def make(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.float64)  # a large result comes back the same way


def main() -> None:
    data = np.ones(8 * 1024 * 1024)  # 64 MB
    with ProcessPoolExecutor(max_workers=2) as ex:
        t0 = time.perf_counter()
        sums = list(ex.map(column_sums, [data] * 8, range(8)))
        print(f"8 tasks over a 64 MB array: {1e3 * (time.perf_counter() - t0):.0f} ms", sums[:3])
        print("the driver's array is untouched:", float(data.sum()))

        ref = dpool.put(data)  # or store it once explicitly and pass the ref
        print("via put:", ex.submit(column_sums, ref, 1).result())

        big = ex.submit(make, 1_000_000).result()
        big[:10] = -1  # results are writable too
        print("result:", big[:12])


if __name__ == "__main__":
    main()
