import time, statistics, multiprocessing, dpool, sys
def noop(x=None): return x
if __name__ == "__main__":
    items = list(range(100000))
    for P, name in ((multiprocessing.Pool, "mp"), (dpool.Pool, "dpool")):
        with P(2) as p:
            p.map(noop, list(range(1000)))
            ts = []
            for _ in range(7):
                t = time.perf_counter(); p.map(noop, items); ts.append(time.perf_counter() - t)
            print(name, "map 100k ms:", [round(x*1e3,1) for x in ts])
