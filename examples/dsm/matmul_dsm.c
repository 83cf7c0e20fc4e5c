/*
 * Dense matrix multiply on braid-dsm: A, B and C are shared allocations homed in blocks
 * of rows; rank r initialises its rows of A and B and computes its rows of C, so A and C
 * never move and each rank fetches the other ranks' rows of B once (read copies).
 *   braid run -n 2 -- matmul_dsm --n N [--prefetch T] [--expect HASH]
 * --prefetch T (default 8): T extra threads read the other ranks' pages of B, in the
 * order the multiply needs them, while it runs: T page faults are in flight at a time
 * instead of one (the fault latency, not the rails, bounds a single thread's fetch
 * rate), and the transfer overlaps with the computation (rank 0 starts on its own rows of
 * B; the others' multiply finds the pages it reaches already fetched or on the way). Checks C bit for bit against HASH
 * (matmul_seq's) or, without it, against a sequential run on rank 0 after the timed part.
 * Exit 2 on a mismatch.
 */
#include <pthread.h>

#include "common.h"
#include "dsm_util.h"
#include "matmul.h"

#define MAX_PREFETCH 64

/* A prefetch thread: reads one byte of pages t, t + nt, ... of two ranges in turn. */
struct touch {
    const volatile char *p[2];
    size_t pages[2];
    long t, nt;
    double end; /* when it finished */
};

static void *toucher(void *arg) {
    struct touch *w = arg;
    for (int r = 0; r < 2; r++)
        for (size_t i = (size_t)w->t; i < w->pages[r]; i += (size_t)w->nt) (void)w->p[r][i * 4096];
    w->end = now_s();
    return NULL;
}

int main(int argc, char **argv) {
    static const char *const known[] = {"--n", "--prefetch", "--expect", NULL};
    opt_check(argc, argv, known);
    long n = opt_long(argc, argv, "--n", 512), nt = opt_long(argc, argv, "--prefetch", 8);
    if (nt > MAX_PREFETCH) { fprintf(stderr, "matmul_dsm: at most %d prefetch threads\n", MAX_PREFETCH); return 64; }
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
    dsm_timed_start();
    double t0 = now_s(), c0 = thread_cpu_s();
    mm_init_rows(a, b, n, ld, lo, hi);
    dsm_barrier();
    double t_init = now_s() - t0;
    /* The other ranks' rows of B, in the multiply's order: before ours, then after. */
    double t_fetch = now_s();
    pthread_t th[MAX_PREFETCH];
    struct touch w[MAX_PREFETCH];
    for (long i = 0; i < nt; i++) {
        w[i] = (struct touch){{(const volatile char *)b, (const volatile char *)(b + hi * ld)},
                              {(size_t)lo * (size_t)ld / 512, (size_t)(n - hi) * (size_t)ld / 512},
                              i, nt, 0.0};
        if (pthread_create(&th[i], NULL, toucher, &w[i]) != 0) { perror("pthread_create"); return 1; }
    }
    mm_rows(a, b, c, n, ld, lo, hi);
    double fetched = t_fetch;
    for (long i = 0; i < nt; i++) {
        pthread_join(th[i], NULL);
        if (w[i].end > fetched) fetched = w[i].end;
    }
    t_fetch = fetched - t_fetch;
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
