/*
 * The irregular kernel: the Mandelbrot set on a w x h image of iteration counts (uint32,
 * row stride `ld`), cut into tasks of `rows` rows whose cost differs by orders of
 * magnitude (rows through the set run to max_iter, rows outside leave at once). Shared by
 * mandel_seq.c (tasks in order) and mandel_dsm.c (tasks handed out from a shared queue
 * under a lock, so ranks balance the load dynamically). Integer results: bit-exact.
 */
#ifndef DSM_APPS_MANDEL_H
#define DSM_APPS_MANDEL_H

/* Computes row y of the image. */
static inline void mandel_row(uint32_t *img, long w, long h, long ld, long y, long max_iter) {
    const double x0 = -2.2, x1 = 0.8, y0 = -1.2, y1 = 1.2;
    double ci = y0 + (y1 - y0) * (double)y / (double)h;
    uint32_t *r = img + y * ld;
    for (long x = 0; x < w; x++) {
        double cr = x0 + (x1 - x0) * (double)x / (double)w;
        double zr = 0.0, zi = 0.0;
        long k = 0;
        while (k < max_iter && zr * zr + zi * zi <= 4.0) {
            double t = zr * zr - zi * zi + cr;
            zi = 2.0 * zr * zi + ci;
            zr = t;
            k++;
        }
        r[x] = (uint32_t)k;
    }
}

/* Task t: rows [t * rows, min(h, (t + 1) * rows)). */
static inline void mandel_task(uint32_t *img, long w, long h, long ld, long rows, long t,
                               long max_iter) {
    long e = (t + 1) * rows < h ? (t + 1) * rows : h;
    for (long y = t * rows; y < e; y++) mandel_row(img, w, h, ld, y, max_iter);
}

static inline long mandel_tasks(long h, long rows) { return (h + rows - 1) / rows; }

static inline uint64_t mandel_hash(const uint32_t *img, long w, long h, long ld) {
    uint64_t hs = 0;
    for (long y = 0; y < h; y++) hs = hs * 31 + hash_words(img + y * ld, (size_t)w * 4);
    return hs;
}

#endif
