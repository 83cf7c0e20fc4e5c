#!/bin/bash
# How long one cache line takes to cross between CPU 0 and CPU 1, one way: two threads
# pinned to those CPUs bounce a counter on one line 2,000,000 times. On the 2-core VMs of
# docs/RESULTS.md it tells the VM's mode (55-60 ns fast, about 280 ns slow), which moves every
# same-host latency figure (braid's and UCX's alike). Needs a C compiler.
#   scripts/line-probe.sh
set -euo pipefail
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/probe.c" <<'C'
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#define N 2000000L
static _Alignas(64) _Atomic long ping;
static _Alignas(64) _Atomic long pong;
static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}
static void *echo(void *arg) {
    (void)arg;
    pin(0);
    for (long i = 1; i <= N; i++) {
        while (atomic_load_explicit(&ping, memory_order_acquire) != i) {}
        atomic_store_explicit(&pong, i, memory_order_release);
    }
    return 0;
}
int main(void) {
    pthread_t t;
    pthread_create(&t, 0, echo, 0);
    pin(1);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 1; i <= N; i++) {
        atomic_store_explicit(&ping, i, memory_order_release);
        while (atomic_load_explicit(&pong, memory_order_acquire) != i) {}
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_join(t, 0);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("cache line, CPU 1 <-> CPU 0: %.1f ns one way\n", ns / N / 2);
    return 0;
}
C
${CC:-cc} -O2 -pthread "$dir/probe.c" -o "$dir/probe"
"$dir/probe"
