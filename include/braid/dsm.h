/*
 * braid-dsm: a sequentially consistent, page-based distributed shared memory on braid.
 *
 * Install with scripts/install.sh PREFIX, build with
 * `cc prog.c $(pkg-config --cflags --libs braid-dsm)` (static: `pkg-config --static`, whose
 * Libs.private lists what the Rust runtime needs). Start the ranks with a launcher:
 * `braid run -n N -- prog`, Open MPI's mpirun, Slurm's srun, or by setting BRAID_RANK,
 * BRAID_SIZE and BRAID_ROOT (docs/LAUNCH.md). docs/DSM.md has the protocol, the consistency guarantee and the limits.
 *
 * Memory from braid_dsm_alloc is at the same address in every rank, so pointers into it
 * may be stored in it. Plain loads and stores are sequentially consistent across ranks,
 * page by page (4 KiB). Collectives (alloc, free, barrier, finalize) are called by one
 * thread of every rank, in the same order; locks by any thread.
 *
 * Errors: -1 (or NULL) with errno set; braid_dsm_last_error() has the message. After a
 * rank dies, every rank's next call fails with ECONNRESET; a thread blocked on a page that
 * can no longer be served ends the process with exit status 70 (see docs/DSM.md).
 */
#ifndef BRAID_DSM_H
#define BRAID_DSM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Home policies for braid_dsm_alloc_policy. */
#define BRAID_DSM_HOME_DEFAULT (-1) /* BRAID_DSM_HOME=block|cyclic, else block */
#define BRAID_DSM_HOME_BLOCK 0      /* contiguous blocks: first 1/size of the pages at rank 0, ... */
#define BRAID_DSM_HOME_CYCLIC 1     /* page i at rank i % size */

/* Exit status of a process whose page faults can no longer be served (a rank died). */
#define BRAID_DSM_EXIT_UNSERVABLE 70

int   braid_dsm_init(void);          /* 0, or -1 with errno; rank, size and rendezvous from the launcher's environment */
int   braid_dsm_rank(void);
int   braid_dsm_size(void);
void *braid_dsm_alloc(size_t bytes); /* collective: every rank calls it with the same size and gets the same address; NULL + errno on error */
void  braid_dsm_free(void *p);       /* collective */
int   braid_dsm_barrier(void);       /* 0, or -1 with errno (e.g. a rank died) */
int   braid_dsm_lock(unsigned id);   /* global locks named by number (0 .. BRAID_DSM_LOCKS-1, default 65536) */
int   braid_dsm_unlock(unsigned id);
int   braid_dsm_finalize(void);

/* Extensions. */
void       *braid_dsm_alloc_policy(size_t bytes, int policy); /* collective; policy: BRAID_DSM_HOME_* */
size_t      braid_dsm_page_size(void);                        /* the unit of coherence; 0 before init */
const char *braid_dsm_last_error(void);                       /* message of this thread's last failed call */
/* This rank's counters as one line of JSON in buf (len bytes, NUL-terminated, cut if too
 * small), like snprintf: returns the full text's length (>= len: it was cut), or -1 with
 * errno (ENXIO before init). Fields: rank, size, faults, installs, pages_sent, drops,
 * messages, requests, fault_to_request_us, request_to_grant_us, install_us, serve_us (means)
 * and rail_bytes_sent: [bytes braid sent on rail 0, 1, ...] since init. */
int         braid_dsm_stats_json(char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* BRAID_DSM_H */
