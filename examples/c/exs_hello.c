/*
 * exs_hello.c -- the ES-API in braid mode, both ends on this host: a child process accepts,
 * the parent connects, both attach the connection to braid rails (127.0.0.1 and 127.0.0.2),
 * and the parent sends 4 MiB that land straight in the buffer the child posted.
 *
 *   cc -O2 -Wall -I include examples/c/exs_hello.c -o target/exs_hello -L target/release -lexs
 *   LD_LIBRARY_PATH=target/release target/exs_hello
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/wait.h>
#include <unistd.h>

#define LEN (4 << 20)

int main(void) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    int l = socket(AF_INET, SOCK_STREAM, 0);
    if (bind(l, (struct sockaddr *)&a, alen) || listen(l, 1) || getsockname(l, (struct sockaddr *)&a, &alen))
        return perror("listen"), 1;
    pid_t child = fork();
    if (child < 0) return perror("fork"), 1;
    int fd = child ? socket(AF_INET, SOCK_STREAM, 0) : accept(l, NULL, NULL);
    if (child && connect(fd, (struct sockaddr *)&a, alen)) return perror("connect"), 1;

    /* The TCP connection only bootstraps: the data goes over one braid rail per address. */
    exs_init(EXS_VERSION);
    if (exs_braid_attach(fd, "127.0.0.1,127.0.0.2", child ? EXS_BRAID_CONNECT : EXS_BRAID_ACCEPT))
        return perror("exs_braid_attach"), 1;
    exs_qhandle_t q = exs_qcreate(4);
    char *buf = malloc(LEN);
    exs_mhandle_t mh = exs_mregister(buf, LEN, 0);
    if (child) memset(buf, 'b', LEN);
    int r = child ? exs_send(fd, buf, LEN, 0, q, NULL, mh) /* done once placed in the peer's buffer */
                  : exs_recv(fd, buf, LEN, MSG_WAITALL, q, NULL, mh);
    exs_event_t ev = {0};
    struct timespec limit = {30, 0};
    if (r != 0 || exs_qdequeue(q, &ev, 1, &limit) != 1 || ev.ev_result != LEN)
        return fprintf(stderr, "exs_hello: %s: %s\n", child ? "send" : "recv", strerror(r ? errno : ev.ev_errno)), 1;
    if (!child) return buf[0] == 'b' && buf[LEN - 1] == 'b' ? 0 : 1;
    int status;
    waitpid(child, &status, 0);
    printf("exs_hello: %d bytes over braid rails, child %s\n", LEN, status == 0 ? "ok" : "FAILED");
    return status != 0;
}
