/* Progress on the console: a one-line bar redrawn in place on a terminal (step/total, ETA,
 * loss, tokens/s), plain periodic lines otherwise (logs, CI, pipes). */
#ifndef GLM_PROGRESS_H
#define GLM_PROGRESS_H
#include <stdio.h>

typedef struct glm_progress {
    FILE *out;
    int tty;          /* redraw in place */
    long total;
    double t0;        /* start time */
    long step0;       /* step at start (resume) */
    double last_draw;
} glm_progress;

void glm_progress_init(glm_progress *p, FILE *out, long start_step, long total, int disable_bar);
/* Redraws the bar (at most a few times a second). */
void glm_progress_update(glm_progress *p, long step, double loss, double tok_per_s);
/* Prints a full log line (above the bar on a terminal). */
void glm_progress_log(glm_progress *p, const char *line);
void glm_progress_done(glm_progress *p);

#endif
