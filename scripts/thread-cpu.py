#!/usr/bin/env python3
"""Per-thread CPU of a running process, every INTERVAL seconds until it exits: each
thread's share of one CPU (user + system) and of that its system share, from
/proc/PID/task/*/stat. Used for the ES-API pattern (docs/RESULTS.md):

    target/release/examples/exs_bench --size 65536 --depth 16 --dequeue-half --seconds 3 --rounds 2 &
    scripts/thread-cpu.py $! 1.5
"""
import os
import sys
import time


def snap(pid):
    threads = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            s = open(f"/proc/{pid}/task/{tid}/stat").read()
        except OSError:
            continue
        name = s[s.index("(") + 1 : s.rindex(")")]
        f = s[s.rindex(")") + 2 :].split()
        threads[tid] = (name, int(f[11]), int(f[12]))  # utime, stime (ticks)
    return threads


def main():
    pid = int(sys.argv[1])
    interval = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    hz = os.sysconf("SC_CLK_TCK")
    prev = snap(pid)
    for _ in range(3600):  # bounded: an hour at one-second intervals
        time.sleep(interval)
        cur = snap(pid)
        if cur is None:
            break
        row = []
        for tid, (name, u, s) in sorted(cur.items()):
            if tid not in prev:
                continue
            du = (u - prev[tid][1]) / hz / interval * 100
            ds = (s - prev[tid][2]) / hz / interval * 100
            if du + ds > 1:
                row.append(f"{tid}:{name}={du + ds:.0f}% (sys {ds:.0f}%)")
        print("  ".join(row), flush=True)
        prev = cur


if __name__ == "__main__":
    main()
