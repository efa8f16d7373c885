/* TCP rendezvous at MASTER_ADDR:MASTER_PORT: rank 0 listens, every other rank connects and
 * says who it is, and rank 0 answers each with the same bytes (the NCCL unique id). It doubles
 * as the start-up check that all `world` ranks exist: rank 0 names the ranks that never came. */
#ifndef GLM_PARALLEL_RENDEZVOUS_H
#define GLM_PARALLEL_RENDEZVOUS_H
#include <stddef.h>
#include "core/err.h"

/* Rank 0 sends blob[n] to every rank; the others receive it into blob. Bounded by timeout
 * seconds (and by SIGINT/SIGTERM). */
int glm_rdzv_exchange(const char *addr, int port, int rank, int world, void *blob, size_t n, double timeout,
                      glm_err *err);
/* 0 when `port` can be bound on this machine, else a clear error naming it. */
int glm_port_check(int port, glm_err *err);
/* A port the kernel reports free now (> 0), or -1 with err. */
int glm_port_free(glm_err *err);

#endif
