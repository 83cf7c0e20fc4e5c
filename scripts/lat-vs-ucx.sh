#!/bin/bash
# 8 B latency over one unshaped testbed rail, braid against UCX and TCP in alternation
# (issue 17's first goal): braid's write_with_imm ping-pong busy-polled and with blocking
# waits (`braid bench write-lat --baseline`, which also runs the busy-polling and the
# blocking TCP ping-pong on the same rail), then `ucx_perftest -t tag_lat` over TCP
# (UCX_TLS=tcp) on the same rail. Needs root and ucx-utils; makes the testbed `latu` and
# removes it at the end. Each round also times 8 B `read` and `fetch_add` (`braid bench
# read-lat` and `atomic-lat`, whole operations) beside the TCP ping-pong's round trip.
# usage: scripts/lat-vs-ucx.sh [BRAID] [ROUNDS] [BRAID_BENCH_ARGS...]
set -euo pipefail
# The testbed's hosts talk over non-loopback addresses, which braid authenticates: one
# cluster secret for this run (or the caller's), read by both ends from the environment.
export BRAID_SECRET=${BRAID_SECRET:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}
BRAID=${1:-target/release/braid}
ROUNDS=${2:-3}
shift $(( $# < 2 ? $# : 2 ))
command -v ucx_perftest >/dev/null || { echo "ucx_perftest missing (apt-get install ucx-utils)" >&2; exit 1; }
"$BRAID" testbed up --name latu --hosts 2 --rail-count 1 --rate none >/dev/null
cleanup() { "$BRAID" testbed down --name latu >/dev/null 2>&1 || true; }
trap cleanup EXIT
H0="ip netns exec latu-h0"; H1="ip netns exec latu-h1"
A=198.18.0.1; B=198.18.0.2
out=$(mktemp -d)
for r in $(seq 1 "$ROUNDS"); do
    $H1 "$BRAID" bench server --listen $B:19600 >/dev/null 2>&1 &
    sp=$!
    sleep 0.4
    $H0 "$BRAID" bench write-lat --rails $A=$B:19600 -s 8 --iters 20000 --baseline "$@" \
        --json "$out/b.json" >/dev/null 2>&1 || echo "round $r: braid run failed" >&2
    wait $sp || true
    for op in read-lat atomic-lat; do
        $H1 "$BRAID" bench server --listen $B:19600 >/dev/null 2>&1 &
        sp=$!
        sleep 0.4
        $H0 "$BRAID" bench $op --rails $A=$B:19600 -s 8 --iters 20000 --baseline "$@" \
            --json "$out/$op.json" >/dev/null 2>&1 || echo "round $r: braid $op failed" >&2
        wait $sp || true
    done
    UCX_TLS=tcp UCX_NET_DEVICES=p0r0 timeout 60 $H1 ucx_perftest -p 19601 >/dev/null 2>&1 &
    up=$!
    sleep 0.5
    UCX_TLS=tcp UCX_NET_DEVICES=p1r0 timeout 60 $H0 ucx_perftest $B -p 19601 -t tag_lat -s 8 \
        -n 20000 > "$out/u.txt" 2>&1 || echo "round $r: ucx_perftest failed" >&2
    wait $up || true
    python3 - "$out/b.json" "$out/u.txt" "$r" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))["results"][0]
ucx = None
for line in open(sys.argv[2]):
    if line.startswith("Final:"):
        ucx = float(line.split()[2])  # 50th percentile, one way (usec)
med = lambda k: b[k]["median"] if k in b else None
poll, wait, tp, tw = med("lat_poll"), med("lat_wait"), med("tcp_lat_poll"), med("tcp_lat")
line = f"round {sys.argv[3]}: braid busy {poll:.2f} us; UCX tag_lat {ucx} us; TCP busy {tp:.2f} us"
if ucx:
    line += f"; braid/UCX {poll / ucx:.2f}, busy braid/TCP {poll / tp:.2f}"
if wait is not None and tw is not None:  # absent with --poll-only
    line += f"; blocking: braid {wait:.2f} us, TCP {tw:.2f} us, braid/TCP {wait / tw:.2f}"
print(line)
for op in ("read-lat", "atomic-lat"):
    try:
        o = json.load(open(f"{sys.argv[1].rsplit('/', 1)[0]}/{op}.json"))["results"][0]
    except (OSError, ValueError, KeyError, IndexError):
        continue
    m = lambda k: o[k]["median"] if k in o else None
    line = f"round {sys.argv[3]}: {op} busy {m('lat_poll'):.2f} us per operation, TCP busy round trip {m('tcp_lat_poll'):.2f} us, ratio {o['ratio']:.2f}"
    if m("lat_wait") is not None and m("tcp_lat") is not None:
        line += f"; blocking {m('lat_wait'):.2f} us, TCP {m('tcp_lat'):.2f} us, ratio {o['ratio_wait']:.2f}"
    print(line)
PY
done
rm -rf "$out"
