/*
 * Red-black SOR on braid-dsm (layout in sor.h: red and black points in two arrays). Both
 * arrays are shared allocations homed in blocks of rows (BRAID_DSM_HOME_BLOCK, rows padded
 * to pages), and rank r updates exactly the rows homed at it, so the only pages that move
 * are those of the rows at the edges of the blocks: in each half-sweep a rank reads the
 * neighbour's edge row of the other colour (read faults) and its first write to its own
 * edge row of this colour takes those pages back from the neighbour's read copies (write
 * faults that invalidate them). Barriers separate the half-sweeps.
 *
 * Those faults are served one at a time per thread, each a network round trip, so the
 * edge rows are computed by --edge-threads T helper threads (default 8), one page-wide
 * segment of the row each, while the main thread computes the interior rows: the faults
 * of a half-sweep are in flight together and overlap with computation. Every point is
 * still computed once with the same arithmetic (0: the main thread does everything).
 *   braid run -n 2 -- sor_dsm --n N --iters K [--edge-threads T] [--expect HASH]
 * Checks the result bit for bit: against HASH (sor_seq's) if given, else against a
 * sequential run rank 0 does itself after the timed part. Exit 2 on a mismatch.
 */
#include <pthread.h>

#include "common.h"
#include "dsm_util.h"
#include "sor.h"

#define MAX_EDGE_THREADS 64
#define SEG 512 /* values per page-wide segment of a row (rows are page aligned) */

/* The helper threads computing the edge rows of each half-sweep. */
static struct {
    int nt;                        /* threads */
    pthread_t th[MAX_EDGE_THREADS];
    pthread_barrier_t start, done; /* main + nt threads */
    double *x;                     /* this half-sweep: colour c's array, */
    const double *y;               /* the other colour's, */
    int c;
    long n, ld, rows[2], nrows;    /* and the edge rows to compute */
    int quit;
} edge;

static void *edge_worker(void *arg) {
    long w = (long)(intptr_t)arg, nseg = (edge.n / 2 + SEG - 1) / SEG;
    for (;;) {
        pthread_barrier_wait(&edge.start);
        if (edge.quit) return NULL;
        for (long e = 0; e < edge.nrows; e++)
            for (long s = w; s < nseg; s += edge.nt)
                sor_row(edge.x, edge.y, edge.n, edge.ld, edge.rows[e], edge.c, s * SEG, (s + 1) * SEG);
        pthread_barrier_wait(&edge.done);
    }
}

/* One half-sweep of rows [lo, hi): the edge rows (next to another rank's block) by the
 * helper threads, the others by the caller, at the same time. */
static void half_sweep(double *x, const double *y, long n, long ld, long lo, long hi, int c,
                       int rank, int size) {
    long a = lo < 1 ? 1 : lo, b = hi > n - 1 ? n - 1 : hi;
    if (a >= b) return;
    edge.x = x, edge.y = y, edge.c = c, edge.nrows = 0;
    if (rank > 0) edge.rows[edge.nrows++] = a++;
    if (rank < size - 1 && a < b) edge.rows[edge.nrows++] = --b;
    if (edge.nt == 0) {
        /* Edge rows first: every rank faults at the start of the half-sweep, while the
         * neighbour is blocked on its own faults too, so its service thread has a free
         * core to answer at once (rather than preempting its computation). */
        for (long e = 0; e < edge.nrows; e++) sor_row(x, y, n, ld, edge.rows[e], c, 0, n / 2);
        sor_half_sweep(x, y, n, ld, a, b, c);
        return;
    }
    pthread_barrier_wait(&edge.start);
    sor_half_sweep(x, y, n, ld, a, b, c);
    pthread_barrier_wait(&edge.done);
}

struct sor_rows { const double *r, *b; long n, ld; };

/* Row i < n: red row i; row n + i: black row i (the order sor_hash folds them in). */
static uint64_t sor_dsm_row(long i, const void *ctx) {
    const struct sor_rows *s = ctx;
    return i < s->n ? sor_row_hash(s->r, s->n, s->ld, i) : sor_row_hash(s->b, s->n, s->ld, i - s->n);
}

int main(int argc, char **argv) {
    static const char *const known[] = {"--n", "--iters", "--edge-threads", "--expect", NULL};
    opt_check(argc, argv, known);
    long n = opt_long(argc, argv, "--n", 1024), iters = opt_long(argc, argv, "--iters", 100);
    if (n < 4 || n % 2) { fprintf(stderr, "sor_dsm: --n must be even and >= 4\n"); return 64; }
    long nt = opt_long(argc, argv, "--edge-threads", 8);
    if (nt > MAX_EDGE_THREADS) { fprintf(stderr, "sor_dsm: at most %d edge threads\n", MAX_EDGE_THREADS); return 64; }
    uint64_t want = 0;
    int have_want = opt_expect(argc, argv, &want);
    dsm_start();
    int rank = braid_dsm_rank(), size = braid_dsm_size();
    long ld = page_stride(n / 2, sizeof(double)), lo, hi;
    row_block(n, rank, size, &lo, &hi);
    size_t bytes = (size_t)n * (size_t)ld * sizeof(double);
    double *r = dsm_alloc_block(bytes), *b = dsm_alloc_block(bytes);
    uint64_t *rh = dsm_alloc_block((size_t)n * 16); /* row hashes, for the check */

    edge.nt = size > 1 ? (int)nt : 0, edge.n = n, edge.ld = ld;
    if (edge.nt > 0) {
        if (pthread_barrier_init(&edge.start, NULL, (unsigned)edge.nt + 1) ||
            pthread_barrier_init(&edge.done, NULL, (unsigned)edge.nt + 1)) {
            perror("sor_dsm: pthread_barrier_init");
            return 1;
        }
        for (long w = 0; w < edge.nt; w++)
            if (pthread_create(&edge.th[w], NULL, edge_worker, (void *)(intptr_t)w)) {
                perror("sor_dsm: pthread_create");
                return 1;
            }
    }

    dsm_barrier();
    dsm_timed_start();
    double t0 = now_s(), c0 = thread_cpu_s();
    sor_init_rows(r, b, n, ld, lo, hi);
    dsm_barrier();
    double t_init = now_s() - t0;
    for (long it = 0; it < iters; it++) {
        half_sweep(r, b, n, ld, lo, hi, 0, rank, size);
        dsm_barrier();
        half_sweep(b, r, n, ld, lo, hi, 1, rank, size);
        dsm_barrier();
    }
    double t = now_s() - t0, cpu = thread_cpu_s() - c0;
    dsm_timed_end();
    if (edge.nt > 0) {
        edge.quit = 1;
        pthread_barrier_wait(&edge.start);
        for (long w = 0; w < edge.nt; w++) pthread_join(edge.th[w], NULL);
    }

    /* Check (not timed): the hash from every rank's row hashes (no rows move; red row i
     * at rh[i], black row i at rh[n + i]); without --expect, rank 0 also compares the
     * whole grid with a sequential run. */
    struct sor_rows grid = {r, b, n, ld};
    for (long i = lo; i < hi; i++) rh[n + i] = sor_dsm_row(n + i, &grid);
    uint64_t got = dsm_hash_rows(rh, n, lo, hi, sor_dsm_row, &grid);
    if (rank == 0) {
        for (long i = 0; i < n; i++) got = got * 31 + rh[n + i];
    }
    int ok = 1;
    char check[160] = "\"check\":\"rank 0 checks\"";
    if (rank == 0) {
        if (have_want) {
            ok = got == want;
            snprintf(check, sizeof check, "\"check\":\"%s\",\"hash\":\"0x%016" PRIx64 "\"",
                     ok ? "equal to --expect" : "MISMATCH with --expect", got);
        } else {
            double *rr = aligned_alloc(4096, bytes), *rb = aligned_alloc(4096, bytes);
            if (!rr || !rb) { perror("sor_dsm: aligned_alloc"); return 1; }
            sor_sequential(rr, rb, n, ld, iters);
            long bad = -1;
            for (long i = 0; i < n && bad < 0; i++)
                if (memcmp(rr + i * ld, r + i * ld, (size_t)(n / 2) * 8) != 0 ||
                    memcmp(rb + i * ld, b + i * ld, (size_t)(n / 2) * 8) != 0)
                    bad = i;
            ok = bad < 0 && got == sor_hash(rr, rb, n, ld);
            if (!ok) fprintf(stderr, "sor_dsm: row %ld differs from the sequential result\n", bad);
            snprintf(check, sizeof check, "\"check\":\"%s\",\"hash\":\"0x%016" PRIx64 "\"",
                     ok ? "bit-exact with a sequential run" : "MISMATCH with a sequential run",
                     got);
            free(rr);
            free(rb);
        }
    }
    dsm_barrier();
    char fields[400];
    snprintf(fields, sizeof fields,
             "\"n\":%ld,\"iters\":%ld,\"edge_threads\":%d,\"rows\":[%ld,%ld],\"seconds\":%.4f,"
             "\"cpu_s\":%.4f,\"init_s\":%.4f,%s",
             n, iters, edge.nt, lo, hi, t, cpu, t_init, check);
    dsm_report("sor", fields);
    braid_dsm_free(rh);
    braid_dsm_free(b);
    braid_dsm_free(r);
    dsm_end();
    if (!ok) {
        fprintf(stderr, "sor_dsm: result differs from the sequential program\n");
        return 2;
    }
    return 0;
}
