import time, statistics, sys
from dpool import ProcessPoolExecutor
def noop(x=None): return x
if __name__ == "__main__":
    with ProcessPoolExecutor(2) as ex:
        for _ in range(200): ex.submit(noop, 1).result()
        rts = []
        for _ in range(3000):
            s = time.perf_counter(); ex.submit(noop, 1).result(); rts.append(time.perf_counter() - s)
        rts.sort()
        print(f"rt median {statistics.median(rts)*1e6:.0f} us  p10 {rts[300]*1e6:.0f}  p90 {rts[2700]*1e6:.0f}")
        if len(sys.argv) > 1:
            import cProfile, pstats
            pr = cProfile.Profile(); pr.enable()
            for _ in range(2000): ex.submit(noop, 1).result()
            pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(12)
