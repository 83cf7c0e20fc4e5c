/*
 * exs_stream.c -- ES-API stream examples on loopback (127.0.0.1 only).
 *
 *   exs_stream recv-plain PORTFILE BYTES   plain recv() receiver (for send-exs)
 *   exs_stream recv-exs   PORTFILE BYTES   exs_recv() receiver   (for send-plain)
 *   exs_stream send-exs   PORT BYTES       asynchronous exs_send() sender, several sends in
 *                                          flight, EAGAIN handled by dequeuing
 *   exs_stream send-plain PORT BYTES       plain send() sender
 *
 * Receivers listen on an ephemeral port, write it to PORTFILE, accept one connection and
 * read until the peer closes; they check the byte count and an FNV-1a checksum of the
 * generated pattern and exit nonzero on mismatch.
 *
 * Build: cc -O2 -Wall examples/c/exs_stream.c -o exs_stream $(pkg-config --cflags --libs exs)
 *        (after scripts/install.sh PREFIX; examples/c/run.sh shows a temporary prefix)
 */
#include <errno.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sys/exs.h>

#define CHUNK (256 * 1024)
#define INFLIGHT 4

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

static void fill(uint8_t *p, size_t n, uint64_t off) {
    for (size_t i = 0; i < n; i++) p[i] = pattern_byte(off + i);
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

static const struct timespec TEN_S = {10, 0};

static int listen_and_accept(const char *portfile) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    if (l < 0) die("socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
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
    return s;
}

static int connect_to(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) die("socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    return s;
}

static int check(const char *who, uint64_t got, uint64_t sum, uint64_t total) {
    uint64_t want = expected_sum(total);
    if (got != total || sum != want) {
        fprintf(stderr, "%s: MISMATCH: %llu bytes (want %llu), fnv1a %016llx (want %016llx)\n", who,
                (unsigned long long)got, (unsigned long long)total, (unsigned long long)sum,
                (unsigned long long)want);
        return 1;
    }
    printf("%s: %llu bytes, fnv1a %016llx ok\n", who, (unsigned long long)got, (unsigned long long)sum);
    return 0;
}

/* (a) plain recv() receiver. */
static int recv_plain(const char *portfile, uint64_t total) {
    int s = listen_and_accept(portfile);
    static uint8_t buf[1 << 16];
    uint64_t got = 0, h = 0xcbf29ce484222325ull;
    for (;;) {
        ssize_t n = recv(s, buf, sizeof buf, 0);
        if (n < 0) die("recv");
        if (n == 0) break;
        h = fnv1a(h, buf, (size_t)n);
        got += (uint64_t)n;
    }
    close(s);
    return check("recv-plain", got, h, total);
}

/* (a) asynchronous exs_send() sender: INFLIGHT registered chunks, queue depth INFLIGHT/2 so
 * that EAGAIN flow control is exercised. */
static int send_exs(int port, uint64_t total) {
    if (exs_init(EXS_VERSION) < 0) die("exs_init");
    int s = connect_to(port);
    exs_qhandle_t q = exs_qcreate(INFLIGHT / 2);
    if (q == EXS_QHANDLE_INVALID) die("exs_qcreate");
    uint8_t *mem = malloc((size_t)CHUNK * INFLIGHT);
    if (!mem) die("malloc");
    exs_mhandle_t mh = exs_mregister(mem, (size_t)CHUNK * INFLIGHT, 0);
    if (mh == EXS_MHANDLE_INVALID) die("exs_mregister");
    int free_slots[INFLIGHT], nfree = INFLIGHT;
    for (int i = 0; i < INFLIGHT; i++) free_slots[i] = i;
    uint64_t off = 0, done = 0;
    long eagain = 0;
    int inflight = 0;
    while (done < total) {
        if (off < total && nfree > 0) {
            int slot = free_slots[nfree - 1];
            size_t n = total - off < CHUNK ? (size_t)(total - off) : CHUNK;
            uint8_t *p = mem + (size_t)slot * CHUNK;
            fill(p, n, off);
            if (exs_send(s, p, n, 0, q, (exs_ahandle_t)(intptr_t)slot, mh) == 0) {
                nfree--;
                inflight++;
                off += n;
                continue;
            }
            if (errno != EAGAIN) die("exs_send");
            eagain++;
        }
        exs_event_t ev[INFLIGHT];
        int k = exs_qdequeue(q, ev, INFLIGHT, &TEN_S);
        if (k < 0) die("exs_qdequeue");
        if (k == 0) {
            fprintf(stderr, "send-exs: no event in 10 s\n");
            return 1;
        }
        for (int i = 0; i < k; i++) {
            if (ev[i].ev_type != EXS_EVT_SEND || ev[i].ev_result < 0) {
                fprintf(stderr, "send-exs: bad event type %d result %zd errno %d\n", ev[i].ev_type,
                        ev[i].ev_result, ev[i].ev_errno);
                return 1;
            }
            if ((size_t)ev[i].ev_result != ev[i].ev_u.xfer.xf_len) {
                fprintf(stderr, "send-exs: short send event\n");
                return 1;
            }
            done += (uint64_t)ev[i].ev_result;
            free_slots[nfree++] = (int)(intptr_t)ev[i].ev_ahandle;
            inflight--;
        }
    }
    printf("send-exs: %llu bytes sent, %ld EAGAIN retries\n", (unsigned long long)done, eagain);
    if (exs_mderegister(mh) < 0) die("exs_mderegister");
    if (exs_qdelete(q) < 0) die("exs_qdelete");
    free(mem);
    close(s);
    return inflight == 0 ? 0 : 1;
}

/* (b) plain send() sender. */
static int send_plain(int port, uint64_t total) {
    int s = connect_to(port);
    static uint8_t buf[1 << 16];
    for (uint64_t off = 0; off < total;) {
        size_t n = total - off < sizeof buf ? (size_t)(total - off) : sizeof buf;
        fill(buf, n, off);
        for (size_t d = 0; d < n;) {
            ssize_t k = send(s, buf + d, n - d, MSG_NOSIGNAL);
            if (k < 0) die("send");
            d += (size_t)k;
        }
        off += n;
    }
    close(s);
    printf("send-plain: %llu bytes sent\n", (unsigned long long)total);
    return 0;
}

/* (b) exs_recv() receiver: two receives in flight into two halves of one registration
 * (they complete in order), until a 0-byte event says the peer closed. */
static int recv_exs(const char *portfile, uint64_t total) {
    if (exs_init(EXS_VERSION) < 0) die("exs_init");
    int s = listen_and_accept(portfile);
    exs_qhandle_t q = exs_qcreate(2);
    uint8_t *mem = malloc(2 * CHUNK);
    exs_mhandle_t mh = exs_mregister(mem, 2 * CHUNK, 0);
    if (q == EXS_QHANDLE_INVALID || !mem || mh == EXS_MHANDLE_INVALID) die("setup");
    for (int i = 0; i < 2; i++)
        if (exs_recv(s, mem + (size_t)i * CHUNK, CHUNK, 0, q, (exs_ahandle_t)(intptr_t)i, mh) < 0) die("exs_recv");
    uint64_t got = 0, h = 0xcbf29ce484222325ull;
    int eof = 0, pending = 2;
    while (pending > 0) {
        exs_event_t ev;
        int k = exs_qdequeue(q, &ev, 1, &TEN_S);
        if (k <= 0) {
            fprintf(stderr, "recv-exs: no event in 10 s (%d)\n", k);
            return 1;
        }
        pending--;
        if (ev.ev_type != EXS_EVT_RECV || ev.ev_result < 0) {
            fprintf(stderr, "recv-exs: error event errno %d\n", ev.ev_errno);
            return 1;
        }
        if (ev.ev_result == 0) {
            eof = 1;
            continue;
        }
        h = fnv1a(h, ev.ev_u.xfer.xf_buf, (size_t)ev.ev_result);
        got += (uint64_t)ev.ev_result;
        if (!eof) {
            if (exs_recv(s, ev.ev_u.xfer.xf_buf, CHUNK, 0, q, ev.ev_ahandle, mh) < 0) die("exs_recv");
            pending++;
        }
    }
    exs_mderegister(mh);
    exs_qdelete(q);
    free(mem);
    close(s);
    return check("recv-exs", got, h, total);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s recv-plain|recv-exs PORTFILE BYTES | send-exs|send-plain PORT BYTES\n", argv[0]);
        return 2;
    }
    uint64_t total = strtoull(argv[3], NULL, 0);
    if (!strcmp(argv[1], "recv-plain")) return recv_plain(argv[2], total);
    if (!strcmp(argv[1], "recv-exs")) return recv_exs(argv[2], total);
    if (!strcmp(argv[1], "send-exs")) return send_exs(atoi(argv[2]), total);
    if (!strcmp(argv[1], "send-plain")) return send_plain(atoi(argv[2]), total);
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
}
