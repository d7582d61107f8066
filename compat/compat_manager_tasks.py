"""Module-level helpers of the manager tests (workers of either implementation import them)."""

from __future__ import annotations


def bump(counter, lock, n):  # noqa: ANN001 - proxies of either implementation
    for _ in range(n):
        with lock:
            counter.value += 1
    return n


def fill(d, l, q, i):  # noqa: ANN001
    d[i] = i * i
    l.append(i)
    q.put(i)
    return i


class Counter:
    def __init__(self, start=0):  # noqa: ANN001
        self.n = start

    def add(self, k=1):  # noqa: ANN001
        self.n += k
        return self.n

    def get(self):
        return self.n

    def fail(self):
        raise ValueError("counter says no")

    def hidden(self):
        return "hidden"


def square(x):  # noqa: ANN001
    return x * x


def add(a, b):  # noqa: ANN001
    return a + b


def fail(x):  # noqa: ANN001
    raise ValueError(f"bad {x}")
