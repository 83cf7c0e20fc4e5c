/*
 * Dense matrix multiply on braid-dsm: A, B and C are shared allocations homed in blocks
 * of rows; rank r initialises its rows of A and B and computes its rows of C, so A and C
 * never move and each rank fetches the other ranks' rows of B once (read copies).
 *   braid run -n 2 -- matmul_dsm --n N [--prefetch T] [--expect HASH]
 * --prefetch T (default 4): T extra threads touch the other ranks' pages of B before the
 * multiply, so T page faults are in flight at a time instead of one (the fault latency,
 * not the rails, bounds a single thread's fetch rate). Checks C bit for bit against HASH
 * (matmul_seq's) or, without it, against a sequential run on rank 0 after the timed part.
 * Exit 2 on a mismatch.
 */
#include <pthread.h>

#include "common.h"
#include "dsm_util.h"
#include "matmul.h"

struct touch { const volatile char *p; size_t pages; long t, nt; };

static void *toucher(void *arg) {
    struct touch *w = arg;
    for (size_t i = (size_t)w->t; i < w->pages; i += (size_t)w->nt) (void)w->p[i * 4096];
    return NULL;
}

/* Reads one byte of every page in [p, p + bytes) with `nt` threads (read faults in flight
 * together); returns when all are in. */
static void prefetch(const void *p, size_t bytes, long nt) {
    if (nt <= 0 || bytes == 0) return;
    pthread_t th[64];
    struct touch w[64];
    if (nt > 64) nt = 64;
    for (long t = 0; t < nt; t++) {
        w[t] = (struct touch){(const volatile char *)p, (bytes + 4095) / 4096, t, nt};
        if (pthread_create(&th[t], NULL, toucher, &w[t]) != 0) { perror("pthread_create"); exit(1); }
    }
    for (long t = 0; t < nt; t++) pthread_join(th[t], NULL);
}

int main(int argc, char **argv) {
    static const char *const known[] = {"--n", "--prefetch", "--expect", NULL};
    opt_check(argc, argv, known);
    long n = opt_long(argc, argv, "--n", 512), nt = opt_long(argc, argv, "--prefetch", 4);
    if (n < 1) { fprintf(stderr, "matmul_dsm: --n must be >= 1\n"); return 64; }
    uint64_t want = 0;
    int have_want = opt_expect(argc, argv, &want);
    dsm_start();
    int rank = braid_dsm_rank(), size = braid_dsm_size();
    long ld = page_stride(n, sizeof(double)), lo, hi;
    row_block(n, rank, size, &lo, &hi);
    size_t bytes = (size_t)n * (size_t)ld * sizeof(double);
    double *a = dsm_alloc_block(bytes), *b = dsm_alloc_block(bytes), *c = dsm_alloc_block(bytes);
    uint64_t *rh = dsm_alloc_block((size_t)n * 8); /* row hashes of C, for the check */

    dsm_barrier();
    double t0 = now_s(), c0 = thread_cpu_s();
    mm_init_rows(a, b, n, ld, lo, hi);
    dsm_barrier();
    double t_init = now_s() - t0;
    double t_fetch = now_s();
    /* The other ranks' rows of B: before ours and after ours. */
    prefetch(b, (size_t)lo * (size_t)ld * 8, nt);
    prefetch(b + hi * ld, (size_t)(n - hi) * (size_t)ld * 8, nt);
    t_fetch = now_s() - t_fetch;
    mm_rows(a, b, c, n, ld, lo, hi);
    dsm_barrier();
    double t = now_s() - t0, cpu = thread_cpu_s() - c0;
    dsm_timed_end();

    /* Check (not timed): C's hash from every rank's row hashes (no rows move); without
     * --expect, rank 0 also compares all of C with a sequential run. */
    struct f64_rows cr = {c, n, ld};
    uint64_t got = dsm_hash_rows(rh, n, lo, hi, f64_row_hash, &cr);
    int ok = 1;
    char check[160] = "\"check\":\"rank 0 checks\"";
    if (rank == 0) {
        if (have_want) {
            ok = got == want;
            snprintf(check, sizeof check, "\"check\":\"%s\",\"hash\":\"0x%016" PRIx64 "\"",
                     ok ? "equal to --expect" : "MISMATCH with --expect", got);
        } else {
            double *ra = aligned_alloc(4096, bytes), *rb = aligned_alloc(4096, bytes),
                   *rc = aligned_alloc(4096, bytes);
            if (!ra || !rb || !rc) { perror("matmul_dsm: aligned_alloc"); return 1; }
            mm_init_rows(ra, rb, n, ld, 0, n);
            mm_rows(ra, rb, rc, n, ld, 0, n);
            long bad = -1;
            for (long i = 0; i < n && bad < 0; i++)
                if (memcmp(rc + i * ld, c + i * ld, (size_t)n * 8) != 0) bad = i;
            ok = bad < 0;
            if (!ok) fprintf(stderr, "matmul_dsm: row %ld of C differs\n", bad);
            snprintf(check, sizeof check, "\"check\":\"%s\",\"hash\":\"0x%016" PRIx64 "\"",
                     ok ? "bit-exact with a sequential run" : "MISMATCH with a sequential run",
                     got);
            free(ra); free(rb); free(rc);
        }
    }
    dsm_barrier();
    char fields[400];
    snprintf(fields, sizeof fields,
             "\"n\":%ld,\"prefetch_threads\":%ld,\"rows\":[%ld,%ld],\"seconds\":%.4f,\"cpu_s\":%.4f,"
             "\"init_s\":%.4f,\"fetch_s\":%.4f,%s",
             n, nt, lo, hi, t, cpu, t_init, t_fetch, check);
    dsm_report("matmul", fields);
    braid_dsm_free(rh); braid_dsm_free(c); braid_dsm_free(b); braid_dsm_free(a);
    dsm_end();
    if (!ok) {
        fprintf(stderr, "matmul_dsm: C differs from the sequential program\n");
        return 2;
    }
    return 0;
}
