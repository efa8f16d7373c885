#include "parallel/dp/dp_stats.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define K 7 /* figures per rank */

int glm_dp_stats(glm_dp *dp, glm_gpustat *gs, const glm_step_phases *ph, glm_rank_stat *out, glm_err *err) {
    int W = dp->world;
    double *v = glm_calloc((size_t)W * K, sizeof *v);
    double *mine = v + (size_t)dp->rank * K;
    mine[0] = ph->compute_s;
    glm_gpustat_read(gs, &mine[1], &mine[2], &mine[3]);
    mine[4] = ph->tail_s;
    mine[5] = ph->norm_s;
    mine[6] = ph->update_s;
    if (!gs) mine[2] = glm_rss_bytes();
    /* every rank fills its own row; the sum over ranks is the gathered table */
    int rc = glm_dp_sum(dp, v, W * K, "per-rank statistics", err);
    for (int r = 0; r < W && rc == 0; r++)
        out[r] = (glm_rank_stat){.compute_s = v[r * K], .util = v[r * K + 1], .mem = v[r * K + 2], .power = v[r * K + 3],
                                 .tail_s = v[r * K + 4], .norm_s = v[r * K + 5], .update_s = v[r * K + 6]};
    free(v);
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(int n, const glm_rank_stat *s, size_t field) {
    double *x = glm_malloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) x[i] = *(const double *)((const char *)&s[i] + field);
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    double m = n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
    free(x);
    return m;
}

void glm_dp_stats_format(int world, int gpu, const glm_rank_stat *s, char *line, size_t n, char *warn, size_t wn) {
    const double GiB = 1073741824.0;
    size_t len = (size_t)snprintf(line, n, "[glmtrain] ranks (fwd+bwd s%s):", gpu ? ", GPU util, memory, power" : ", RSS");
    for (int r = 0; r < world && len < n; r++) {
        if (gpu)
            len += (size_t)snprintf(line + len, n - len, "%s %d: %.3f %.0f%% %.1f GiB %.0f W", r ? " |" : "", r,
                                    s[r].compute_s, s[r].util, s[r].mem / GiB, s[r].power);
        else
            len += (size_t)snprintf(line + len, n - len, "%s %d: %.3f %.2f GiB", r ? " |" : "", r, s[r].compute_s, s[r].mem / GiB);
    }
    warn[0] = 0;
    if (world < 2) return;
    double mt = median(world, s, offsetof(glm_rank_stat, compute_s)), mm = median(world, s, offsetof(glm_rank_stat, mem));
    size_t wl = 0;
    for (int r = 0; r < world && wl < wn; r++) {
        if (s[r].compute_s > 1.2 * mt && s[r].compute_s - mt > 0.005)
            wl += (size_t)snprintf(warn + wl, wn - wl, "%srank %d is slow: %.3f s forward+backward vs median %.3f s",
                                   wl ? "; " : "", r, s[r].compute_s, mt);
        if (wl < wn && s[r].mem > 1.15 * mm && s[r].mem - mm > GiB)
            wl += (size_t)snprintf(warn + wl, wn - wl, "%srank %d uses %.1f GiB of %s memory vs median %.1f GiB",
                                   wl ? "; " : "", r, s[r].mem / GiB, gpu ? "GPU" : "host", mm / GiB);
    }
}

void glm_dp_phases_format(int world, const glm_rank_stat *s, char *line, size_t n) {
    size_t len = (size_t)snprintf(line, n, "[glmtrain] step ms (fwd+bwd / grad reduction tail / norm / update):");
    for (int r = 0; r < world && len < n; r++)
        len += (size_t)snprintf(line + len, n - len, "%s %d: %.1f / %.1f / %.1f / %.1f", r ? " |" : "", r, 1e3 * s[r].compute_s,
                                1e3 * s[r].tail_s, 1e3 * s[r].norm_s, 1e3 * s[r].update_s);
}
