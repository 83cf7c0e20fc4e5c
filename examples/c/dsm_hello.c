/*
 * braid-dsm from C: every rank fills its share of a shared array, rank 0 checks the sum,
 * every rank adds to a counter under a global lock, and all check the total.
 *
 *   scripts/install.sh /usr/local        # or any PREFIX (then add -Wl,-rpath,PREFIX/lib)
 *   cc -O2 -Wall examples/c/dsm_hello.c -o dsm_hello $(pkg-config --cflags --libs braid-dsm)
 *   braid run -n 3 -- ./dsm_hello
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <braid/dsm.h>

#define N (1 << 16)
#define ROUNDS 100

static int die(const char *what) {
    fprintf(stderr, "dsm_hello: %s: %s (%s)\n", what, braid_dsm_last_error(), strerror(errno));
    return 1;
}

int main(void) {
    if (braid_dsm_init() != 0) return die("init");
    int rank = braid_dsm_rank(), size = braid_dsm_size();
    uint64_t *a = braid_dsm_alloc(N * sizeof *a);
    uint64_t *counter = braid_dsm_alloc_policy(sizeof *counter, BRAID_DSM_HOME_CYCLIC);
    if (!a || !counter) return die("alloc");

    for (size_t i = (size_t)rank * N / size; i < (size_t)(rank + 1) * N / size; i++) a[i] = i;
    if (braid_dsm_barrier() != 0) return die("barrier");
    if (rank == 0) {
        uint64_t sum = 0;
        for (size_t i = 0; i < N; i++) sum += a[i];
        if (sum != (uint64_t)N * (N - 1) / 2) {
            fprintf(stderr, "dsm_hello: sum %llu\n", (unsigned long long)sum);
            return 1;
        }
    }
    for (int i = 0; i < ROUNDS; i++) {
        if (braid_dsm_lock(1) != 0) return die("lock");
        *counter += 1;
        if (braid_dsm_unlock(1) != 0) return die("unlock");
    }
    if (braid_dsm_barrier() != 0) return die("barrier");
    if (*counter != (uint64_t)ROUNDS * size) {
        fprintf(stderr, "dsm_hello: counter %llu\n", (unsigned long long)*counter);
        return 1;
    }
    /* Different sizes are an error on every rank, not a hang. */
    if (braid_dsm_alloc(4096 * (size_t)(rank + 1)) != NULL && size > 1) return die("mismatch not caught");
    if (size > 1 && errno != EINVAL) return die("mismatch errno");
    uint64_t total = *counter;
    braid_dsm_free(a);
    braid_dsm_free(counter);
    printf("rank %d of %d: sum and counter (%llu) correct\n", rank, size, (unsigned long long)total);
    if (braid_dsm_finalize() != 0) return die("finalize");
    return 0;
}
