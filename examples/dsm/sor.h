/*
 * Red-black successive over-relaxation on an n x n grid (row stride `ld` doubles): the
 * kernel shared by sor_seq.c and sor_dsm.c. The boundary is fixed (top edge 1, left edge
 * 0.5, the others 0), the interior starts at a deterministic pattern in [0, 1) (so every
 * point computes ordinary numbers from the first sweep on, not zeros). A half-sweep updates the points of one
 * colour ((i + j) % 2 == colour) from their four neighbours, which all have the other
 * colour, so the rows of a half-sweep can be split among ranks in any way and the result
 * is bit for bit that of the sequential program.
 */
#ifndef DSM_APPS_SOR_H
#define DSM_APPS_SOR_H

#define SOR_OMEGA 1.5

/* Writes the initial values of rows [lo, hi). */
static inline void sor_init_rows(double *u, long n, long ld, long lo, long hi) {
    for (long i = lo; i < hi; i++) {
        double *r = u + i * ld;
        for (long j = 0; j < n; j++) {
            double v = (double)((i * 31 + j * 17) % 101) / 101.0;
            if (i == 0) v = 1.0;
            else if (i == n - 1 || j == n - 1) v = 0.0;
            else if (j == 0) v = 0.5;
            r[j] = v;
        }
    }
}

/* Updates the points of `colour` in rows [lo, hi) (clipped to the interior). */
static inline void sor_half_sweep(double *u, long n, long ld, long lo, long hi, int colour) {
    if (lo < 1) lo = 1;
    if (hi > n - 1) hi = n - 1;
    const double w = SOR_OMEGA, w4 = SOR_OMEGA / 4.0;
    for (long i = lo; i < hi; i++) {
        double *r = u + i * ld;
        const double *up = r - ld, *dn = r + ld;
        for (long j = 1 + ((i + 1 + colour) & 1); j < n - 1; j += 2)
            r[j] = (1.0 - w) * r[j] + w4 * (up[j] + dn[j] + r[j - 1] + r[j + 1]);
    }
}

/* The whole computation on private memory (the sequential program, and the DSM
 * program's reference check for small grids). */
static inline void sor_sequential(double *u, long n, long ld, long iters) {
    sor_init_rows(u, n, ld, 0, n);
    for (long it = 0; it < iters; it++) {
        sor_half_sweep(u, n, ld, 0, n, 0);
        sor_half_sweep(u, n, ld, 0, n, 1);
    }
}

/* Hash of the grid's n x n values (padding excluded). */
static inline uint64_t sor_hash(const double *u, long n, long ld) {
    uint64_t h = 0;
    for (long i = 0; i < n; i++) h = h * 31 + hash_words(u + i * ld, (size_t)n * 8);
    return h;
}

#endif
