/*
 * exs_braid.c -- an ES-API stream in braid mode: the same exs_send/exs_recv calls, the
 * bytes striped over several rails and written straight into the receiver's buffers.
 *
 *   exs_braid recv PORTFILE BYTES [BIND_IP]   listen on BIND_IP (default 127.0.0.1), write the
 *                                             port to PORTFILE, accept, attach as the
 *                                             accepting side, receive until end of stream
 *   exs_braid send IP PORT BYTES              connect, attach as the connecting side, send
 *                                             BYTES with several sends in flight, close
 *
 * How braid mode is chosen: an ordinary TCP connection is made first (the bootstrap
 * socket), then both ends call exs_braid_attach() on it. The rails come from the
 * environment (rails argument NULL):
 *   receiver: EXS_BRAID_LISTEN="127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4"  (its rail IPs)
 *   sender:   EXS_BRAID_RAILS="127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4"   (its rail IPs)
 * Unset, one rail is used, between the bootstrap addresses.
 *
 * Both check the byte count; the receiver also checks an FNV-1a checksum of the pattern.
 * Exit status 0 on success.
 *
 * Build: cc -O2 -Wall examples/c/exs_braid.c -o exs_braid $(pkg-config --cflags --libs exs)
 *        (after scripts/install.sh PREFIX; examples/c/run.sh shows a temporary prefix)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <sys/exs.h>

#define CHUNK (4 * 1024 * 1024)
#define MAX_INFLIGHT 64
/* Operations in flight on each side: env EXS_BRAID_DEPTH (default 8, at most 64). */
static int depth(void) {
    const char *e = getenv("EXS_BRAID_DEPTH");
    int d = e ? atoi(e) : 8;
    return d < 1 ? 1 : d > MAX_INFLIGHT ? MAX_INFLIGHT : d;
}

static uint8_t pattern_byte(uint64_t i) { return (uint8_t)((i * 2654435761u) >> 13); }

static uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t expected_sum(uint64_t total) {
    uint64_t h = 0xcbf29ce484222325ull;
    uint8_t buf[4096];
    for (uint64_t off = 0; off < total;) {
        size_t n = total - off < sizeof buf ? (size_t)(total - off) : sizeof buf;
        for (size_t i = 0; i < n; i++) buf[i] = pattern_byte(off + i);
        h = fnv1a(h, buf, n);
        off += n;
    }
    return h;
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

static const struct timespec TEN_S = {10, 0};

/* EXS_BRAID_NOVERIFY=1: throughput only (no pattern, no checksum; byte count still checked),
 * so that a 2-core machine measures the transport rather than the checksum loop. */
static int verify(void) {
    const char *e = getenv("EXS_BRAID_NOVERIFY");
    return !(e && *e && strcmp(e, "0"));
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* CPU seconds of the whole process (application, exs-braid and braid engine threads). */
static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static int recv_side(const char *portfile, uint64_t total, const char *ip) {
    if (exs_init(EXS_VERSION) < 0) die("exs_init");
    int l = socket(AF_INET, SOCK_STREAM, 0);
    if (l < 0) die("socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
        fprintf(stderr, "bad address %s\n", ip);
        return 2;
    }
    if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 1) < 0) die("bind/listen");
    socklen_t len = sizeof a;
    if (getsockname(l, (struct sockaddr *)&a, &len) < 0) die("getsockname");
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", portfile);
    FILE *f = fopen(tmp, "w");
    if (!f) die("portfile");
    fprintf(f, "%d\n", ntohs(a.sin_port));
    fclose(f);
    if (rename(tmp, portfile) < 0) die("rename");
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    close(l);

    /* Braid mode: listen on the rail addresses of EXS_BRAID_LISTEN. */
    if (exs_braid_attach(s, NULL, EXS_BRAID_ACCEPT) < 0) die("exs_braid_attach");

    double c0 = cpu_s();
    const int RECV_INFLIGHT = depth();
    exs_qhandle_t q = exs_qcreate(RECV_INFLIGHT);
    uint8_t *mem = malloc((size_t)CHUNK * RECV_INFLIGHT);
    if (q == EXS_QHANDLE_INVALID || !mem) die("setup");
    exs_mhandle_t mh = exs_mregister(mem, (size_t)CHUNK * RECV_INFLIGHT, 0);
    if (mh == EXS_MHANDLE_INVALID) die("exs_mregister");
    /* Several receives in flight: each is advertised to the sender, which writes into it
     * directly; they complete in posting order, so the checksum runs in stream order. */
    for (int i = 0; i < RECV_INFLIGHT; i++)
        if (exs_recv(s, mem + (size_t)i * CHUNK, CHUNK, 0, q, (exs_ahandle_t)(intptr_t)i, mh) < 0)
            die("exs_recv");
    uint64_t got = 0, h = 0xcbf29ce484222325ull;
    int eof = 0, pending = RECV_INFLIGHT, check = verify();
    while (pending > 0) {
        exs_event_t ev[MAX_INFLIGHT];
        int k = exs_qdequeue(q, ev, RECV_INFLIGHT, &TEN_S);
        if (k <= 0) {
            fprintf(stderr, "recv: no event in 10 s (%d)\n", k);
            return 1;
        }
        for (int i = 0; i < k; i++) {
            pending--;
            if (ev[i].ev_type != EXS_EVT_RECV || ev[i].ev_result < 0) {
                fprintf(stderr, "recv: error event: %s\n", strerror(ev[i].ev_errno));
                return 1;
            }
            if (ev[i].ev_result == 0) {
                eof = 1;
                continue;
            }
            if (check) h = fnv1a(h, ev[i].ev_u.xfer.xf_buf, (size_t)ev[i].ev_result);
            got += (uint64_t)ev[i].ev_result;
            if (!eof) {
                if (exs_recv(s, ev[i].ev_u.xfer.xf_buf, CHUNK, 0, q, ev[i].ev_ahandle, mh) < 0)
                    die("exs_recv");
                pending++;
            }
        }
    }
    double cpu = cpu_s() - c0;
    exs_mderegister(mh);
    exs_qdelete(q);
    free(mem);
    close(s);
    uint64_t want = check ? expected_sum(total) : h;
    if (got != total || h != want) {
        fprintf(stderr, "recv: MISMATCH: %llu bytes (want %llu), fnv1a %016llx (want %016llx)\n",
                (unsigned long long)got, (unsigned long long)total, (unsigned long long)h,
                (unsigned long long)want);
        return 1;
    }
    if (check)
        printf("recv (braid mode): %llu bytes, fnv1a %016llx ok, %.3f CPU s/GB\n",
               (unsigned long long)got, (unsigned long long)h, got ? cpu / ((double)got / 1e9) : 0.0);
    else
        printf("recv (braid mode): %llu bytes ok (not verified), %.3f CPU s/GB\n",
               (unsigned long long)got, got ? cpu / ((double)got / 1e9) : 0.0);
    return 0;
}

static int send_side(const char *ip, int port, uint64_t total) {
    if (exs_init(EXS_VERSION) < 0) die("exs_init");
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) die("socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
        fprintf(stderr, "bad address %s\n", ip);
        return 2;
    }
    if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) die("connect");

    /* Braid mode: one rail from each IP of EXS_BRAID_RAILS to the receiver's addresses. */
    if (exs_braid_attach(s, NULL, EXS_BRAID_CONNECT) < 0) die("exs_braid_attach");

    /* Queue depth below the sends we could have in flight: EAGAIN is flow control. */
    const int SEND_INFLIGHT = depth() + 1;
    exs_qhandle_t q = exs_qcreate(SEND_INFLIGHT - 1);
    uint8_t *mem = malloc((size_t)CHUNK * SEND_INFLIGHT);
    if (q == EXS_QHANDLE_INVALID || !mem) die("setup");
    exs_mhandle_t mh = exs_mregister(mem, (size_t)CHUNK * SEND_INFLIGHT, 0);
    if (mh == EXS_MHANDLE_INVALID) die("exs_mregister");
    int free_slots[MAX_INFLIGHT + 1], nfree = SEND_INFLIGHT;
    for (int i = 0; i < SEND_INFLIGHT; i++) free_slots[i] = i;
    uint64_t off = 0, done = 0;
    long eagain = 0;
    int check = verify();
    double t0 = now_s(), c0 = cpu_s();
    while (done < total) {
        if (off < total && nfree > 0) {
            int slot = free_slots[nfree - 1];
            /* Odd sizes on purpose: sends and receives do not line up. */
            size_t n = CHUNK - 4093;
            if (total - off < n) n = (size_t)(total - off);
            uint8_t *p = mem + (size_t)slot * CHUNK;
            if (check)
                for (size_t i = 0; i < n; i++) p[i] = pattern_byte(off + i);
            if (exs_send(s, p, n, 0, q, (exs_ahandle_t)(intptr_t)slot, mh) == 0) {
                nfree--;
                off += n;
                continue;
            }
            if (errno != EAGAIN) die("exs_send");
            eagain++;
        }
        exs_event_t ev[MAX_INFLIGHT + 1];
        int k = exs_qdequeue(q, ev, SEND_INFLIGHT, &TEN_S);
        if (k <= 0) {
            fprintf(stderr, "send: no event in 10 s (%d)\n", k);
            return 1;
        }
        for (int i = 0; i < k; i++) {
            if (ev[i].ev_type != EXS_EVT_SEND || ev[i].ev_result < 0 ||
                (size_t)ev[i].ev_result != ev[i].ev_u.xfer.xf_len) {
                fprintf(stderr, "send: bad event: result %zd, %s\n", ev[i].ev_result,
                        strerror(ev[i].ev_errno));
                return 1;
            }
            done += (uint64_t)ev[i].ev_result;
            free_slots[nfree++] = (int)(intptr_t)ev[i].ev_ahandle;
        }
    }
    double secs = now_s() - t0, cpu = cpu_s() - c0;
    printf("send (braid mode): %llu bytes sent, %ld EAGAIN retries, %.1f MB/s, %.3f CPU s/GB\n",
           (unsigned long long)done, eagain, secs > 0 ? (double)done / secs / 1e6 : 0.0,
           done ? cpu / ((double)done / 1e9) : 0.0);
    exs_mderegister(mh);
    exs_qdelete(q);
    free(mem);
    /* End of stream, as on TCP: the receiver's pending receives complete with 0. */
    close(s);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "recv"))
        return recv_side(argv[2], strtoull(argv[3], NULL, 0), argc > 4 ? argv[4] : "127.0.0.1");
    if (argc == 5 && !strcmp(argv[1], "send"))
        return send_side(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 0));
    fprintf(stderr, "usage: %s recv PORTFILE BYTES [BIND_IP] | send IP PORT BYTES\n", argv[0]);
    return 2;
}
