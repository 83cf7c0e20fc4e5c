#!/usr/bin/env python3
"""Measures the braid-dsm example applications (examples/dsm/README.md) and prints JSON.

For each application: the plain sequential program, the DSM program as 1 rank, and as 2
ranks on the two hosts of a testbed with 4 x 1 Gbit/s rails (`braid testbed up --name
NAME --hosts 2 --rail-count 4`, made and removed by this script unless --keep-testbed), each
DSM run checked bit for bit against the sequential program's result (--expect HASH).
Reports the times, the speedups (sequential / 2 ranks, 1 rank / 2 ranks), every rank's
waiting time in barriers and locks, its DSM counters (faults, pages sent) and the bytes
braid sent on each rail, and the load average before each run.

Run it under the machine's benchmark lock with raised priority:
    flock /work/bench.lock nice -n -10 python3 examples/dsm/measure.py --out dsm-apps.json

Priority: with the kernel's autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled
= 1), `nice` only ranks threads within one session's group, and every session gets an
equal share of the CPUs whatever its nice value; so the script moves itself into a
session of its own and gives that group the same nice value as the process
(--autogroup-nice, default: the process's nice; "off" to leave it). Its runs then get
the cores the way `nice -n -10` means to. The JSON records what was in effect.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.join(ROOT, "target", "dsm-apps")
BRAID = os.path.join(ROOT, "target", "release", "braid")

# Full sizes: SOR sized for about 20 s sequentially on this machine (2-core VM).
FULL = {
    "sor": ["--n", "8192", "--iters", "200"],
    "matmul": ["--n", "3840"],
    "mandel": ["--w", "2048", "--h", "2048", "--rows", "8", "--iters", "2000"],
}
SMALL = {
    "sor": ["--n", "1024", "--iters", "40"],
    "matmul": ["--n", "512"],
    "mandel": ["--w", "1024", "--h", "1024", "--rows", "8", "--iters", "1000"],
}


def autogroup_boost(nice):
    """Moves this process into a session (and autogroup) of its own with nice `nice`;
    returns the autogroup line, or why not."""
    try:
        os.setsid()
    except OSError as e:
        return f"not moved ({e})"
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
        with open("/proc/self/autogroup") as f:
            return f.read().strip()
    except OSError as e:
        return f"not set ({e})"


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def run(cmd, timeout):
    """Runs cmd; returns (stdout, stderr); raises with the output on failure."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(
            f"measure: {' '.join(cmd)} failed (exit {p.returncode}):\n{p.stdout}\n{p.stderr}"
        )
    return p.stdout, p.stderr


def json_lines(text):
    """The result lines of the ranks (`[r] {...}` under braid run, or bare)."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^(?:\[\d+\] )?(\{\"app\".*\})\s*$", line)
        if m:
            out.append(json.loads(m.group(1)))
    return out


def dsm_run(app, args, ranks, testbed, want, timeout):
    cmd = [BRAID, "run", "-n", str(ranks), "--timeout", str(timeout)]
    if testbed:
        cmd += ["--testbed", testbed]
    cmd += ["--", os.path.join(BIN, app + "_dsm")] + args + ["--expect", want]
    load = loadavg()
    out, _ = run(cmd, timeout + 30)
    lines = sorted(json_lines(out), key=lambda r: r["rank"])
    if len(lines) != ranks:
        raise SystemExit(f"measure: {len(lines)} result lines from {ranks} ranks:\n{out}")
    r0 = lines[0]
    if r0.get("check") != "equal to --expect":
        raise SystemExit(f"measure: {app} on {ranks} ranks: {r0.get('check')}")
    rails = [0] * max(len(r["stats"]["rail_bytes_sent"]) for r in lines)
    for r in lines:
        for i, b in enumerate(r["stats"]["rail_bytes_sent"]):
            rails[i] += b
    return {
        "command": " ".join(cmd),
        "load_before": load,
        "seconds": max(r["seconds"] for r in lines),
        "check": r0["check"],
        "rail_bytes_sent": rails,
        "ranks": [
            {
                "rank": r["rank"],
                "seconds": r["seconds"],
                "wait_s": r["wait_s"],
                "barriers": r["barriers"],
                **{k: r[k] for k in ("rows", "cpu_s", "process_cpu_s", "init_s", "fetch_s", "tasks_done") if k in r},
                "stats": r["stats"],
            }
            for r in lines
        ],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--apps", default="sor,matmul,mandel", help="comma-separated subset")
    ap.add_argument("--small", action="store_true", help="small sizes (a quick look)")
    ap.add_argument("--testbed", default="dsmapps", help="testbed name (default dsmapps)")
    ap.add_argument("--keep-testbed", action="store_true",
                    help="use a standing testbed of that name and leave it up")
    ap.add_argument("--timeout", type=int, default=240, help="per DSM run, seconds")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--spin-wait-us", default="default",
                    help="BRAID_DSM_SPIN_WAIT_US for the DSM runs (default: braid-dsm's own, "
                    "2000)")
    ap.add_argument("--autogroup-nice", default="process",
                    help="nice of this run's autogroup: a number, 'process' (default: the "
                    "process's nice) or 'off'")
    a = ap.parse_args()
    if a.autogroup_nice == "off":
        group = "unchanged"
    else:
        nice = os.nice(0) if a.autogroup_nice == "process" else int(a.autogroup_nice)
        group = autogroup_boost(nice)
    if a.spin_wait_us != "default":
        os.environ["BRAID_DSM_SPIN_WAIT_US"] = a.spin_wait_us
    apps = a.apps.split(",")
    sizes = SMALL if a.small else FULL
    for app in apps:
        if app not in sizes:
            ap.error(f"unknown app {app!r} (have {', '.join(sizes)})")
    if not a.no_build:
        run(["sh", os.path.join(ROOT, "examples", "dsm", "build.sh")], 1800)
    made = False
    if not a.keep_testbed:
        run([BRAID, "testbed", "up", "--name", a.testbed, "--hosts", "2", "--rail-count", "4"], 120)
        made = True
    result = {
        "machine": {"cpus": os.cpu_count(), "nice": os.nice(0), "autogroup": group},
        "testbed": f"{a.testbed}: 2 hosts, 4 x 1 Gbit/s rails",
        "env": {k: v for k, v in os.environ.items() if k.startswith("BRAID_DSM_")},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "apps": {},
    }
    try:
        for app in apps:
            args = sizes[app]
            cmd = [os.path.join(BIN, app + "_seq")] + args
            load = loadavg()
            out, _ = run(cmd, 3600)
            seq = json_lines(out)[0]
            seq = {"command": " ".join(cmd), "load_before": load, **seq}
            print(f"{app} seq: {seq['seconds']:.2f} s (load {load[0]})", file=sys.stderr)
            one = dsm_run(app, args, 1, None, seq["hash"], a.timeout)
            print(f"{app} 1 rank: {one['seconds']:.2f} s", file=sys.stderr)
            two = dsm_run(app, args, 2, a.testbed, seq["hash"], a.timeout)
            print(f"{app} 2 ranks on 2 hosts: {two['seconds']:.2f} s, "
                  f"speedup {seq['seconds'] / two['seconds']:.2f}x", file=sys.stderr)
            result["apps"][app] = {
                "args": " ".join(args),
                "sequential": seq,
                "dsm_1_rank": one,
                "dsm_2_ranks_2_hosts": two,
                "speedup_2_ranks_vs_sequential": round(seq["seconds"] / two["seconds"], 3),
                "speedup_2_ranks_vs_1_rank": round(one["seconds"] / two["seconds"], 3),
                "dsm_1_rank_vs_sequential": round(one["seconds"] / seq["seconds"], 3),
            }
    finally:
        if made:
            subprocess.run([BRAID, "testbed", "down", "--name", a.testbed],
                           capture_output=True, timeout=120)
    result["load_after"] = loadavg()
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
