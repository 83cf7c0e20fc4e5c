/*
 * Dense matrix multiply C = A x B (n x n doubles, row stride `ld`): the kernel shared by
 * matmul_seq.c and matmul_dsm.c. Rows of C are independent, and every C[i][j] is summed
 * over k in ascending order whatever the row range, so splitting the rows among ranks
 * gives bit for bit the sequential result. Blocked over k (KB rows of B at a time) so a
 * block of B stays in cache while the rows of C pass over it.
 */
#ifndef DSM_APPS_MATMUL_H
#define DSM_APPS_MATMUL_H

#define MM_KB 32

/* Deterministic inputs: small exact values. */
static inline double mm_a(long i, long j) { return (double)((i * 7 + j * 3) % 17) / 16.0 - 0.5; }
static inline double mm_b(long i, long j) { return (double)((i * 5 + j * 11) % 13) / 8.0 - 0.75; }

/* Writes rows [lo, hi) of A and B. */
static inline void mm_init_rows(double *a, double *b, long n, long ld, long lo, long hi) {
    for (long i = lo; i < hi; i++)
        for (long j = 0; j < n; j++) {
            a[i * ld + j] = mm_a(i, j);
            b[i * ld + j] = mm_b(i, j);
        }
}

/* Rows [lo, hi) of C = A x B (C's rows are overwritten). */
static inline void mm_rows(const double *a, const double *b, double *c, long n, long ld,
                           long lo, long hi) {
    for (long i = lo; i < hi; i++)
        for (long j = 0; j < n; j++) c[i * ld + j] = 0.0;
    for (long kk = 0; kk < n; kk += MM_KB) {
        long ke = kk + MM_KB < n ? kk + MM_KB : n;
        for (long i = lo; i < hi; i++) {
            double *ci = c + i * ld;
            for (long k = kk; k < ke; k++) {
                const double aik = a[i * ld + k];
                const double *bk = b + k * ld;
                for (long j = 0; j < n; j++) ci[j] += aik * bk[j];
            }
        }
    }
}

/* Hash of C's n x n values. */
static inline uint64_t mm_hash(const double *c, long n, long ld) {
    uint64_t h = 0;
    for (long i = 0; i < n; i++) h = h * 31 + hash_words(c + i * ld, (size_t)n * 8);
    return h;
}

#endif
