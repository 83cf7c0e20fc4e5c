#!/usr/bin/env bash
# Runs the README's runnable code blocks in order, and checks that the code it quotes from
# the repository's files is still there. Fails on the first block that fails.
#
#   scripts/readme-check.sh [README]        (default: README.md at the repository's root)
#
# What the info string of a fenced block means here:
#   ```sh run          run it: bash -eu -o pipefail, from the repository's root, with
#                      target/release on PATH, in a process group of its own that is ended
#                      when the block ends (background servers included), at most
#                      README_CHECK_TIMEOUT seconds (default 300)
#   ```sh run-root     the same, but only as root with iproute2 present (the emulated
#                      testbed); elsewhere it is reported as skipped. If it fails, its
#                      `braid testbed down ...` lines are run to clean up
#   ```LANG file=PATH  a quote of PATH: every non-blank line of the block, trimmed, must
#                      occur in PATH in the same order (a line `// ...` or `/* ... */`
#                      stands for lines left out)
# Any other block is documentation only.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
README=${1:-$ROOT/README.md}
LIMIT=${README_CHECK_TIMEOUT:-300}
cd "$ROOT"
export PATH="$ROOT/target/release:$PATH"

work=$(mktemp -d /tmp/readme-check.XXXXXX)
trap 'rm -rf "$work"' EXIT

# Split the README into one file per fenced block: NNN.body, with NNN.info holding the
# info string and NNN.line the line the block starts on.
awk -v dir="$work" '
    /^```/ {
        if (!inside) {
            inside = 1; n++; f = sprintf("%s/%03d", dir, n)
            info = substr($0, 4); sub(/[ \t]+$/, "", info)
            print info > (f ".info"); close(f ".info")
            print NR > (f ".line"); close(f ".line")
            printf "" > (f ".body")
        } else { inside = 0; close(f ".body") }
        next
    }
    inside { print >> (f ".body") }
    END { if (inside) { print "readme-check: unterminated code block" > "/dev/stderr"; exit 1 } }
' "$README"

# Is every non-blank line of $1 (trimmed) in file $2, in order?
quoted_in() {
    awk '
        function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
        FNR == NR { src[++n] = trim($0); next }
        {
            want = trim($0)
            if (want == "" || want == "// ..." || want == "/* ... */") next
            while (i < n && src[++i] != want) {}
            if (src[i] != want) { print "not found (or out of order): " want; bad = 1; exit }
        }
        END { exit bad }
    ' "$2" "$1"
}

ran=0 skipped=0 quoted=0
for info_file in "$work"/*.info; do
    [ -e "$info_file" ] || continue
    b=${info_file%.info}
    info=$(cat "$info_file")
    line=$(cat "$b.line")
    case "$info" in
        *" file="*)
            path=${info##* file=}
            if [ ! -f "$path" ]; then
                echo "readme-check: block at line $line quotes $path, which does not exist" >&2
                exit 1
            fi
            if ! msg=$(quoted_in "$b.body" "$path"); then
                echo "readme-check: block at line $line is not a quote of $path: $msg" >&2
                exit 1
            fi
            echo "readme-check: line $line: quote of $path ok"
            quoted=$((quoted + 1))
            ;;
        "sh run" | "sh run-root")
            if [ "$info" = "sh run-root" ] && { [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; }; then
                echo "readme-check: line $line: SKIPPED (needs root and iproute2)"
                skipped=$((skipped + 1))
                continue
            fi
            echo "readme-check: line $line: running"
            sed 's/^/    | /' "$b.body"
            start=$(date +%s)
            # setsid: the block leads a process group of its own, ended below whatever it
            # left running (a server it put in the background).
            set +e
            setsid -w timeout --kill-after=10 "$LIMIT" bash -euo pipefail "$b.body" > "$b.out" 2>&1 &
            pid=$!
            wait "$pid"
            rc=$?
            set -e
            kill -TERM -- "-$pid" 2>/dev/null || true
            sed 's/^/    > /' "$b.out"
            if [ "$rc" != 0 ]; then
                echo "readme-check: block at line $line FAILED (exit $rc after $(( $(date +%s) - start )) s)" >&2
                if [ "$info" = "sh run-root" ]; then
                    grep -E '(^|[ /])braid testbed down ' "$b.body" | while read -r cmd; do
                        bash -c "$cmd" || true
                    done
                fi
                exit 1
            fi
            echo "readme-check: line $line: ok ($(( $(date +%s) - start )) s)"
            ran=$((ran + 1))
            ;;
    esac
done
echo "readme-check: $ran block(s) ran, $skipped skipped, $quoted quote(s) checked: all ok"
