#!/bin/bash
# Blocking-wait ping-pongs of multi-frame messages over one unshaped testbed rail
# (docs/RAW-ETHERNET.md, "Limits of raw rails"): `braid bench write-lat --poll-spin-us 0` with
# 64 KiB messages, both sides asleep in their waits; prints the one-way statistics of the
# busy-polled and the blocking runs per round. T=tcp runs the same over TCP rails.
# Needs root; makes the testbed `rbl` and removes it at the end.
# usage: scripts/raw-blocking-lat.sh [BRAID] [ROUNDS] [SIZE]
set -euo pipefail
# The testbed's hosts talk over non-loopback addresses, which braid authenticates: one
# cluster secret for this run (or the caller's), read by both ends from the environment.
export BRAID_SECRET=${BRAID_SECRET:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}
BRAID=${1:-target/release/braid}
ROUNDS=${2:-3}
SIZE=${3:-65536}
"$BRAID" testbed up --name rbl --hosts 2 --rail-count 1 --rate none >/dev/null
out=$(mktemp -d)
cleanup() { "$BRAID" testbed down --name rbl >/dev/null 2>&1 || true; rm -rf "$out"; }
trap cleanup EXIT
H0="ip netns exec rbl-h0"; H1="ip netns exec rbl-h1"
for r in $(seq 1 "$ROUNDS"); do
    BRAID_TRANSPORT=${T:-raw} $H1 "$BRAID" bench server --listen 198.18.0.2:19700 >/dev/null 2>&1 &
    sp=$!
    sleep 0.4
    BRAID_TRANSPORT=${T:-raw} $H0 "$BRAID" bench write-lat --rails 198.18.0.1=198.18.0.2:19700 \
        -s "$SIZE" -n 5000 --poll-spin-us 0 --json "$out/r.json" >/dev/null 2>&1 || echo "round $r: braid run failed" >&2
    wait $sp || true
    python3 - "$out/r.json" "$r" "${T:-raw}" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))["results"][0]
for k, name in (("lat_poll", "busy"), ("lat_wait", "blocking")):
    if k in b:
        s = b[k]
        print(f"round {sys.argv[2]} {sys.argv[3]} {name}: median {s['median']:.1f} us, "
              f"p99 {s['p99']:.1f}, p99.9 {s['p999']:.1f}, max {s['max']:.1f} us")
PY
done
