#!/bin/sh
# Builds libbraid_dsm, `braid` (the launcher) and the example applications of
# examples/dsm: for each app a plain sequential program (APP_seq) and the DSM program
# (APP_dsm, linked with pkg-config against libbraid_dsm installed into $OUT/prefix by
# scripts/install.sh, with an rpath to it, so no LD_LIBRARY_PATH is needed under braid run
# or mpirun). Output: $OUT (default target/dsm-apps). Same compiler flags for both kinds, so
# the arithmetic is the same.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/target/dsm-apps}
CFLAGS=${CFLAGS:--O2 -std=gnu11 -Wall -Wextra -Werror}
cd "$ROOT"
# The same build as `cargo test --workspace --release` (one feature set, so nothing is
# rebuilt after the tests in CI; building one package alone would compile the chain again).
cargo build --release -q --workspace --all-targets
mkdir -p "$OUT"
sh scripts/install.sh --no-build "$OUT/prefix" >/dev/null
PC="pkg-config --with-path=$OUT/prefix/lib/pkgconfig"
for app in sor matmul mandel; do
    cc $CFLAGS examples/dsm/${app}_seq.c -o "$OUT/${app}_seq"
    # shellcheck disable=SC2046 # pkg-config's words
    cc $CFLAGS examples/dsm/${app}_dsm.c -o "$OUT/${app}_dsm" $($PC --cflags --libs braid-dsm) \
        -Wl,-rpath,"$($PC --variable=libdir braid-dsm)" -lpthread
done
