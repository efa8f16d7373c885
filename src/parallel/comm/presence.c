/* The ranks' presence board (presence.h). */
#include "parallel/comm/presence.h"
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "core/fileutil.h"

int glm_presence_open(glm_presence *p, const char *output_dir, int rank, int world, glm_err *err) {
    *p = (glm_presence){.rank = rank, .world = world};
    if (world <= 1) return 0;
    glm_path_join(p->dir, sizeof p->dir, output_dir, "logs");
    return glm_mkdirs(p->dir, err);
}

void glm_presence_step(const glm_presence *p, long step) {
    if (!p->dir[0]) return;
    char path[4200], host[256] = "?", line[512];
    gethostname(host, sizeof host - 1);
    snprintf(path, sizeof path, "%s/rank-%d.step", p->dir, p->rank);
    int n = snprintf(line, sizeof line, "%ld %d %s %ld\n", step, (int)getpid(), host, (long)time(NULL));
    /* once per step: a rename keeps readers from seeing half a line, and no fsync (the board
     * only explains failures of a live job, it need not survive a crash of the machine) */
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    int ok = fwrite(line, 1, (size_t)n, f) == (size_t)n;
    if (fclose(f) == 0 && ok) rename(tmp, path);
}

/* 'T' when pid is stopped, 'R'/'S'/... otherwise, 0 when it is gone; cmd gets its command line. */
static char proc_state(int pid, char *cmd, size_t n) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    const char *paren = strrchr(buf, ')'); /* "pid (comm) S ..." */
    char state = paren && paren[1] == ' ' ? paren[2] : '?';
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    cmd[0] = 0;
    if ((f = fopen(path, "r"))) {
        len = fread(cmd, 1, n - 1, f);
        fclose(f);
        cmd[len] = 0;
    }
    return state;
}

void glm_presence_explain(const glm_presence *p, long my_step, char *out, size_t n) {
    out[0] = 0;
    if (!p->dir[0]) return;
    char me[256] = "?";
    gethostname(me, sizeof me - 1);
    for (int r = 0; r < p->world; r++) {
        if (r == p->rank) continue;
        char path[4200], host[256] = "?", cmd[512];
        snprintf(path, sizeof path, "%s/rank-%d.step", p->dir, r);
        long step = -1, when = 0;
        int pid = 0;
        FILE *f = fopen(path, "r");
        if (f) {
            if (fscanf(f, "%ld %d %255s %ld", &step, &pid, host, &when) != 4) step = -1;
            fclose(f);
        }
        size_t u = strlen(out);
        if (step < 0) { snprintf(out + u, n - u, "%srank %d never reported a step", u ? "; " : "", r); continue; }
        /* a peer on this host shows its state; elsewhere only how far it got tells */
        char st = strcmp(host, me) == 0 ? proc_state(pid, cmd, sizeof cmd) : 'R';
        const char *what = !st ? ", gone" : st == 'T' ? ", stopped" : "";
        if (!*what && step >= my_step) continue; /* running and as far as this rank */
        if (st == 'T' && strstr(cmd, "glmtrain")) { /* the launcher's SIGTERM never reaches a stopped process */
            kill(pid, SIGKILL);
            what = ", stopped (SIGSTOP or a debugger): killed so it is not left behind";
        }
        snprintf(out + u, n - u, "%srank %d (pid %d on %s) last started step %ld, %ld s ago%s", u ? "; " : "", r, pid, host,
                 step, (long)time(NULL) - when, what);
    }
}
