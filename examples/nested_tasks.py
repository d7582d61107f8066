"""Tasks that submit tasks, futures as arguments, and dpool.wait."""

import dpool
from dpool import ProcessPoolExecutor


def fib(n: int) -> int:
    if n < 2:
        return n
    ex = dpool.get_executor()  # inside a task: the executor running this task
    a, b = ex.submit(fib, n - 1), ex.submit(fib, n - 2)
    return a.result() + b.result()  # waiting gives this worker's slot back


def add(a: int, b: int) -> int:
    return a + b


def main() -> None:
    with ProcessPoolExecutor(max_workers=1) as ex:  # even one worker cannot deadlock
        print("fib(7) =", ex.submit(fib, 7).result())
        x = ex.submit(add, 1, 2)
        y = ex.submit(add, x, 10)  # a future as an argument: runs when x is ready
        done, not_done = dpool.wait([x, y], num_returns=2, timeout=30)
        print("dataflow:", [f.result() for f in done], "pending:", not_done)


if __name__ == "__main__":
    main()
