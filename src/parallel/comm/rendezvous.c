#include "parallel/comm/rendezvous.h"
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "core/log.h"
#include "parallel/comm/signals.h"

#define MAGIC 0x474c4d52u /* "GLMR" */

typedef struct hello { uint32_t magic, rank, world, blob_len; } hello;

static int listen_on(int port, int backlog, glm_err *err) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return glm_fail(err, "socket: %s", strerror(errno));
    int one = 1;
    /* a port left in TIME_WAIT by the previous run is fine; one with a live listener is not */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, backlog) != 0) {
        int e = errno;
        close(fd);
        if (e == EADDRINUSE) {
            glm_fail(err, "master port %d is already in use on this machine", port);
            return glm_hint(err, "pass another --master_port (or MASTER_PORT), or leave it out on one node to get a free port");
        }
        return glm_fail(err, "cannot listen on port %d: %s", port, strerror(e));
    }
    return fd;
}

int glm_port_check(int port, glm_err *err) {
    if (port <= 0 || port > 65535) return glm_fail(err, "master port %d is not a TCP port (1..65535)", port);
    int fd = listen_on(port, 1, err);
    if (fd < 0) return -1;
    close(fd);
    return 0;
}

int glm_port_free(glm_err *err) {
    int fd = listen_on(0, 1, err);
    if (fd < 0) return -1;
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    int rc = getsockname(fd, (struct sockaddr *)&sa, &len) == 0 ? ntohs(sa.sin_port) : -1;
    close(fd);
    return rc > 0 ? rc : glm_fail(err, "no free TCP port: %s", strerror(errno));
}

/* Waits until fd is ready for `events` or the deadline passes: 1 ready, 0 timeout, -1 signal. */
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        if (glm_signal_pending()) return -1;
        double left = deadline - glm_now();
        if (left <= 0) return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, left > 0.2 ? 200 : (int)(left * 1000) + 1);
        if (r > 0) return 1;
    }
}

static int io_all(int fd, void *buf, size_t n, int sending, double deadline) {
    char *p = buf;
    while (n > 0) {
        if (wait_fd(fd, sending ? POLLOUT : POLLIN, deadline) != 1) return -1;
        ssize_t k = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int serve(int port, int world, void *blob, size_t n, double timeout, glm_err *err) {
    int lfd = listen_on(port, world, err);
    if (lfd < 0) return -1;
    int *fds = glm_malloc(sizeof(int) * (size_t)world);
    for (int r = 0; r < world; r++) fds[r] = -1;
    double deadline = glm_now() + timeout;
    int arrived = 1, rc = 0;
    while (arrived < world && rc == 0) {
        int w = wait_fd(lfd, POLLIN, deadline);
        if (w != 1) {
            char missing[256] = "";
            for (int r = 1, len = 0; r < world && len < 200; r++)
                if (fds[r] < 0) len += snprintf(missing + len, sizeof missing - (size_t)len, "%s%d", len ? ", " : "", r);
            if (w < 0) rc = glm_fail(err, "rank 0: rendezvous on port %d interrupted by %s", port, glm_signal_name(glm_signal_pending()));
            else rc = glm_fail(err, "rank 0: rendezvous on port %d timed out after %.0f s: %d of %d ranks arrived (missing: %s)",
                               port, timeout, arrived, world, missing),
                 glm_hint(err, "check that every node was started with the same --nnodes/--nproc_per_node and can reach "
                               "MASTER_ADDR:MASTER_PORT (firewall?)");
            break;
        }
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        hello h;
        if (io_all(fd, &h, sizeof h, 0, deadline) != 0 || h.magic != MAGIC) { close(fd); continue; } /* a stray client */
        if (h.world != (uint32_t)world || h.blob_len != n || h.rank == 0 || h.rank >= (uint32_t)world || fds[h.rank] >= 0) {
            close(fd);
            rc = glm_fail(err, "rank 0: rendezvous on port %d: a process says it is rank %u of %u, but this job has %d ranks%s",
                          port, h.rank, h.world, world, h.rank < (uint32_t)world && fds[h.rank] >= 0 ? " and that rank already arrived" : "");
            glm_hint(err, "another job may be using the same MASTER_PORT; give each job its own --master_port");
            break;
        }
        fds[h.rank] = fd;
        arrived++;
    }
    for (int r = 1; r < world; r++) {
        if (fds[r] < 0) continue;
        if (rc == 0 && io_all(fds[r], blob, n, 1, deadline) != 0)
            rc = glm_fail(err, "rank 0: rendezvous: sending to rank %d failed", r);
        close(fds[r]);
    }
    free(fds);
    close(lfd);
    return rc;
}

static int join(const char *addr, int port, int rank, int world, void *blob, size_t n, double timeout, glm_err *err) {
    double deadline = glm_now() + timeout;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int g = getaddrinfo(addr, portstr, &hints, &ai);
    if (g != 0) return glm_fail(err, "rank %d: cannot resolve master address %s: %s", rank, addr, gai_strerror(g));
    int rc = -1;
    /* rank 0 may not listen yet: retry connecting until the deadline */
    while (rc != 0) {
        if (glm_signal_pending()) { rc = glm_fail(err, "rank %d: rendezvous interrupted by %s", rank, glm_signal_name(glm_signal_pending())); break; }
        if (glm_now() > deadline) {
            rc = glm_fail(err, "rank %d: rendezvous with rank 0 at %s:%d timed out after %.0f s", rank, addr, port, timeout);
            glm_hint(err, "did rank 0 start? is MASTER_ADDR reachable from this node and MASTER_PORT open?");
            break;
        }
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) { rc = glm_fail(err, "socket: %s", strerror(errno)); break; }
        hello h = {MAGIC, (uint32_t)rank, (uint32_t)world, (uint32_t)n};
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 && io_all(fd, &h, sizeof h, 1, deadline) == 0 &&
            io_all(fd, blob, n, 0, deadline) == 0) {
            rc = 0;
        } else {
            struct timespec ts = {0, 100000000};
            nanosleep(&ts, NULL);
        }
        close(fd);
    }
    freeaddrinfo(ai);
    return rc;
}

int glm_rdzv_exchange(const char *addr, int port, int rank, int world, void *blob, size_t n, double timeout,
                      glm_err *err) {
    if (world <= 1) return 0;
    if (timeout <= 0) timeout = 1e9;
    return rank == 0 ? serve(port, world, blob, n, timeout, err) : join(addr, port, rank, world, blob, n, timeout, err);
}
