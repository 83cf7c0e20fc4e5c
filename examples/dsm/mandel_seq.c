/*
 * The irregular kernel (Mandelbrot tasks), the plain sequential program (baseline of
 * mandel_dsm.c).
 *   mandel_seq --w W --h H --rows R --iters MAX
 */
#include "common.h"
#include "mandel.h"

int main(int argc, char **argv) {
    static const char *const known[] = {"--w", "--h", "--rows", "--iters", NULL};
    opt_check(argc, argv, known);
    long w = opt_long(argc, argv, "--w", 1024), h = opt_long(argc, argv, "--h", 1024);
    long rows = opt_long(argc, argv, "--rows", 4), mi = opt_long(argc, argv, "--iters", 1000);
    if (w < 1 || h < 1 || rows < 1) { fprintf(stderr, "mandel_seq: sizes must be >= 1\n"); return 64; }
    long ld = page_stride(w, sizeof(uint32_t));
    uint32_t *img = aligned_alloc(4096, (size_t)h * (size_t)ld * 4);
    if (!img) { perror("mandel_seq: aligned_alloc"); return 1; }
    memset(img, 0, (size_t)h * (size_t)ld * 4);
    double t0 = now_s(), c0 = thread_cpu_s();
    for (long t = 0; t < mandel_tasks(h, rows); t++) mandel_task(img, w, h, ld, rows, t, mi);
    double t = now_s() - t0, cpu = thread_cpu_s() - c0;
    printf("{\"app\":\"mandel\",\"mode\":\"seq\",\"w\":%ld,\"h\":%ld,\"rows_per_task\":%ld,"
           "\"max_iter\":%ld,\"tasks\":%ld,\"seconds\":%.4f,\"cpu_s\":%.4f,\"hash\":\"0x%016" PRIx64 "\"}\n",
           w, h, rows, mi, mandel_tasks(h, rows), t, cpu, mandel_hash(img, w, h, ld));
    free(img);
    return 0;
}
