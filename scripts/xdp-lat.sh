#!/bin/bash
# The floor of a raw-Ethernet rail (issue 17): a busy-polling ping-pong of 60-byte frames
# between two AF_XDP ports (crates/braid-xdp/examples/xdp_pingpong.rs) on one unshaped
# testbed rail, in alternation with braid's 8 B write_with_imm ping-pong over TCP and the
# busy-polling TCP ping-pong (`braid bench write-lat --baseline --poll-only`) on the same
# rail. Prints one-way medians and the ratios to the TCP ping-pong. Needs root. Makes the
# testbed `xlat` and removes it at the end.
# usage: scripts/xdp-lat.sh [BRAID] [ROUNDS] [XDP_PINGPONG]
#   (build: cargo build --release -p braid-cli -p braid-xdp --examples)
set -euo pipefail
# The testbed's hosts talk over non-loopback addresses, which braid authenticates: one
# cluster secret for this run (or the caller's), read by both ends from the environment.
export BRAID_SECRET=${BRAID_SECRET:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}
BRAID=${1:-target/release/braid}
ROUNDS=${2:-3}
XPP=${3:-target/release/examples/xdp_pingpong}
[ -x "$XPP" ] || { echo "$XPP missing (cargo build --release -p braid-xdp --examples)" >&2; exit 1; }
"$BRAID" testbed up --name xlat --hosts 2 --rail-count 1 --rate none >/dev/null
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    "$BRAID" testbed down --name xlat >/dev/null 2>&1 || true
}
trap cleanup EXIT
H0="ip netns exec xlat-h0"; H1="ip netns exec xlat-h1"
A=198.18.0.1; B=198.18.0.2
out=$(mktemp -d)
for r in $(seq 1 "$ROUNDS"); do
    $H1 timeout 60 "$XPP" server p0r0 100000 >/dev/null &
    sp=$!; pids+=($sp)
    sleep 0.5
    x=$($H0 timeout 60 "$XPP" client p1r0 100000 | sed -n 's/.*one-way median \([0-9.]*\) us.*/\1/p')
    wait $sp || true
    $H1 "$BRAID" bench server --listen $B:19610 >/dev/null 2>&1 &
    sp=$!; pids+=($sp)
    sleep 0.4
    $H0 "$BRAID" bench write-lat --rails $A=$B:19610 -s 8 --iters 100000 --baseline --poll-only \
        --json "$out/b.json" >/dev/null 2>&1 || echo "round $r: braid run failed" >&2
    wait $sp || true
    python3 - "$out/b.json" "$r" "$x" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))["results"][0]
braid, tcp, xdp = b["lat_poll"]["median"], b["tcp_lat_poll"]["median"], float(sys.argv[3])
print(f"round {sys.argv[2]}: AF_XDP frames {xdp:.2f} us, TCP busy {tcp:.2f} us, braid over TCP {braid:.2f} us; "
      f"AF_XDP/TCP {xdp / tcp:.2f}, braid/TCP {braid / tcp:.2f}")
PY
done
rm -rf "$out"
