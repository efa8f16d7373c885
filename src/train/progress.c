#include "train/progress.h"
#include <string.h>
#include <unistd.h>
#include "core/log.h"

void glm_progress_init(glm_progress *p, FILE *out, long start_step, long total, int disable_bar) {
    *p = (glm_progress){.out = out, .tty = !disable_bar && isatty(fileno(out)), .total = total,
                        .t0 = glm_now(), .step0 = start_step};
}

static void fmt_time(char *buf, size_t n, double s) {
    if (s < 0 || s > 1e7) { snprintf(buf, n, "--:--:--"); return; }
    long t = (long)s;
    snprintf(buf, n, "%02ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

void glm_progress_update(glm_progress *p, long step, double loss, double tok_per_s) {
    if (!p->tty) return;
    double now = glm_now();
    if (now - p->last_draw < 0.2 && step < p->total) return;
    p->last_draw = now;
    double frac = p->total > 0 ? (double)step / p->total : 0;
    double rate = (now - p->t0) / (double)(step - p->step0 > 0 ? step - p->step0 : 1);
    char eta[32], el[32], bar[33];
    fmt_time(eta, sizeof eta, rate * (p->total - step));
    fmt_time(el, sizeof el, now - p->t0);
    int w = (int)(frac * 30);
    for (int i = 0; i < 30; i++) bar[i] = i < w ? '=' : (i == w ? '>' : ' ');
    bar[30] = 0;
    fprintf(p->out, "\r%6ld/%ld [%s] %3d%% loss %.4f %.0f tok/s %s<%s ", step, p->total, bar, (int)(frac * 100), loss,
            tok_per_s, el, eta);
    fflush(p->out);
}

void glm_progress_log(glm_progress *p, const char *line) {
    if (p->tty) fprintf(p->out, "\r\033[K");
    fprintf(p->out, "%s\n", line);
    fflush(p->out);
    p->last_draw = 0;
}

void glm_progress_done(glm_progress *p) {
    if (p->tty) fprintf(p->out, "\n");
    fflush(p->out);
}
