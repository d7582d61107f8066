"""An ordinary ProcessPoolExecutor program; only the import changed."""

import math

from dpool import ProcessPoolExecutor  # was: from concurrent.futures import ProcessPoolExecutor

PRIMES = [112272535095293, 112582705942171, 112272535095293, 115280095190773,
          115797848077099, 1099726899285419]


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    for i in range(3, int(math.isqrt(n)) + 1, 2):
        if n % i == 0:
            return False
    return True


def main() -> None:
    with ProcessPoolExecutor(max_workers=2) as executor:
        for number, prime in zip(PRIMES, executor.map(is_prime, PRIMES)):
            print(f"{number} is prime: {prime}")
        squares = executor.map(lambda x: x * x, range(10))  # lambdas work too
        print("squares:", list(squares))


if __name__ == "__main__":
    main()
