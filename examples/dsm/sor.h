/*
 * Red-black successive over-relaxation on an n x n grid (n even): the kernel shared by
 * sor_seq.c and sor_dsm.c.
 *
 * Layout (as in the TreadMarks/SPLASH SOR): the red points ((i + j) even) and the black
 * points ((i + j) odd) are kept in two arrays of n rows of n/2 values, R and B (row stride
 * `ld`, padded to whole pages). Point (i, j) of colour c is X[i][k] with j = ((i + c) & 1)
 * + 2k. A half-sweep of colour c updates X = (c ? B : R) from its four neighbours, which
 * all have the other colour Y:
 *     X[i][k] = (1 - w) X[i][k] + w/4 (Y[i-1][k] + Y[i+1][k] + Y[i][k-a] + Y[i][k+1-a])
 * with a = 1 when (i + c) is even (then the left neighbour is at k - 1), else 0. So a
 * half-sweep writes one array and only reads the other: split by rows between ranks, a
 * rank's edge rows share no page with what the neighbour writes in the same half-sweep,
 * and the result is bit for bit the sequential one in any split.
 *
 * The boundary is fixed (top edge 1, left edge 0.5, bottom and right 0); the interior
 * starts at a deterministic pattern in [0, 1).
 */
#ifndef DSM_APPS_SOR_H
#define DSM_APPS_SOR_H

#define SOR_OMEGA 1.5

/* The initial value of point (i, j). */
static inline double sor_initial(long n, long i, long j) {
    if (i == 0) return 1.0;
    if (i == n - 1 || j == n - 1) return 0.0;
    if (j == 0) return 0.5;
    return (double)((i * 31 + j * 17) % 101) / 101.0;
}

/* Writes the initial values of rows [lo, hi) of both colours. */
static inline void sor_init_rows(double *r, double *b, long n, long ld, long lo, long hi) {
    for (long i = lo; i < hi; i++)
        for (long k = 0; k < n / 2; k++) {
            r[i * ld + k] = sor_initial(n, i, (i & 1) + 2 * k);
            b[i * ld + k] = sor_initial(n, i, ((i + 1) & 1) + 2 * k);
        }
}

/* Updates colour c's points (array x) of interior row i (0 < i < n - 1) with k in
 * [kb, ke), from the other colour's array y. */
static inline void sor_row(double *restrict x, const double *restrict y, long n, long ld, long i,
                           int c, long kb, long ke) {
    const double w = SOR_OMEGA, w4 = SOR_OMEGA / 4.0;
    long j0 = (i + c) & 1, a = 1 - j0;
    long k0 = j0 == 0 ? 1 : 0, k1 = (n - 2 - j0) / 2; /* interior: 1 <= j <= n - 2 */
    if (kb < k0) kb = k0;
    if (ke > k1 + 1) ke = k1 + 1;
    double *xr = x + i * ld;
    const double *up = y + (i - 1) * ld, *dn = y + (i + 1) * ld, *yr = y + i * ld - a;
    for (long k = kb; k < ke; k++)
        xr[k] = (1.0 - w) * xr[k] + w4 * (up[k] + dn[k] + yr[k] + yr[k + 1]);
}

/* Updates colour c's points (array x) in rows [lo, hi), clipped to the interior, from
 * the other colour's array y. */
static inline void sor_half_sweep(double *restrict x, const double *restrict y, long n, long ld,
                                  long lo, long hi, int c) {
    if (lo < 1) lo = 1;
    if (hi > n - 1) hi = n - 1;
    for (long i = lo; i < hi; i++) sor_row(x, y, n, ld, i, c, 0, n / 2);
}

/* The whole computation on private memory (the sequential program, and the DSM
 * program's reference check for small grids). */
static inline void sor_sequential(double *r, double *b, long n, long ld, long iters) {
    sor_init_rows(r, b, n, ld, 0, n);
    for (long it = 0; it < iters; it++) {
        sor_half_sweep(r, b, n, ld, 0, n, 0);
        sor_half_sweep(b, r, n, ld, 0, n, 1);
    }
}

/* Hash of row i of one colour array (its n/2 values). */
static inline uint64_t sor_row_hash(const double *x, long n, long ld, long i) {
    return hash_words(x + i * ld, (size_t)(n / 2) * 8);
}

/* Hash of the grid: the red rows, then the black rows. */
static inline uint64_t sor_hash(const double *r, const double *b, long n, long ld) {
    uint64_t h = 0;
    for (long i = 0; i < n; i++) h = h * 31 + sor_row_hash(r, n, ld, i);
    for (long i = 0; i < n; i++) h = h * 31 + sor_row_hash(b, n, ld, i);
    return h;
}

#endif
