/*
 * The irregular kernel on braid-dsm: a task queue under a global lock. The image is a
 * shared allocation (rows padded to pages, so tasks never share a page); the queue is a
 * counter in a page of its own. Each rank takes the next task under braid_dsm_lock(0)
 * (the counter's page moves to the taker: a write fault), computes its rows into the
 * shared image, and comes back until the queue is empty: the ranks balance the uneven
 * task costs between themselves.
 *   braid run -n 2 -- mandel_dsm --w W --h H --rows R --iters MAX [--expect HASH]
 * Checks the image bit for bit against HASH (mandel_seq's) or against a sequential run
 * on rank 0 after the timed part. Exit 2 on a mismatch.
 */
#include "common.h"
#include "dsm_util.h"
#include "mandel.h"

int main(int argc, char **argv) {
    static const char *const known[] = {"--w", "--h", "--rows", "--iters", "--expect", NULL};
    opt_check(argc, argv, known);
    long w = opt_long(argc, argv, "--w", 1024), h = opt_long(argc, argv, "--h", 1024);
    long rows = opt_long(argc, argv, "--rows", 4), mi = opt_long(argc, argv, "--iters", 1000);
    if (w < 1 || h < 1 || rows < 1) { fprintf(stderr, "mandel_dsm: sizes must be >= 1\n"); return 64; }
    uint64_t want = 0;
    int have_want = opt_expect(argc, argv, &want);
    dsm_start();
    int rank = braid_dsm_rank();
    long ld = page_stride(w, sizeof(uint32_t)), ntasks = mandel_tasks(h, rows);
    uint32_t *img = dsm_alloc_block((size_t)h * (size_t)ld * 4);
    volatile long *next = dsm_alloc_block(4096); /* the queue: next task to hand out */

    dsm_barrier();
    dsm_timed_start();
    double t0 = now_s(), c0 = thread_cpu_s();
    long mine = 0;
    for (;;) {
        dsm_lock(0);
        long t = *next;
        if (t < ntasks) *next = t + 1;
        dsm_unlock(0);
        if (t >= ntasks) break;
        mandel_task(img, w, h, ld, rows, t, mi);
        mine++;
    }
    dsm_barrier();
    double el = now_s() - t0, cpu = thread_cpu_s() - c0;
    dsm_timed_end();

    int ok = 1;
    char check[160] = "\"check\":\"rank 0 checks\"";
    if (rank == 0) {
        uint64_t got = mandel_hash(img, w, h, ld);
        if (have_want) {
            ok = got == want;
            snprintf(check, sizeof check, "\"check\":\"%s\",\"hash\":\"0x%016" PRIx64 "\"",
                     ok ? "equal to --expect" : "MISMATCH with --expect", got);
        } else {
            uint32_t *ref = aligned_alloc(4096, (size_t)h * (size_t)ld * 4);
            if (!ref) { perror("mandel_dsm: aligned_alloc"); return 1; }
            memset(ref, 0, (size_t)h * (size_t)ld * 4);
            for (long t = 0; t < ntasks; t++) mandel_task(ref, w, h, ld, rows, t, mi);
            long bad = -1;
            for (long y = 0; y < h && bad < 0; y++)
                if (memcmp(ref + y * ld, img + y * ld, (size_t)w * 4) != 0) bad = y;
            ok = bad < 0;
            if (!ok) fprintf(stderr, "mandel_dsm: row %ld differs\n", bad);
            snprintf(check, sizeof check, "\"check\":\"%s\",\"hash\":\"0x%016" PRIx64 "\"",
                     ok ? "bit-exact with a sequential run" : "MISMATCH with a sequential run",
                     got);
            free(ref);
        }
    }
    dsm_barrier();
    char fields[400];
    snprintf(fields, sizeof fields,
             "\"w\":%ld,\"h\":%ld,\"rows_per_task\":%ld,\"max_iter\":%ld,\"tasks\":%ld,"
             "\"tasks_done\":%ld,\"seconds\":%.4f,\"cpu_s\":%.4f,%s",
             w, h, rows, mi, ntasks, mine, el, cpu, check);
    dsm_report("mandel", fields);
    braid_dsm_free((void *)next);
    braid_dsm_free(img);
    dsm_end();
    if (!ok) {
        fprintf(stderr, "mandel_dsm: image differs from the sequential program\n");
        return 2;
    }
    return 0;
}
