/* Where each rank has got to, readable by every other rank: output_dir/logs/rank-N.step holds
 * "step pid host unix_seconds", rewritten at each training step. A collective that times out
 * only knows that some peer did not arrive; the board says which one, how far it got, and
 * whether it is stopped (SIGSTOP, a debugger) rather than dead. A stopped rank of this job on
 * this host is killed (after its command line is checked), since the launcher's SIGTERM does
 * not reach a stopped process and it would be left behind. */
#ifndef GLM_PRESENCE_H
#define GLM_PRESENCE_H
#include <stddef.h>
#include "core/err.h"

typedef struct glm_presence {
    char dir[4096];   /* output_dir/logs, "" when not in use (one rank) */
    int rank, world;
} glm_presence;

/* world == 1 leaves the board unused. */
int glm_presence_open(glm_presence *p, const char *output_dir, int rank, int world, glm_err *err);
void glm_presence_step(const glm_presence *p, long step);
/* After a timeout at my_step: names into out the ranks that are behind it, stopped or gone
 * (their last step, how long ago), and kills stopped peers of this job on this host. */
void glm_presence_explain(const glm_presence *p, long my_step, char *out, size_t n);

#endif
