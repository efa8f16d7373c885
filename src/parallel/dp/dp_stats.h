/* Per-rank figures at logging steps, gathered from every rank to every rank: the rank's own
 * forward+backward time of the step and the phases after it (measured after a device sync, so a slow GPU shows up
 * even though collectives make every rank's wall-clock step equal), and from NVML the GPU's
 * utilisation, memory used and power (process RSS on CPU ranks). */
#ifndef GLM_PARALLEL_DP_STATS_H
#define GLM_PARALLEL_DP_STATS_H
#include <stddef.h>
#include "parallel/dp/dp.h"
#include "parallel/gpustat.h"

/* One rank's phases of a measured step, in seconds, each ended by a device sync. */
typedef struct glm_step_phases {
    double compute_s;  /* forward + backward (gradient buckets reduced meanwhile) */
    double tail_s;     /* gradient reduction still running after backward */
    double norm_s;     /* global gradient norm (and the loss sum) */
    double update_s;   /* AdamW, and under ZeRO the parameter all-gather */
} glm_step_phases;

typedef struct glm_rank_stat {
    double compute_s;  /* forward + backward of the step */
    double tail_s, norm_s, update_s; /* the rest of the step (glm_step_phases) */
    double util;       /* GPU utilisation % (NAN on CPU ranks) */
    double mem;        /* GPU memory used, or process RSS on CPU ranks, bytes */
    double power;      /* W (NAN on CPU ranks) */
} glm_rank_stat;

/* Collective (every rank at the same steps). out has world entries. */
int glm_dp_stats(glm_dp *dp, glm_gpustat *gs, const glm_step_phases *ph, glm_rank_stat *out, glm_err *err);
/* One line over the ranks, and in warn (empty when none) the ranks whose time or memory stands
 * out against the median. */
void glm_dp_stats_format(int world, int gpu, const glm_rank_stat *s, char *line, size_t n, char *warn, size_t wn);
/* One line of every rank's step phases in ms: where a step's time beyond forward+backward goes. */
void glm_dp_phases_format(int world, const glm_rank_stat *s, char *line, size_t n);

#endif
