#!/bin/bash
# braid's own instructions per small message, counted (not timed): runs
# `examples/msg_cost` (one thread plays both ends of an 8 B write_with_imm ping-pong over an
# in-process pair) under callgrind and prints the inclusive instructions per call of the
# functions on a message's path, and their sum per message: posting the write, reposting
# the receive, and the receive loop that reads and executes the frames. Per-call counts
# do not depend on timing (how often the example polls an empty queue does), so two
# builds compare exactly. Needs valgrind.
# usage: scripts/msg-cost.sh [MSG_COST_BINARY] [tcp]
#   (build it: cargo build --release -p braid --example msg_cost)
set -euo pipefail
BIN=${1:-target/release/examples/msg_cost}
MODE=${2:-}
N=${N:-10000}
command -v valgrind >/dev/null || { echo "valgrind missing (apt-get install valgrind)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
valgrind --tool=callgrind --separate-threads=yes --fair-sched=yes \
    --callgrind-out-file="$out/cg" "$BIN" "$N" $MODE >/dev/null 2>&1
# Thread 1 is the example's own thread (the engine threads barely run). Every function is
# listed (--threshold=100): the example's empty polls can outweigh a message's path.
callgrind_annotate --inclusive=yes --tree=caller --threshold=100 "$out/cg-01" 2>/dev/null | python3 -c '
import re, sys
paths = {
    "Endpoint::write_with_imm": "post (write_with_imm)",
    "Endpoint::post_recv": "post_recv",
    "RxRail::run": "receive loop",
    "EndpointShared>::flush_rail": "  of posting: flush_rail",
    "Session>::poll_transmit": "  poll_transmit",
    "Session>::on_frame": "  of receiving: on_frame",
    "EndpointShared>::post_express": "  of posting: post_express",
    "Session>::on_express": "  of receiving: on_express",
}
calls, seen = 0, {}
for line in sys.stdin:
    if not line.strip():
        calls = 0
        continue
    if re.match(r"\s*[\d,]+ \(.*\)\s+<", line):
        m = re.search(r"\(([\d,]+)x\)", line)
        calls += int(m.group(1).replace(",", "")) if m else 0
        continue
    m = re.match(r"\s*([\d,]+) \(.*\)\s+\*\s+[^:]+:(.*?)( \[.*)?$", line)
    if m and "rustc" not in line.split(":")[0]:
        for k, name in paths.items():
            if m.group(2).endswith(k) and name not in seen:
                seen[name] = (int(m.group(1).replace(",", "")), calls)
posts = seen.get("post (write_with_imm)", (0, 1))[1]
for name, (total, n) in seen.items():
    print(f"{name:28} {total // max(n, 1):6} instructions per call, {n / max(posts, 1):.2f} calls per message")
top = ("post (write_with_imm)", "post_recv", "receive loop")
# One message is one post, one post_recv and one pass of the receive loop that executes it
# (the engine thread takes some passes: count the loop per call).
per_call = lambda k: seen[k][0] // max(seen[k][1], 1) if k in seen else 0
print(f"per message (post + post_recv + one receive loop): {sum(per_call(k) for k in top)} instructions")
'
