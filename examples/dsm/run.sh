#!/bin/sh
# CI check of the DSM applications (examples/dsm/README.md): builds them, runs each
# sequential program and the DSM program as 2 ranks on loopback (`braid run`) at small
# sizes, and fails unless every DSM result is bit-exact with the sequential one (checked
# twice: against the sequential program's hash, and by rank 0 re-computing it). Also
# checks that a wrong expected hash is reported as a failure. A few seconds; skips
# (exit 0) where userfaultfd is not permitted. Full-size measurements: measure.py.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
sh examples/dsm/build.sh
B=target/dsm-apps
BRAID=target/release/braid
LOG=$(mktemp /tmp/dsm-apps.XXXXXX)
trap 'rm -f "$LOG"' EXIT INT TERM

hash_of() { sed -n 's/.*"hash":"\(0x[0-9a-f]*\)".*/\1/p'; }

# dsm_run NAME ARGS...: 2 ranks on loopback; fails with the ranks' output on error.
dsm_run() {
    name=$1; shift
    if ! "$BRAID" run -n 2 --timeout 60 -- "$B/$name" "$@" > "$LOG" 2>&1; then
        if grep -q "vm.unprivileged_userfaultfd" "$LOG"; then
            echo "dsm apps: skipped: userfaultfd not permitted"; exit 0
        fi
        cat "$LOG" >&2
        echo "dsm apps: $name $* failed" >&2
        exit 1
    fi
    grep '"rank":0' "$LOG" | sed 's/"stats":.*/.../'
}

check_app() {
    app=$1; shift
    h=$("$B/${app}_seq" "$@" | hash_of)
    [ -n "$h" ] || { echo "dsm apps: ${app}_seq printed no hash" >&2; exit 1; }
    dsm_run "${app}_dsm" "$@"                 # rank 0 re-computes and compares
    dsm_run "${app}_dsm" "$@" --expect "$h"   # the sequential program's hash
}

check_app sor --n 300 --iters 20
check_app sor --n 98 --iters 7
check_app matmul --n 200
check_app mandel --w 300 --h 200 --rows 3 --iters 300

# A mismatch must fail (exit 2 from rank 0, so braid run fails).
if "$BRAID" run -n 2 --timeout 60 -- "$B/matmul_dsm" --n 64 --expect 0x1 > "$LOG" 2>&1; then
    cat "$LOG" >&2
    echo "dsm apps: a wrong --expect was not reported" >&2
    exit 1
fi
grep -q "MISMATCH" "$LOG" || { cat "$LOG" >&2; echo "dsm apps: no MISMATCH message" >&2; exit 1; }
echo "dsm apps: sor, matmul, mandel bit-exact on 2 ranks; mismatch detected"
