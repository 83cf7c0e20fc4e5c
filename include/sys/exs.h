/*
 * sys/exs.h -- the Extended Sockets API (Open Group ES-API, with UNH EXS extensions),
 * as implemented by braid-exs (libexs.so / libexs.a).
 *
 * Install: scripts/install.sh PREFIX (libexs.so.0, libexs.a, this header, exs.pc)
 * Build:   cc -O2 prog.c $(pkg-config --cflags --libs exs)
 *          (a PREFIX outside the loader's path: add -Wl,-rpath,PREFIX/lib)
 * Static:  cc -O2 prog.c $(pkg-config --cflags exs) \
 *              $(pkg-config --static --libs exs | sed 's/-lexs/-l:libexs.a/')
 *
 * Model
 * -----
 * A stream socket made with socket()/connect()/accept() is used with the exs_* calls,
 * while the peer may be any program using plain send()/recv(). Operations are
 * asynchronous: a call queues the operation and returns 0; when it completes, an event
 * (exs_event_t) is posted to the event queue named in the call and is collected with
 * exs_qdequeue(). A buffer belongs to the library from the call until its event is
 * dequeued: do not touch or free it meanwhile.
 *
 * Ordering: operations of one socket complete in order per direction: sends of one socket
 * never interleave their bytes (a short kernel send is finished before the next send of
 * that socket starts), and receives complete in posting order.
 *
 * Flow control: every queue has a depth (exs_qcreate). Operations outstanding on a queue
 * plus its events not yet dequeued never exceed the depth; one socket never has more
 * than EXS_SOCK_OUTSTANDING_MAX operations outstanding. Past either bound a call fails
 * with -1/EAGAIN: dequeue events, then retry.
 *
 * Errors: calls return -1 and set errno: EBADF (fd is not an open descriptor), ENOTSOCK,
 * EOPNOTSUPP (send/recv on a socket that is not SOCK_STREAM), EINVAL (bad queue or memory
 * handle -- including a deregistered one --, a buffer not inside its registration, bad
 * flags, zero-length receive, bad count), EFAULT (NULL pointers), EAGAIN (flow control),
 * EBUSY (deleting a queue or registration still in use). Errors of the operation itself
 * (ECONNRESET, EPIPE, ...) arrive in its event: ev_result == -1, ev_errno set. A peer that
 * closed gives a RECV event with ev_result == 0; never a hang.
 *
 * Closing: before close()ing a socket with operations outstanding, shutdown() it (which
 * completes pending receives with 0 bytes or an error) and dequeue their events.
 *
 * Threads: all calls are thread-safe. The library runs one internal progress thread
 * ("exs-progress") that owns an io_uring.
 *
 * braid mode (extension)
 * ----------------------
 * When both ends use this library, a socket can instead ride a braid endpoint striped over
 * several TCP "rails" (one per NIC), the sender writing straight into the buffers the
 * receiver posted with exs_recv(). A program chooses it per socket: make an ordinary TCP
 * connection (socket/connect on one side, accept on the other: the *bootstrap* socket),
 * then call exs_braid_attach() on it at both ends, EXS_BRAID_CONNECT on the connecting side
 * and EXS_BRAID_ACCEPT on the accepting side. Afterwards exs_send/exs_recv/exs_sendv/
 * exs_recvv on that descriptor (the same number, not a dup) go over braid, with the same
 * events, ordering and flow control; exs_poll/exs_connect/exs_accept still act on the
 * bootstrap socket. Without exs_braid_attach() a socket stays in plain-socket mode.
 *
 *   Stream semantics: a receive completes when the sender's queued bytes run out or its
 *   buffer is full (MSG_WAITALL: only when full, or at end of stream); one send may fill
 *   several receives and, while more sends are queued, one receive takes bytes of several
 *   sends. A send completes when every byte is placed in the peer's memory.
 *   End of stream: shutdown(fd, SHUT_WR) or close(fd) on the bootstrap socket; the peer's
 *   receives then complete with 0 after every byte sent before. A peer that vanishes
 *   (process killed, rail reset) fails pending and later operations: receives with
 *   ECONNRESET, sends with EPIPE. Do not read or write the bootstrap socket yourself.
 */
#ifndef _SYS_EXS_H
#define _SYS_EXS_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

/** ES-API version 1. */
#define EXS_VERSION1 1
/** The ES-API version implemented by this library. */
#define EXS_VERSION EXS_VERSION1

/** Event queue handle. */
typedef int exs_qhandle_t;
/** Memory registration handle. */
typedef int exs_mhandle_t;
/** Application handle: any pointer-sized value, returned unchanged in the event. */
typedef void *exs_ahandle_t;

/** Returned by exs_qcreate() on error. */
#define EXS_QHANDLE_INVALID (-1)
/** Returned by exs_mregister() on error. */
#define EXS_MHANDLE_INVALID (-1)
/** UNH EXS extension: pass as the memory handle of a buffer that was not registered. */
#define EXS_MHANDLE_UNREGISTERED (-2)

/** exs_mregister() flag: the region may be used by several sockets and queues at once
 *  (always true in this implementation; accepted for portability). */
#define EXS_MRF_SHARED 0x1

/** UNH EXS extension (synchronous mode), OR-ed into the flags of exs_send(), exs_recv(),
 *  exs_sendv(), exs_recvv(): the call returns only when the operation completed. It then
 *  returns the number of bytes moved (clamped to INT_MAX; the exact count is in the event),
 *  or -1 with errno set to the operation's error. The event is STILL posted to the queue
 *  (and occupies a slot of its depth until dequeued). Not usable from inside the library's
 *  own callbacks (EDEADLK). */
#define EXS_MSG_SYNC 0x10000000
/** Alias of EXS_MSG_SYNC. */
#define MSG_EXS_SYNC EXS_MSG_SYNC

/** Most iovecs in one exs_sendv()/exs_recvv(). */
#define EXS_IOV_MAX 64
/** Most operations outstanding on one socket; beyond, calls fail with EAGAIN. */
#define EXS_SOCK_OUTSTANDING_MAX 256
/** Largest queue depth accepted by exs_qcreate(). */
#define EXS_QDEPTH_MAX 65536
/** Most events one exs_qdequeue() can return. */
#define EXS_EVTVEC_MAX EXS_QDEPTH_MAX

/** exs_poll() event bits (same values as POLLIN / POLLOUT). */
#define EXS_POLLIN 0x001
#define EXS_POLLOUT 0x004

/** exs_braid_attach() flags (braid extension): which side of the bootstrap socket. */
#define EXS_BRAID_CONNECT 0x1 /**< this side connect()ed: it opens the rails. */
#define EXS_BRAID_ACCEPT 0x2  /**< this side accept()ed: it listens for the rails. */

/** exs_cancel() flags. */
#define EXS_CAF_FILDES 0x1
#define EXS_CAF_AHANDLE 0x2

/** Event types (exs_event_t.ev_type). */
#define EXS_EVT_POLL 1        /**< exs_poll() completed: ev_result = revents. */
#define EXS_EVT_CONNECT 2     /**< exs_connect() completed: ev_result = 0. */
#define EXS_EVT_ACCEPT 3      /**< exs_accept() completed: ev_result = the new socket. */
#define EXS_EVT_SEND 4        /**< exs_send() completed: ev_result = bytes sent. */
#define EXS_EVT_RECV 5        /**< exs_recv() completed: ev_result = bytes received, 0 = peer closed. */
#define EXS_EVT_SENDMSG 6     /**< exs_sendv() completed. */
#define EXS_EVT_RECVMSG 7     /**< exs_recvv() completed. */
#define EXS_EVT_SENDFILE 8    /**< Reserved. */
#define EXS_EVT_SENDTIMEOUT 9 /**< Reserved. */
#define EXS_EVT_RECVTIMEOUT 10 /**< Reserved. */
#define EXS_EVT_SHUTDOWN 11   /**< Reserved. */
#define EXS_EVT_CLOSE 12      /**< Reserved. */

/** Body of SEND, RECV, SENDMSG and RECVMSG events. */
typedef struct exs_evt_xfer {
    void  *xf_buf;    /**< The buffer passed (first iovec's base for the vector forms). */
    size_t xf_len;    /**< Bytes requested (sum of the iovecs for the vector forms). */
    int    xf_flags;  /**< Flags as passed. */
    int    xf_iovcnt; /**< Number of iovecs (1 for exs_send/exs_recv). */
} exs_evt_xfer_t;

/** Body of ACCEPT events. */
typedef struct exs_evt_accept {
    int                     ac_fd;      /**< The new socket, or -1 on error. */
    socklen_t               ac_addrlen; /**< Length of ac_addr. */
    struct sockaddr_storage ac_addr;    /**< The peer's address. */
} exs_evt_accept_t;

/** Body of POLL events. */
typedef struct exs_evt_poll {
    short po_events;  /**< Events asked for. */
    short po_revents; /**< Events that occurred. */
} exs_evt_poll_t;

/** A completion event. The common fields come first; ev_u holds the per-kind body. */
typedef struct exs_event {
    int           ev_type;    /**< EXS_EVT_*. */
    int           ev_fd;      /**< The socket the operation was on. */
    exs_ahandle_t ev_ahandle; /**< The application handle given with the operation. */
    ssize_t       ev_result;  /**< >= 0: bytes moved (SEND/RECV), new fd (ACCEPT),
                                   revents (POLL), 0 (CONNECT); -1: failed, see ev_errno. */
    int           ev_errno;   /**< 0 on success, else the error number (ECONNRESET, ...). */
    int           ev_flags;   /**< Reserved, 0. */
    union {
        exs_evt_xfer_t   xfer;   /**< SEND, RECV, SENDMSG, RECVMSG. */
        exs_evt_accept_t accept; /**< ACCEPT. */
        exs_evt_poll_t   poll;   /**< POLL. */
    } ev_u;
} exs_event_t;

/** An I/O vector with its own memory handle (or EXS_MHANDLE_UNREGISTERED). */
typedef struct exs_iovec {
    void         *iov_base;    /**< Start of the buffer. */
    size_t        iov_len;     /**< Its length. */
    exs_mhandle_t iov_mhandle; /**< Registration containing it, or EXS_MHANDLE_UNREGISTERED. */
} exs_iovec_t;

/**
 * Initialise the library (starts its progress thread and io_uring). Call once before the
 * other calls (they also initialise on first use; calling again is harmless).
 * @param version EXS_VERSION (or any version >= EXS_VERSION1).
 * @return the version in use (EXS_VERSION1), or -1 with errno: EINVAL (version < 1),
 *         ENOSYS or another error if io_uring is unavailable.
 */
int exs_init(int version);

/**
 * Create an event queue.
 * @param depth 1..EXS_QDEPTH_MAX: the most operations outstanding on this queue plus
 *        events not yet dequeued (beyond: EAGAIN from the calls that target the queue).
 * @return a queue handle, or EXS_QHANDLE_INVALID with errno (EINVAL, ENOMEM).
 */
exs_qhandle_t exs_qcreate(int depth);

/**
 * Delete an event queue. Events not yet dequeued are discarded.
 * @return 0, or -1 with errno: EINVAL (bad handle), EBUSY (operations still outstanding
 *         on it). Threads waiting in exs_qdequeue() on it return -1/EINVAL.
 */
int exs_qdelete(exs_qhandle_t q);

/**
 * Collect events.
 *  - count > 0: returns 1..count events, waiting up to *timeout only while none is ready;
 *  - count < 0: waits until -count events are ready and returns exactly -count
 *    (-count must not exceed the queue's depth: EINVAL);
 *  - count == 0: returns 0 at once.
 * Never more than |count| events; events come in completion order.
 * @param events room for |count| events.
 * @param timeout NULL: wait without limit; {0,0}: do not wait.
 * @return the number of events; 0 when the timeout expired first (the events of a
 *         count < 0 call stay queued then) -- a timeout is NOT an error; or -1 with errno:
 *         EINVAL (bad handle, bad timeout, queue deleted meanwhile), EFAULT (events NULL).
 */
int exs_qdequeue(exs_qhandle_t q, exs_event_t *events, int count,
                 const struct timespec *timeout);

/**
 * Register memory for use with the exs_send/recv calls. The pages are pinned once (an
 * io_uring fixed buffer) so sends from them can be zero-copy.
 * @param flags 0 or EXS_MRF_SHARED.
 * @return a memory handle, or EXS_MHANDLE_INVALID with errno: EINVAL (NULL, 0 length,
 *         bad flags), EFAULT (memory not mapped), ENOMEM.
 */
exs_mhandle_t exs_mregister(void *addr, size_t len, int flags);

/**
 * Deregister memory. The handle becomes invalid (later use: EINVAL).
 * @return 0, or -1 with errno: EINVAL (bad handle), EBUSY (operations in flight use it).
 */
int exs_mderegister(exs_mhandle_t mh);

/**
 * Send len bytes from buf on the stream socket fd, asynchronously. Completes (event
 * EXS_EVT_SEND, ev_result = len) when all bytes were handed to the kernel, or with an
 * error event (EPIPE, ECONNRESET, ...).
 * @param flags 0 or MSG_MORE, MSG_EOR, MSG_OOB, MSG_DONTROUTE, MSG_CONFIRM, MSG_NOSIGNAL
 *        (always implied), EXS_MSG_SYNC. Others: EINVAL.
 * @param q  the queue that receives the event.
 * @param ah returned unchanged in the event.
 * @param mh the registration that contains [buf, buf+len), or EXS_MHANDLE_UNREGISTERED.
 * @return 0 when queued (with EXS_MSG_SYNC: the byte count); -1 with errno: EAGAIN (flow
 *         control: dequeue, retry), EBADF, ENOTSOCK, EOPNOTSUPP, EINVAL, EFAULT.
 */
int exs_send(int fd, void *buf, size_t len, int flags, exs_qhandle_t q, exs_ahandle_t ah,
             exs_mhandle_t mh);

/**
 * Receive into buf from the stream socket fd, asynchronously (like recv()): completes
 * (EXS_EVT_RECV) when at least one byte arrived, with ev_result = bytes received; with
 * MSG_WAITALL only when the whole buffer is filled or the stream ended. ev_result == 0:
 * the peer closed.
 * @param flags 0 or MSG_WAITALL, MSG_OOB, EXS_MSG_SYNC. Others: EINVAL.
 * @param mh the registration that contains [buf, buf+len), or EXS_MHANDLE_UNREGISTERED.
 * @return as exs_send(); len == 0 is EINVAL.
 */
int exs_recv(int fd, void *buf, size_t len, int flags, exs_qhandle_t q, exs_ahandle_t ah,
             exs_mhandle_t mh);

/**
 * Gather-send iovcnt (1..EXS_IOV_MAX) buffers, each with its own memory handle, as one
 * operation (event EXS_EVT_SENDMSG, ev_result = total bytes). The iovec array itself is
 * copied before the call returns; the buffers belong to the library until the event.
 * @return as exs_send().
 */
int exs_sendv(int fd, const exs_iovec_t *iov, int iovcnt, int flags, exs_qhandle_t q,
              exs_ahandle_t ah);

/**
 * Scatter-receive into iovcnt buffers (event EXS_EVT_RECVMSG); semantics as exs_recv().
 * @return as exs_recv().
 */
int exs_recvv(int fd, const exs_iovec_t *iov, int iovcnt, int flags, exs_qhandle_t q,
              exs_ahandle_t ah);

/**
 * Connect the socket fd asynchronously (event EXS_EVT_CONNECT; ev_result 0, or -1 with
 * ev_errno such as ECONNREFUSED). The address is copied before the call returns.
 * @return 0 when queued, or -1 with errno (EBADF, ENOTSOCK, EINVAL, EFAULT, EAGAIN).
 */
int exs_connect(int fd, const struct sockaddr *addr, socklen_t addrlen, exs_qhandle_t q,
                exs_ahandle_t ah);

/**
 * Accept a connection on the listening socket fd asynchronously (event EXS_EVT_ACCEPT;
 * ev_result and ev_u.accept.ac_fd = the new socket (close-on-exec), ev_u.accept.ac_addr =
 * the peer's address). Several accepts may be outstanding.
 * @return 0 when queued, or -1 with errno (EBADF, ENOTSOCK, EINVAL, EAGAIN).
 */
int exs_accept(int fd, exs_qhandle_t q, exs_ahandle_t ah);

/**
 * Wait asynchronously for poll events on fd (one-shot; event EXS_EVT_POLL, ev_result and
 * ev_u.poll.po_revents = the events that occurred).
 * @param events EXS_POLLIN, EXS_POLLOUT (any poll(2) bits); 0 is EINVAL.
 * @return 0 when queued, or -1 with errno.
 */
int exs_poll(int fd, short events, exs_qhandle_t q, exs_ahandle_t ah);

/**
 * Cancel outstanding operations (by fd with EXS_CAF_FILDES, by application handle with
 * EXS_CAF_AHANDLE). NOT IMPLEMENTED YET: always returns -1 with errno ENOSYS. To abort a
 * socket's operations, shutdown(fd, SHUT_RDWR) it and dequeue their events.
 */
int exs_cancel(int fd, exs_ahandle_t ah, int flags);

/**
 * braid extension: put the connected stream socket fd (the bootstrap connection) in braid
 * mode; both ends call it. Blocks for the exchange with the peer over fd (at most 15 s).
 *
 * flags: exactly one of EXS_BRAID_CONNECT (the side that called connect()) and
 * EXS_BRAID_ACCEPT (the side that accept()ed).
 *
 * rails, connecting side: comma-separated entries, one per rail, each either LOCAL (a rail
 *   from this local IP to the accepting side's next listening address) or
 *   LOCAL=REMOTE:PORT (to an explicit address). NULL: the environment variable
 *   EXS_BRAID_RAILS; NULL or empty and the variable unset or empty: one rail to each
 *   address the accepting side listens on.
 * rails, accepting side: comma-separated ADDR (an ephemeral port) or ADDR:PORT
 *   ([ADDR]:PORT for IPv6), one per rail; these are sent to the connecting side over fd.
 *   NULL: EXS_BRAID_LISTEN; NULL or empty and the variable unset or empty: the local
 *   address of fd (one rail).
 *   Example, 4 NICs: accepting side "198.18.0.2,198.18.1.2,198.18.2.2,198.18.3.2",
 *   connecting side "198.18.0.1,198.18.1.1,198.18.2.1,198.18.3.1".
 *
 * Returns 0, or -1 with errno: EINVAL (flags, malformed rails), EBADF, ENOTSOCK,
 * EOPNOTSUPP (not a TCP stream socket), ENOTCONN, EBUSY (operations outstanding on fd),
 * EISCONN (already attached), ETIMEDOUT (the peer did not take part in time), EPROTO (the
 * peer does not speak the exchange, or the rails that arrived are not the peer's),
 * ECONNREFUSED (the other side could not set up its rails) or the error of a rail's
 * connect()/bind()/listen().
 */
int exs_braid_attach(int fd, const char *rails, int flags);

#ifdef __cplusplus
}
#endif

#endif /* _SYS_EXS_H */
