#!/usr/bin/env bash
# Short, bounded fuzz run for CI: builds every cargo-fuzz target (address sanitizer, debug
# assertions on) and runs each from the committed seed corpus plus the committed regression
# inputs: session_rx for 2 x FUZZ_SECONDS, fs_handle for FUZZ_SECONDS, the decoders (which saturate in seconds) for
# FUZZ_SECONDS / 2 each; FUZZ_SECONDS defaults to 20, so about 90 s of fuzzing in all. Fails on any crash, panic, sanitizer report, leak or
# timeout. Works on the stable toolchain through RUSTC_BOOTSTRAP=1 (see fuzz/README.md).
set -euo pipefail
cd "$(dirname "$0")"
secs=${FUZZ_SECONDS:-20}
start=$(date +%s)
# cargo-fuzz and `-Zsanitizer=address` need nightly features; the stable compiler has them
# behind this switch. Only this script's cargo invocations see it.
export RUSTC_BOOTSTRAP=1
CARGO_FUZZ_VERSION=0.13.2

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz $CARGO_FUZZ_VERSION"
    timeout 600 cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION" --quiet
fi

# One build for all targets (the runs below then reuse it).
timeout 900 cargo fuzz build
echo "fuzz: built in $(( $(date +%s) - start )) s"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=()
for t in $(cargo fuzz list); do
    case $t in
        session_rx) max_len=4096 t_secs=$((secs * 2)) ;;
        fs_handle) max_len=4096 t_secs=$secs ;;
        *) max_len=256 t_secs=$(((secs + 1) / 2)) ;;
    esac
    # Newly found inputs go to a scratch corpus (the first directory); the committed seeds and
    # regression inputs are only read.
    mkdir -p "$work/$t"
    dirs=("$work/$t" "corpus/$t")
    [ -d "regressions/$t" ] && dirs+=("regressions/$t")
    echo "fuzz: $t for ${t_secs}s"
    touch "$work/$t.start"
    if ! timeout $((t_secs + 120)) cargo fuzz run "$t" "${dirs[@]}" -- \
        -max_total_time="$t_secs" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 2>"$work/$t.log"; then
        failed+=("$t")
        tail -n 40 "$work/$t.log" >&2
        echo "fuzz: $t failed:" >&2
        grep -E -A3 "panicked at|ERROR: [A-Za-z]*Sanitizer|ERROR: libFuzzer|^SUMMARY" "$work/$t.log" |
            head -n 30 >&2 || true
        for a in $(find artifacts/"$t" -type f -newer "$work/$t.start" 2>/dev/null); do
            echo "fuzz: $t crash input $a (hex):" >&2
            od -An -tx1 -v "$a" | tr -d ' \n' | fold -w 128 >&2
            echo >&2
        done
    else
        grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$work/$t.log" |
            sed "s/^/fuzz: $t /"
    fi
done

echo "fuzz: finished in $(( $(date +%s) - start )) s"
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
    exit 1
fi
