#!/bin/bash
# Where the CPU goes while braid streams 4 MiB writes over N unshaped testbed rails: a 3 s
# `braid bench write`, and for 1.5 s in its middle each braid thread's share of a CPU
# (/proc/PID/task/TID/stat), the ksoftirqd threads', and the machine's idle, softirq, system
# and user time (/proc/stat); then the run's MB/s. Alternate two builds to compare them.
# Needs root; makes the testbed `bwc` and removes it at the end.
# usage: scripts/bw-cpu.sh [BRAID] [RAILS] [BENCH_WRITE_ARGS...]
set -euo pipefail
# The testbed's hosts talk over non-loopback addresses, which braid authenticates: one
# cluster secret for this run (or the caller's), read by both ends from the environment.
export BRAID_SECRET=${BRAID_SECRET:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}
BRAID=${1:-target/release/braid}
N=${2:-4}
shift $(( $# < 2 ? $# : 2 ))
"$BRAID" testbed up --name bwc --hosts 2 --rail-count "$N" --rate none >/dev/null
out=$(mktemp -d)
cleanup() { "$BRAID" testbed down --name bwc >/dev/null 2>&1 || true; rm -rf "$out"; }
trap cleanup EXIT
listen=$(seq 0 $((N - 1)) | sed 's/.*/198.18.&.2:19900/' | paste -sd,)
rails=$(seq 0 $((N - 1)) | sed 's/.*/198.18.&.1=198.18.&.2:19900/' | paste -sd,)
ip netns exec bwc-h1 "$BRAID" bench server --listen "$listen" >/dev/null 2>&1 &
sp=$!
sleep 0.4
ip netns exec bwc-h0 "$BRAID" bench write -s 4M -D 3 --rails "$rails" "$@" \
    --json "$out/bw.json" >/dev/null 2>&1 &
cp=$!
sleep 1
snap() {
    for p in $sp $cp; do
        for t in /proc/$p/task/*; do
            echo "$([ $p = $sp ] && echo server || echo client) $(basename "$t") $(cat "$t/comm") $(awk '{print $14 + $15}' "$t/stat")"
        done
    done
    for k in $(pgrep ksoftirqd); do echo "kernel $k ksoftirqd $(awk '{print $14 + $15}' /proc/$k/stat)"; done
    head -1 /proc/stat
}
snap > "$out/s1"
sleep 1.5
snap > "$out/s2"
wait $cp
wait $sp || true
python3 - "$out" <<'PY'
import json, os, sys
d = sys.argv[1]
tick = os.sysconf("SC_CLK_TCK")
def load(f):
    rows = {}
    for line in open(f):
        p = line.split()
        rows["cpu" if p[0] == "cpu" else tuple(p[:3])] = list(map(int, p[1:])) if p[0] == "cpu" else int(p[3])
    return rows
a, b = load(f"{d}/s1"), load(f"{d}/s2")
for k in b:
    if k != "cpu" and k in a and b[k] > a[k]:
        print(f"{k[0]:7} {k[2]:16} {100 * (b[k] - a[k]) / tick / 1.5:5.1f}% of a CPU")
ca, cb = a["cpu"], b["cpu"]
tot = sum(cb) - sum(ca)
share = lambda *i: 100 * sum(cb[j] - ca[j] for j in i) / tot
print(f"machine: idle {share(3, 4):.1f}%, softirq {share(6):.1f}%, system {share(2):.1f}%, user {share(0, 1):.1f}%")
print(f"braid {json.load(open(f'{d}/bw.json'))['results'][0]['bw_mb_s']:.1f} MB/s")
PY
