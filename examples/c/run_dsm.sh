#!/bin/sh
# Build libbraid_dsm, install it into a temporary prefix (scripts/install.sh), build the C
# example against it with pkg-config (shared and static), then run it as N ranks on loopback, setting the
# launcher environment by hand (what `braid run -n N` or mpirun would do): BRAID_RANK,
# BRAID_SIZE, BRAID_ROOT, BRAID_JOB. Bounded by `timeout`; fails if any rank fails.
# Skips (exit 0) where userfaultfd is not permitted.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
N=${N:-3}
OUT=$(mktemp -d /tmp/dsm-c.XXXXXX)
trap 'rm -rf "$OUT"' EXIT INT TERM

# The same build as `cargo test --workspace --release` (one feature set, so nothing is
# rebuilt after the tests; building one package alone would compile the chain again).
cargo build --release -q --workspace --all-targets
# Built against an installed temporary prefix, as a user would (examples/c/prefix.sh).
. examples/c/prefix.sh
install_prefix "$OUT/prefix"
# shellcheck disable=SC2046 # pkg-config's words
cc -O2 -Wall -Wextra examples/c/dsm_hello.c -o "$OUT/dsm_hello" \
    $(pkg-config --cflags --libs braid-dsm) -Wl,-rpath,"$LIBDIR"
needs_soname "$OUT/dsm_hello" libbraid_dsm
# The static library links too, with what pkg-config --static adds (Libs.private).
# shellcheck disable=SC2046
cc -O2 -Wall -Wextra examples/c/dsm_hello.c -o "$OUT/dsm_hello_static" $(pkg-config --cflags braid-dsm) \
    $(pkg-config --static --libs braid-dsm | sed 's/-lbraid_dsm/-l:libbraid_dsm.a/')
if readelf -d "$OUT/dsm_hello_static" | grep -q 'NEEDED.*libbraid_dsm'; then
    echo "run_dsm: the static build loads libbraid_dsm.so" >&2; exit 1
fi

for prog in dsm_hello dsm_hello_static; do
    # A free port below the ephemeral range: one of that range could be taken by a rank's
    # own sockets before rank 0 listens (braid_boot::rendezvous_port does the same).
    PORT=$(python3 -c '
import random, socket
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for p in random.sample(range(lo // 2, lo), lo - lo // 2):
    try:
        socket.create_server(("127.0.0.1", p)).close()
        print(p)
        break
    except OSError:
        pass
')
    pids=""
    r=0
    while [ "$r" -lt "$N" ]; do
        BRAID_RANK=$r BRAID_SIZE=$N BRAID_ROOT=127.0.0.1:$PORT BRAID_JOB="dsm-c-$$-$prog" \
            timeout 60 "$OUT/$prog" > "$OUT/$prog.$r.log" 2>&1 &
        pids="$pids $!"
        r=$((r + 1))
    done
    fail=0
    for p in $pids; do wait "$p" || fail=1; done
    if [ "$fail" != 0 ]; then
        if grep -q "vm.unprivileged_userfaultfd" "$OUT/$prog.0.log"; then
            echo "run_dsm: skipped: userfaultfd not permitted"; exit 0
        fi
        cat "$OUT"/$prog.*.log >&2
        echo "run_dsm: $prog failed" >&2
        exit 1
    fi
    cat "$OUT"/$prog.*.log
done
