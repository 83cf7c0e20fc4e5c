/*
 * Red-black SOR on braid-dsm. The grid is one shared allocation homed in blocks of rows
 * (BRAID_DSM_HOME_BLOCK, rows padded to whole pages), and rank r updates exactly the rows
 * homed at it, so the only pages that move are the two boundary rows next to each
 * neighbour's block: each half-sweep reads the neighbour's edge row (a read fault per
 * page) and its next write to its own edge row takes the page back (an upgrade that
 * invalidates the neighbour's copy). Barriers separate the half-sweeps.
 *   braid run -n 2 -- sor_dsm --n N --iters K [--expect HASH]
 * Checks the result bit for bit: against HASH (sor_seq's) if given, else against a
 * sequential run rank 0 does itself after the timed part. Exit 2 on a mismatch.
 */
#include "common.h"
#include "dsm_util.h"
#include "sor.h"

int main(int argc, char **argv) {
    static const char *const known[] = {"--n", "--iters", "--expect", NULL};
    opt_check(argc, argv, known);
    long n = opt_long(argc, argv, "--n", 1024), iters = opt_long(argc, argv, "--iters", 100);
    if (n < 3) { fprintf(stderr, "sor_dsm: --n must be >= 3\n"); return 64; }
    uint64_t want = 0;
    int have_want = opt_expect(argc, argv, &want);
    dsm_start();
    int rank = braid_dsm_rank(), size = braid_dsm_size();
    long ld = page_stride(n, sizeof(double)), lo, hi;
    row_block(n, rank, size, &lo, &hi);
    double *u = dsm_alloc_block((size_t)n * (size_t)ld * sizeof(double));
    uint64_t *rh = dsm_alloc_block((size_t)n * 8); /* row hashes, for the check */

    dsm_barrier();
    double t0 = now_s(), c0 = thread_cpu_s();
    sor_init_rows(u, n, ld, lo, hi);
    dsm_barrier();
    double t_init = now_s() - t0;
    for (long it = 0; it < iters; it++) {
        sor_half_sweep(u, n, ld, lo, hi, 0);
        dsm_barrier();
        sor_half_sweep(u, n, ld, lo, hi, 1);
        dsm_barrier();
    }
    double t = now_s() - t0, cpu = thread_cpu_s() - c0;
    dsm_timed_end();

    /* Check (not timed): the hash from every rank's row hashes (no rows move); without
     * --expect, rank 0 also compares the whole grid with a sequential run. */
    struct f64_rows grid = {u, n, ld};
    uint64_t got = dsm_hash_rows(rh, n, lo, hi, f64_row_hash, &grid);
    int ok = 1;
    char check[160] = "\"check\":\"rank 0 checks\"";
    if (rank == 0) {
        if (have_want) {
            ok = got == want;
            snprintf(check, sizeof check, "\"check\":\"%s\",\"hash\":\"0x%016" PRIx64 "\"",
                     ok ? "equal to --expect" : "MISMATCH with --expect", got);
        } else {
            double *ref = aligned_alloc(4096, (size_t)n * (size_t)ld * sizeof(double));
            if (!ref) { perror("sor_dsm: aligned_alloc"); return 1; }
            sor_sequential(ref, n, ld, iters);
            long bad = -1;
            for (long i = 0; i < n && bad < 0; i++)
                if (memcmp(ref + i * ld, u + i * ld, (size_t)n * 8) != 0) bad = i;
            ok = bad < 0;
            if (!ok)
                fprintf(stderr, "sor_dsm: row %ld differs from the sequential result\n", bad);
            snprintf(check, sizeof check,
                     "\"check\":\"%s\",\"hash\":\"0x%016" PRIx64 "\"",
                     ok ? "bit-exact with a sequential run" : "MISMATCH with a sequential run",
                     got);
            free(ref);
        }
    }
    dsm_barrier();
    char fields[400];
    snprintf(fields, sizeof fields, "\"n\":%ld,\"iters\":%ld,\"rows\":[%ld,%ld],\"seconds\":%.4f,\"cpu_s\":%.4f,"
             "\"init_s\":%.4f,%s",
             n, iters, lo, hi, t, cpu, t_init, check);
    dsm_report("sor", fields);
    braid_dsm_free(rh);
    braid_dsm_free(u);
    dsm_end();
    if (!ok) {
        fprintf(stderr, "sor_dsm: result differs from the sequential program\n");
        return 2;
    }
    return 0;
}
