#!/bin/bash
# 8 B write_with_imm ping-pong between two processes over a same-host ring, two braid builds
# in alternation and UCX's shared-memory `tag_lat` after each pair (issue 14's latency goal).
# Server on CPU 0, client on CPU 1 (taskset), both busy-polling, as ucx_perftest does.
# Prints per round each build's median one-way latency (RTT/2, perftest's convention) and
# mean (the run's time over its round trips / 2), and UCX's typical and average.
#   scripts/ring-lat-ab.sh OLD_BRAID NEW_BRAID [ROUNDS] [ITERATIONS]
# Every process it starts ends with its round (a bench server serves one client).
set -euo pipefail
OLD=${1:?usage: ring-lat-ab.sh OLD_BRAID NEW_BRAID [ROUNDS] [ITERATIONS]}
NEW=${2:?usage: ring-lat-ab.sh OLD_BRAID NEW_BRAID [ROUNDS] [ITERATIONS]}
ROUNDS=${3:-4}
N=${4:-200000}
PORT=${RING_LAT_PORT:-19700}
command -v ucx_perftest >/dev/null || { echo "ucx_perftest missing (apt-get install ucx-utils)" >&2; exit 1; }
out=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$out"; }
trap cleanup EXIT
for r in $(seq 1 "$ROUNDS"); do
    for which in old new; do
        b=$OLD; [ $which = new ] && b=$NEW
        taskset -c 0 "$b" bench server --listen 127.0.0.1:$PORT >/dev/null 2>&1 &
        pids+=($!)
        srv=$!
        sleep 0.3
        taskset -c 1 timeout 120 "$b" bench write-lat --rails 127.0.0.1=127.0.0.1:$PORT -s 8 \
            --iters "$N" --poll-only --json "$out/l.json" >/dev/null 2>&1 || echo "round $r: $which failed" >&2
        wait "$srv" 2>/dev/null || true
        python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))['results'][0]
print('round $r $which: median %.4f us, mean %.4f us, min %.4f us' % (r['lat_us_median'], r['seconds'] / r['iterations'] / 2 * 1e6, r['lat_us_min']))
" "$out/l.json"
    done
    UCX_TLS=shm,self taskset -c 0 ucx_perftest -p $((PORT + 1)) >/dev/null 2>&1 &
    pids+=($!)
    srv=$!
    sleep 0.3
    UCX_TLS=shm,self taskset -c 1 timeout 120 ucx_perftest 127.0.0.1 -p $((PORT + 1)) -t tag_lat -s 8 -n "$N" 2>&1 \
        | awk -v r="$r" '/Final/{printf "round %s ucx: typical %.4f us, average %.4f us\n", r, $3, $4}'
    wait "$srv" 2>/dev/null || true
done
