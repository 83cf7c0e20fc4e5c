#!/bin/sh
# Builds libbraid_dsm, `braid` (the launcher) and the example applications of
# examples/dsm: for each app a plain sequential program (APP_seq) and the DSM program
# (APP_dsm, linked against target/release/libbraid_dsm.so with an rpath, so no
# LD_LIBRARY_PATH is needed under braid run or mpirun). Output: $OUT (default
# target/dsm-apps). Same compiler flags for both kinds, so the arithmetic is the same.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/target/dsm-apps}
CFLAGS=${CFLAGS:--O2 -std=gnu11 -Wall -Wextra -Werror}
cd "$ROOT"
# The same build as `cargo test --workspace --release` (one feature set, so nothing is
# rebuilt after the tests in CI; building one package alone would compile the chain again).
cargo build --release -q --workspace --all-targets
mkdir -p "$OUT"
for app in sor matmul mandel; do
    cc $CFLAGS examples/dsm/${app}_seq.c -o "$OUT/${app}_seq"
    cc $CFLAGS -I include examples/dsm/${app}_dsm.c -o "$OUT/${app}_dsm" \
        -L target/release -Wl,-rpath,"$ROOT/target/release" -lbraid_dsm -lpthread
done
