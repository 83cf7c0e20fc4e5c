/*
 * DSM-side helpers of the example applications: start-up that fails clearly, a barrier
 * that accounts its waiting time, and the rank's JSON line (with braid_dsm_stats_json).
 */
#ifndef DSM_APPS_DSM_UTIL_H
#define DSM_APPS_DSM_UTIL_H

#include <braid/dsm.h>

#include "common.h"

static double dsm_wait_s;    /* seconds spent in barriers and locks */
static long dsm_barriers;    /* barriers passed */

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

/* Prints this rank's result line: {"app":..., <fields>, "wait_s":..., "barriers":...,
 * "stats":{braid_dsm_stats_json}}. `fields` is the app's part, without braces. */
static inline void dsm_report(const char *app, const char *fields) {
    char stats[2048];
    int n = braid_dsm_stats_json(stats, sizeof stats);
    if (n < 0 || (size_t)n >= sizeof stats) snprintf(stats, sizeof stats, "null");
    printf("{\"app\":\"%s\",\"mode\":\"dsm\",\"rank\":%d,\"ranks\":%d,%s,\"wait_s\":%.4f,"
           "\"barriers\":%ld,\"stats\":%s}\n",
           app, braid_dsm_rank(), braid_dsm_size(), fields, dsm_wait_s, dsm_barriers, stats);
    fflush(stdout);
}

static inline void dsm_end(void) {
    if (braid_dsm_finalize() != 0) dsm_die("braid_dsm_finalize");
}

#endif
