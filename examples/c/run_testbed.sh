#!/bin/sh
# braid mode across the emulated cluster: two network namespaces joined by 4 rails of
# 1 Gbit/s (veth + tbf, addresses in 198.18.0.0/15), made with `braid testbed up` under a
# name unique to this run and removed on every exit path. Runs, in order:
#   (1) one plain TCP stream on rail 0 (`braid baseline tcp`): the single-rail ceiling;
#   (2) examples/c/exs_braid.c in braid mode over 1 rail (no rail list);
#   (3) the same over the 4 rails (EXS_BRAID_LISTEN / EXS_BRAID_RAILS),
# each checking byte count and checksum, then
#   (4) a throughput run over the 4 rails without the checksum (EXS_BRAID_NOVERIFY=1, which
#       on a 2-core machine would otherwise be the bottleneck); compare its MB/s with (1). Skips (exit 0) when namespaces are unavailable.
# Only processes started here are killed.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! ip netns list >/dev/null 2>&1; then
    echo "SKIP: network namespaces unavailable (needs root and iproute2)"
    exit 0
fi
BYTES1=${BYTES1:-268435456}
BYTES4=${BYTES4:-536870912}
BYTESX=${BYTESX:-2147483648}
NAME=exsb$$
OUT=$(mktemp -d /tmp/exs-tb.XXXXXX)
B="$ROOT/target/release/braid"
RPID=
UP=
cleanup() {
    if [ -n "$RPID" ]; then kill "$RPID" 2>/dev/null || true; fi
    if [ -n "$UP" ]; then "$B" testbed down --name "$NAME" >/dev/null 2>&1 || true; fi
    rm -rf "$OUT"
}
trap cleanup EXIT INT TERM

# The same build as `cargo test --workspace --release` (one feature set, so nothing is
# rebuilt after the tests; building one package alone would compile the chain again).
cargo build --release -q --workspace --all-targets
# Built against an installed temporary prefix, as a user would (examples/c/prefix.sh).
. examples/c/prefix.sh
install_prefix "$OUT/prefix"
# shellcheck disable=SC2046 # pkg-config's words
cc -O2 -Wall -Wextra examples/c/exs_braid.c -o "$OUT/exs_braid" $(pkg-config --cflags --libs exs) \
    -Wl,-rpath,"$LIBDIR"

if ! "$B" testbed up --name "$NAME" --rail-count 4; then
    echo "SKIP: cannot create the testbed"
    exit 0
fi
UP=1
H0="$NAME-h0"
H1="$NAME-h1"
# The hosts talk over testbed (non-loopback) addresses: braid authenticates them with a
# cluster secret, one fresh for this run, which both ends read from the environment.
BRAID_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
export BRAID_SECRET

echo "== (1) plain TCP, one stream on rail 0"
ip netns exec "$H1" "$B" baseline tcp server --listen 198.18.0.2 &
RPID=$!
i=0
until ip netns exec "$H1" ss -ltn 2>/dev/null | grep -q "198.18.0.2:18515"; do
    i=$((i + 1))
    if [ $i -gt 100 ]; then echo "baseline server did not start" >&2; exit 1; fi
    sleep 0.1
done
timeout 60 ip netns exec "$H0" "$B" baseline tcp client --rails 198.18.0.1=198.18.0.2 -s 4M -D 3
wait "$RPID" || true
RPID=

run_braid() { # label bytes listen-rails connect-rails
    rm -f "$OUT/port"
    EXS_BRAID_LISTEN="$3" timeout 90 ip netns exec "$H1" "$OUT/exs_braid" recv "$OUT/port" "$2" 198.18.0.2 &
    RPID=$!
    i=0
    while [ ! -s "$OUT/port" ]; do
        i=$((i + 1))
        if [ $i -gt 100 ]; then echo "receiver did not start" >&2; exit 1; fi
        sleep 0.1
    done
    echo "== $1"
    SRC=0
    EXS_BRAID_RAILS="$4" timeout 90 ip netns exec "$H0" "$OUT/exs_braid" send 198.18.0.2 "$(cat "$OUT/port")" "$2" || SRC=$?
    RRC=0
    wait "$RPID" || RRC=$?
    RPID=
    if [ "$SRC" -ne 0 ] || [ "$RRC" -ne 0 ]; then
        echo "FAIL: $1 (sender $SRC, receiver $RRC)" >&2
        exit 1
    fi
}

run_braid "(2) exs braid mode, 1 rail" "$BYTES1" "" ""
run_braid "(3) exs braid mode, 4 rails" "$BYTES4" \
    198.18.0.2,198.18.1.2,198.18.2.2,198.18.3.2 198.18.0.1,198.18.1.1,198.18.2.1,198.18.3.1
EXS_BRAID_NOVERIFY=1 run_braid "(4) exs braid mode, 4 rails, throughput only" "$BYTESX" \
    198.18.0.2,198.18.1.2,198.18.2.2,198.18.3.2 198.18.0.1,198.18.1.1,198.18.2.1,198.18.3.1
echo "testbed runs passed"
