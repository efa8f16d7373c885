#include "parallel/comm/signals.h"
#include <signal.h>
#include <string.h>

/* The last signal in the low 8 bits, how many arrived above them (the launcher escalates on
 * the second). One int so the handler stays a single async-signal-safe store. */
static volatile sig_atomic_t pending_signal;

static void on_signal(int sig) { pending_signal = (((pending_signal >> 8) + 1) << 8) | sig; }

void glm_signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT); /* handlers never interleave */
    sigaddset(&sa.sa_mask, SIGTERM);
    /* no SA_RESTART: a blocking read/sleep returns EINTR so its loop can notice the flag */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int glm_signal_pending(void) { return pending_signal & 255; }

int glm_signal_count(void) { return pending_signal >> 8; }

const char *glm_signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }
