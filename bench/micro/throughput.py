import time, sys
from dpool import ProcessPoolExecutor
def noop(x=None): return x
if __name__ == "__main__":
    with ProcessPoolExecutor(2) as ex:
        ex.submit(noop, 1).result()
        for _ in range(3):
            s = time.perf_counter(); fs = [ex.submit(noop, 1) for _ in range(10000)]; t1 = time.perf_counter(); [f.result() for f in fs]; d = time.perf_counter()-s
            print(f"tput {10000/d:.0f}/s  submit loop {1e6*(t1-s)/10000:.1f} us/task")
        if len(sys.argv) > 1:
            import cProfile, pstats
            pr = cProfile.Profile(); pr.enable()
            fs = [ex.submit(noop, 1) for _ in range(10000)]; [f.result() for f in fs]
            pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(15)
