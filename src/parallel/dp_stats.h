/* Per-rank figures at logging steps, gathered from every rank to every rank: the rank's own
 * forward+backward time of the step (measured after a device sync, so a slow GPU shows up
 * even though collectives make every rank's wall-clock step equal), and from NVML the GPU's
 * utilisation, memory used and power (process RSS on CPU ranks). */
#ifndef GLM_PARALLEL_DP_STATS_H
#define GLM_PARALLEL_DP_STATS_H
#include <stddef.h>
#include "parallel/dp.h"
#include "parallel/gpustat.h"

typedef struct glm_rank_stat {
    double compute_s;  /* forward + backward of the step */
    double util;       /* GPU utilisation % (NAN on CPU ranks) */
    double mem;        /* GPU memory used, or process RSS on CPU ranks, bytes */
    double power;      /* W (NAN on CPU ranks) */
} glm_rank_stat;

/* Collective (every rank at the same steps). out has world entries. */
int glm_dp_stats(glm_dp *dp, glm_gpustat *gs, double compute_s, glm_rank_stat *out, glm_err *err);
/* One line over the ranks, and in warn (empty when none) the ranks whose time or memory stands
 * out against the median. */
void glm_dp_stats_format(int world, int gpu, const glm_rank_stat *s, char *line, size_t n, char *warn, size_t wn);

#endif
