#!/usr/bin/env bash
# Same-host peers (issue 14): two processes on one host, braid over its shared-memory rail
# beside UCX's shared-memory transports and beside braid over TCP loopback, in alternation.
#
#   scripts/same-host.sh BRAID [ROUNDS]
#
# Per round: 8 B write_with_imm ping-pong (busy polling) against `ucx_perftest -t tag_lat`
# (UCX_TLS=shm,self); 4 MiB and 16 MiB RMA writes at depth 1 (one buffer each side, as
# ucx_perftest's put_bw) and at braid bench's default depth (16 MiB in flight) against
# `ucx_perftest -t ucp_put_bw` and against braid over TCP loopback. ucx_perftest busy-polls,
# so braid's runs do too (`--poll-spin-us 1000000`: both sides spin in their completion waits).
# The write rows measure single copy (BRAID_PAGE_EXCHANGE=0). Then page exchange: 16 MiB
# sends at depth 1, single copy against page exchange, with the sender's buffer untouched
# between sends or rewritten before each (--rewrite), and the receiver touching every page
# it receives (--touch) or not.
# Every process it starts ends with the round (bench servers serve one client;
# ucx_perftest servers one test).
# SAME_HOST_PIN=1 runs the latency rows (braid and UCX alike) with the server on CPU 0 and
# the client on CPU 1 (taskset): on a 2-core VM an unpinned ping-pong falls now and then
# into a mode where both processes share a core.
set -euo pipefail
B=${1:?usage: same-host.sh BRAID [ROUNDS]}
ROUNDS=${2:-3}
PORT=${SAME_HOST_PORT:-18950}
command -v ucx_perftest >/dev/null || { echo "same-host: ucx_perftest missing (apt install ucx-utils)" >&2; exit 1; }

pids=()
# Set around the latency rows when pinning: prefixes for the server and the client.
ps=(); pc=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# braid TRANSPORT ARGS...: one bench client against a fresh server; prints the result row.
# EX=1 turns page exchange on (both sides).
braid_run() {
    local t=$1; shift
    BRAID_PAGE_EXCHANGE=${EX:-0} BRAID_TRANSPORT=$t "${ps[@]}" "$B" bench server --listen 127.0.0.1:$PORT >/dev/null 2>&1 &
    pids+=($!)
    local srv=$!
    BRAID_PAGE_EXCHANGE=${EX:-0} BRAID_TRANSPORT=$t "${pc[@]}" "$B" bench "$@" --rails 127.0.0.1=127.0.0.1:$PORT 2>&1 | grep -E '^ +[0-9]' | tail -1
    wait "$srv" 2>/dev/null || true
}

# ucx TEST SIZE ITERS: one ucx_perftest pair; prints the "Final" line.
ucx_run() {
    UCX_TLS=shm,self "${ps[@]}" ucx_perftest -p $((PORT + 1)) >/dev/null 2>&1 &
    pids+=($!)
    local srv=$!
    local out=""
    for _ in $(seq 50); do
        out=$(UCX_TLS=shm,self timeout 60 "${pc[@]}" ucx_perftest 127.0.0.1 -p $((PORT + 1)) -t "$1" -s "$2" -n "$3" 2>&1 | grep Final || true)
        [ -n "$out" ] && break
        sleep 0.1
    done
    wait "$srv" 2>/dev/null || true
    echo "$out"
}

for r in $(seq "$ROUNDS"); do
    echo "== round $r"
    # Latency: typical one-way (braid t_typical, UCX typical latency), microseconds.
    if [ "${SAME_HOST_PIN:-0}" = 1 ]; then ps=(taskset -c 0); pc=(taskset -c 1); fi
    l=$(braid_run auto write-lat -s 8 --iters 100000 --poll-only)
    echo "lat braid-shm 8B typical_us $(echo "$l" | awk '{print $6}')"
    u=$(ucx_run tag_lat 8 100000)
    echo "lat ucx-shm   8B typical_us $(echo "$u" | awk '{print $3}')"
    l=$(braid_run tcp write-lat -s 8 --iters 100000 --poll-only)
    echo "lat braid-tcp 8B typical_us $(echo "$l" | awk '{print $6}')"
    ps=(); pc=()
    # Bandwidth, MB/s (10^6): braid's BW column, UCX's average bandwidth (UCX prints MiB/s).
    for s in 4M 16M; do
        bytes=$((${s%M} << 20))
        u=$(ucx_run ucp_put_bw "$bytes" $((4096 / ${s%M})))
        echo "bw ucx-shm   $s put          MB/s $(echo "$u" | awk '{printf "%.1f", $6 * 1.048576}')"
        for q in 1 default; do
            depth=(); [ "$q" = 1 ] && depth=(-q 1)
            for t in auto tcp; do
                row=$(braid_run $t write -s "$s" "${depth[@]}" -D 3 --poll-spin-us 1000000)
                name=braid-shm; [ "$t" = tcp ] && name=braid-tcp
                echo "bw $name $s depth-$q MB/s $(echo "$row" | awk '{print $3}') client_cpu_s/GB $(echo "$row" | awk '{print $5}') server_cpu_s/GB $(echo "$row" | awk '{print $6}')"
            done
        done
    done
    # Page exchange against single copy, MB/s and the client's (sender's) CPU per GB.
    for v in untouched touch rewrite rewrite-touch; do
        flags=()
        case $v in
        touch) flags=(--touch) ;;
        rewrite) flags=(--rewrite) ;;
        rewrite-touch) flags=(--rewrite --touch) ;;
        esac
        for ex in 0 1; do
            row=$(EX=$ex braid_run auto send -s 16M -q 1 -D 3 --poll-spin-us 1000000 "${flags[@]}")
            name=copy; [ "$ex" = 1 ] && name=exchange
            echo "px send 16M $v $name MB/s $(echo "$row" | awk '{print $3}') client_cpu_s/GB $(echo "$row" | awk '{print $5}') $(echo "$row" | grep -o 'rewrite [0-9]*% of the time' || true)"
        done
    done
done
