/*
 * Shared helpers of the braid-dsm example applications (examples/dsm/README.md): timing,
 * a 64-bit hash of results, argument parsing, row blocks matching block homes, and the
 * JSON line every program prints. Header-only; included by the sequential and the DSM
 * programs alike, so both do exactly the same arithmetic.
 */
#ifndef DSM_APPS_COMMON_H
#define DSM_APPS_COMMON_H

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Seconds on the monotonic clock. */
static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU seconds of the calling thread (what it computed, without the time it waited or
 * was preempted: the difference to wall time shows contention for the cores). */
static inline double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A 64-bit hash of `bytes` bytes: equal results give equal hashes, and any changed bit
 * changes it with overwhelming probability. Used to compare a DSM run with the
 * sequential program bit for bit without keeping both results. */
static inline uint64_t hash_words(const void *p, size_t bytes) {
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < bytes; i += 8) {
        uint64_t x = 0;
        memcpy(&x, b + i, bytes - i < 8 ? bytes - i : 8);
        h ^= x;
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    return h;
}

/* The hash of a whole result from its rows' hashes (what every program prints). */
static inline uint64_t hash_rows(const uint64_t *row_hash, long n) {
    uint64_t h = 0;
    for (long i = 0; i < n; i++) h = h * 31 + row_hash[i];
    return h;
}

/* Rows a rank owns when an allocation of `n` equally sized, page-aligned rows is homed in
 * blocks (BRAID_DSM_HOME_BLOCK homes page i of P at rank floor(i * size / P), so row i at
 * rank floor(i * size / n)): rows [*lo, *hi). */
static inline void row_block(long n, int rank, int size, long *lo, long *hi) {
    *lo = ((long)rank * n + size - 1) / size;
    *hi = ((long)(rank + 1) * n + size - 1) / size;
}

/* Row length in elements of `elem` bytes rounded up to whole 4 KiB pages, so every row
 * starts a page and rows of different ranks never share one. */
static inline long page_stride(long n, size_t elem) {
    long per = 4096 / (long)elem;
    return (n + per - 1) / per * per;
}

/* Parses "--name value" options: returns the value of `name` or `def`; exits with a
 * clear message on a malformed number. */
static inline long opt_long(int argc, char **argv, const char *name, long def) {
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], name) == 0) {
            char *end;
            errno = 0;
            long v = strtol(argv[i + 1], &end, 0);
            if (errno || *end || end == argv[i + 1] || v < 0) {
                fprintf(stderr, "%s: bad value for %s: %s\n", argv[0], name, argv[i + 1]);
                exit(64);
            }
            return v;
        }
    }
    return def;
}

/* The value of option `name` as a string, or NULL. */
static inline const char *opt_str(int argc, char **argv, const char *name) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return argv[i + 1];
    return NULL;
}

/* Rejects options other than the `known` ones (NULL-terminated list of names that take a
 * value), so a typo is an error rather than a silent default. */
static inline void opt_check(int argc, char **argv, const char *const *known) {
    for (int i = 1; i < argc; i += 2) {
        int ok = 0;
        for (const char *const *k = known; *k; k++)
            if (strcmp(argv[i], *k) == 0) ok = 1;
        if (!ok || i + 1 >= argc) {
            fprintf(stderr, "%s: unknown option or missing value: %s\nknown:", argv[0], argv[i]);
            for (const char *const *k = known; *k; k++) fprintf(stderr, " %s N", *k);
            fprintf(stderr, "\n");
            exit(64);
        }
    }
}

/* --expect HASH (the sequential program's "hash"): 1 and the value if given. */
static inline int opt_expect(int argc, char **argv, uint64_t *want) {
    const char *s = opt_str(argc, argv, "--expect");
    if (!s) return 0;
    char *end;
    errno = 0;
    *want = strtoull(s, &end, 0);
    if (errno || *end || end == s) {
        fprintf(stderr, "%s: bad --expect %s (want the hash the sequential program printed)\n",
                argv[0], s);
        exit(64);
    }
    return 1;
}

#endif
