/*
 * DSM-side helpers of the example applications: start-up that fails clearly, a barrier
 * that accounts its waiting time, and the rank's JSON line (with braid_dsm_stats_json).
 */
#ifndef DSM_APPS_DSM_UTIL_H
#define DSM_APPS_DSM_UTIL_H

#include <sys/resource.h>

#include <braid/dsm.h>

#include "common.h"

static double dsm_wait_s;    /* seconds spent in barriers and locks */
static long dsm_barriers;    /* barriers passed */
static double dsm_wait_timed; /* dsm_wait_s at the end of the timed part */
static long dsm_barriers_timed;
static char dsm_stats_timed[2048] = "null"; /* braid_dsm_stats_json then */
static double dsm_proc_cpu;  /* CPU seconds of the whole process (every thread: the
                                service thread, braid's engine, helpers) in the timed part */

static inline double proc_cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

/* Marks the start of the timed part. */
static inline void dsm_timed_start(void) { dsm_proc_cpu = proc_cpu_s(); }

static inline void dsm_die(const char *what) {
    fprintf(stderr, "rank %d: %s failed: %s (%s)\n", braid_dsm_rank(), what,
            braid_dsm_last_error(), strerror(errno));
    exit(1);
}

static inline void dsm_start(void) {
    if (braid_dsm_init() != 0) {
        fprintf(stderr, "braid_dsm_init failed: %s\n", braid_dsm_last_error());
        exit(1);
    }
}

static inline void *dsm_alloc_block(size_t bytes) {
    void *p = braid_dsm_alloc_policy(bytes, BRAID_DSM_HOME_BLOCK);
    if (!p) dsm_die("braid_dsm_alloc_policy");
    return p;
}

static inline void dsm_barrier(void) {
    double t = now_s();
    if (braid_dsm_barrier() != 0) dsm_die("braid_dsm_barrier");
    dsm_wait_s += now_s() - t;
    dsm_barriers++;
}

static inline void dsm_lock(unsigned id) {
    double t = now_s();
    if (braid_dsm_lock(id) != 0) dsm_die("braid_dsm_lock");
    dsm_wait_s += now_s() - t;
}

static inline void dsm_unlock(unsigned id) {
    if (braid_dsm_unlock(id) != 0) dsm_die("braid_dsm_unlock");
}

/* Marks the end of the timed part: the waits, barriers and DSM counters reported are
 * those up to here (the result check afterwards moves pages too). */
static inline void dsm_timed_end(void) {
    dsm_proc_cpu = proc_cpu_s() - dsm_proc_cpu;
    dsm_wait_timed = dsm_wait_s;
    dsm_barriers_timed = dsm_barriers;
    int n = braid_dsm_stats_json(dsm_stats_timed, sizeof dsm_stats_timed);
    if (n < 0 || (size_t)n >= sizeof dsm_stats_timed)
        snprintf(dsm_stats_timed, sizeof dsm_stats_timed, "null");
}

/* Prints this rank's result line: {"app":..., <fields>, "wait_s":..., "barriers":...,
 * "stats":{braid_dsm_stats_json}}, all as of dsm_timed_end(). `fields` is the app's
 * part, without braces. */
static inline void dsm_report(const char *app, const char *fields) {
    printf("{\"app\":\"%s\",\"mode\":\"dsm\",\"rank\":%d,\"ranks\":%d,%s,\"wait_s\":%.4f,"
           "\"barriers\":%ld,\"process_cpu_s\":%.4f,\"stats\":%s}\n",
           app, braid_dsm_rank(), braid_dsm_size(), fields, dsm_wait_timed, dsm_barriers_timed,
           dsm_proc_cpu, dsm_stats_timed);
    fflush(stdout);
}

/* Rows of n doubles with stride ld, for dsm_hash_rows. */
struct f64_rows { const double *p; long n, ld; };

static inline uint64_t f64_row_hash(long i, const void *ctx) {
    const struct f64_rows *r = ctx;
    return hash_words(r->p + i * r->ld, (size_t)r->n * 8);
}

/* The hash of rows [0, n) of a row-distributed result without moving the rows: every
 * rank hashes its rows [lo, hi) (row(i) gives row i's hash) into the shared array `rh`
 * (n words, allocated by the caller with block homes), and rank 0 combines them.
 * Collective; the value is meaningful on rank 0. */
static inline uint64_t dsm_hash_rows(uint64_t *rh, long n, long lo, long hi,
                                     uint64_t (*row)(long i, const void *ctx), const void *ctx) {
    for (long i = lo; i < hi; i++) rh[i] = row(i, ctx);
    dsm_barrier();
    return braid_dsm_rank() == 0 ? hash_rows(rh, n) : 0;
}

static inline void dsm_end(void) {
    if (braid_dsm_finalize() != 0) dsm_die("braid_dsm_finalize");
}

#endif
