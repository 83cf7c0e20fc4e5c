/*
 * Red-black SOR, the plain sequential program (the speedup baseline of sor_dsm.c).
 *   sor_seq --n N --iters K        (N even)
 * Prints one JSON line: wall and CPU time of initialisation + K iterations (and of the
 * initialisation alone), and the hash of the grid that sor_dsm --expect compares with.
 */
#include "common.h"
#include "sor.h"

int main(int argc, char **argv) {
    static const char *const known[] = {"--n", "--iters", NULL};
    opt_check(argc, argv, known);
    long n = opt_long(argc, argv, "--n", 1024), iters = opt_long(argc, argv, "--iters", 100);
    if (n < 4 || n % 2) { fprintf(stderr, "sor_seq: --n must be even and >= 4\n"); return 64; }
    long ld = page_stride(n / 2, sizeof(double));
    size_t bytes = (size_t)n * (size_t)ld * sizeof(double);
    double *r = aligned_alloc(4096, bytes), *b = aligned_alloc(4096, bytes);
    if (!r || !b) { perror("sor_seq: aligned_alloc"); return 1; }
    double t0 = now_s(), c0 = thread_cpu_s();
    sor_init_rows(r, b, n, ld, 0, n);
    double t_init = now_s() - t0;
    for (long it = 0; it < iters; it++) {
        sor_half_sweep(r, b, n, ld, 0, n, 0);
        sor_half_sweep(b, r, n, ld, 0, n, 1);
    }
    double t = now_s() - t0, cpu = thread_cpu_s() - c0;
    printf("{\"app\":\"sor\",\"mode\":\"seq\",\"n\":%ld,\"iters\":%ld,\"seconds\":%.4f,\"cpu_s\":%.4f,"
           "\"init_s\":%.4f,\"hash\":\"0x%016" PRIx64 "\"}\n",
           n, iters, t, cpu, t_init, sor_hash(r, b, n, ld));
    free(r);
    free(b);
    return 0;
}
