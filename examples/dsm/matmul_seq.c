/*
 * Dense matrix multiply, the plain sequential program (baseline of matmul_dsm.c).
 *   matmul_seq --n N
 * Prints one JSON line: time of initialising A and B and computing C, and C's hash.
 */
#include "common.h"
#include "matmul.h"

int main(int argc, char **argv) {
    static const char *const known[] = {"--n", NULL};
    opt_check(argc, argv, known);
    long n = opt_long(argc, argv, "--n", 512);
    if (n < 1) { fprintf(stderr, "matmul_seq: --n must be >= 1\n"); return 64; }
    long ld = page_stride(n, sizeof(double));
    size_t bytes = (size_t)n * (size_t)ld * sizeof(double);
    double *a = aligned_alloc(4096, bytes), *b = aligned_alloc(4096, bytes),
           *c = aligned_alloc(4096, bytes);
    if (!a || !b || !c) { perror("matmul_seq: aligned_alloc"); return 1; }
    double t0 = now_s(), c0 = thread_cpu_s();
    mm_init_rows(a, b, n, ld, 0, n);
    double t_init = now_s() - t0;
    mm_rows(a, b, c, n, ld, 0, n);
    double t = now_s() - t0, cpu = thread_cpu_s() - c0;
    printf("{\"app\":\"matmul\",\"mode\":\"seq\",\"n\":%ld,\"seconds\":%.4f,\"cpu_s\":%.4f,\"init_s\":%.4f,"
           "\"hash\":\"0x%016" PRIx64 "\",\"c00\":%.17g}\n",
           n, t, cpu, t_init, mm_hash(c, n, ld), c[0]);
    free(a); free(b); free(c);
    return 0;
}
