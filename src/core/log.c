#define _POSIX_C_SOURCE 200809L
#include "core/log.h"
#include <time.h>

double glm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
