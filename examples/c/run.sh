#!/bin/sh
# Build libexs (release), install it into a temporary prefix (scripts/install.sh), build the
# C examples against that prefix with pkg-config, then run them on loopback:
#   (a) exs_send sender  -> plain recv() receiver
#   (b) plain send() sender -> exs_recv receiver
#   (c) braid mode: exs_send sender -> exs_recv receiver over 4 loopback rails
#       (127.0.0.1..127.0.0.4), chosen with exs_braid_attach and EXS_BRAID_RAILS/LISTEN
# Every wait is bounded; only processes started here are killed.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BYTES=${BYTES:-67108864}
OUT=$(mktemp -d /tmp/exs-c.XXXXXX)
RPID=
cleanup() {
    if [ -n "$RPID" ]; then kill "$RPID" 2>/dev/null || true; fi
    rm -rf "$OUT"
}
trap cleanup EXIT INT TERM

# The same build as `cargo test --workspace --release` (one feature set, so nothing is
# rebuilt after the tests; building one package alone would compile the chain again).
cargo build --release -q --workspace --all-targets
. examples/c/prefix.sh
install_prefix "$OUT/prefix"
for ex in exs_stream exs_braid; do
    # shellcheck disable=SC2046 # pkg-config's words
    cc -O2 -Wall -Wextra examples/c/$ex.c -o "$OUT/$ex" $(pkg-config --cflags --libs exs) \
        -Wl,-rpath,"$LIBDIR"
    needs_soname "$OUT/$ex" libexs
done

run_pair() { # receiver-mode sender-mode
    rm -f "$OUT/port"
    timeout 60 "$OUT/exs_stream" "$1" "$OUT/port" "$BYTES" &
    RPID=$!
    i=0
    while [ ! -s "$OUT/port" ]; do
        i=$((i + 1))
        if [ $i -gt 100 ]; then echo "receiver did not start" >&2; exit 1; fi
        sleep 0.1
    done
    SRC=0
    timeout 60 "$OUT/exs_stream" "$2" "$(cat "$OUT/port")" "$BYTES" || SRC=$?
    RRC=0
    wait "$RPID" || RRC=$?
    RPID=
    if [ "$SRC" -ne 0 ] || [ "$RRC" -ne 0 ]; then
        echo "FAIL: $2 -> $1 (sender $SRC, receiver $RRC)" >&2
        exit 1
    fi
}

run_braid() { # rails
    rm -f "$OUT/port"
    EXS_BRAID_LISTEN="$1" timeout 60 "$OUT/exs_braid" recv "$OUT/port" "$BYTES" &
    RPID=$!
    i=0
    while [ ! -s "$OUT/port" ]; do
        i=$((i + 1))
        if [ $i -gt 100 ]; then echo "receiver did not start" >&2; exit 1; fi
        sleep 0.1
    done
    SRC=0
    EXS_BRAID_RAILS="$1" timeout 60 "$OUT/exs_braid" send 127.0.0.1 "$(cat "$OUT/port")" "$BYTES" || SRC=$?
    RRC=0
    wait "$RPID" || RRC=$?
    RPID=
    if [ "$SRC" -ne 0 ] || [ "$RRC" -ne 0 ]; then
        echo "FAIL: braid mode over $1 (sender $SRC, receiver $RRC)" >&2
        exit 1
    fi
}

run_pair recv-plain send-exs
run_pair recv-exs send-plain
run_braid 127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4
echo "all C examples passed"
