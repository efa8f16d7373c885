#include "parallel/launch.h"
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "core/log.h"
#include "parallel/comm/dist.h"
#include "parallel/comm/rendezvous.h"
#include "parallel/comm/signals.h"
#include "backend/backend.h"

extern char **environ;

int glm_local_device(int local_rank) {
    int n = glm_cuda_device_count();
    return n > 0 ? local_rank % n : 0;
}

int glm_launch_nproc(const char *s, const char *device, int *n, glm_err *err) {
    if (!s || !strcmp(s, "auto") || !strcmp(s, "gpu")) {
        int g = device && !strcmp(device, "cpu") ? 0 : glm_cuda_device_count();
        *n = g > 0 ? g : 1;
        return 0;
    }
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 1 || v > 4096)
        return glm_fail(err, "--nproc_per_node \"%s\" is not a positive number or auto", s);
    *n = (int)v;
    return 0;
}

int glm_launch_wanted(const glm_par_opts *a, glm_err *err) {
    glm_dist d;
    if (glm_dist_from_env(&d, err)) return -1;
    int n = 1;
    if (glm_launch_nproc(a->nproc_per_node, a->device, &n, err)) return -1;
    if (strcmp(d.source, "single") != 0) {
        if (n > 1 && n != d.local_world && strcmp(a->nproc_per_node, "auto") != 0)
            glm_warn("--nproc_per_node %d ignored: %s started %d processes on this node", n, d.source, d.local_world);
        return 0;
    }
    if (a->nnodes < 1) return glm_fail(err, "--nnodes must be at least 1");
    if (a->node_rank < 0 || a->node_rank >= a->nnodes) return glm_fail(err, "--node_rank %d is outside 0..%d", a->node_rank, a->nnodes - 1);
    return n > 1 || a->nnodes > 1;
}

/* ---------------------------------------------------------------- child processes */

typedef struct child { pid_t pid; int rank, done, status; } child;

/* environ with NAME=value pairs set (replacing earlier values); built before fork so the child
 * only calls execve. */
static char **env_with(char **add, int nadd) {
    int n = 0;
    while (environ[n]) n++;
    char **e = glm_calloc((size_t)(n + nadd + 1), sizeof *e);
    int k = 0;
    for (int i = 0; i < n; i++) {
        int replaced = 0;
        for (int j = 0; j < nadd; j++) {
            size_t len = strcspn(add[j], "=") + 1;
            if (strncmp(environ[i], add[j], len) == 0) replaced = 1;
        }
        if (!replaced) e[k++] = environ[i];
    }
    for (int j = 0; j < nadd; j++) e[k++] = add[j];
    return e;
}

static pid_t spawn(const char *path, char **args, char **envp, int own_group) {
    pid_t parent = getpid(), pid = fork();
    if (pid != 0) return pid;
    if (own_group) setpgid(0, 0); /* the terminal's Ctrl-C reaches only the launcher, which forwards it */
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* a launcher killed outright takes its workers along */
    if (getppid() != parent) _exit(1);
    execve(path, args, envp);
    _exit(127);
}

/* Children of pid, found through /proc (the workers mpirun started). */
static int children_of(pid_t pid, pid_t *out, int max) {
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        char path[64], buf[512];
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%.20s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = 0;
        char *rp = strrchr(buf, ')'); /* "pid (comm) state ppid ..." where comm may hold spaces */
        int ppid;
        char st;
        if (rp && sscanf(rp + 1, " %c %d", &st, &ppid) == 2 && ppid == pid) out[n++] = (pid_t)atoi(e->d_name);
    }
    closedir(d);
    return n;
}

static void signal_workers(child *ch, int n, int via_mpirun, int sig) {
    for (int i = 0; i < n; i++) {
        if (ch[i].done || ch[i].pid <= 0) continue; /* never kill(-1, ...): that is every process */
        if (via_mpirun && sig != SIGKILL) {
            /* to the ranks themselves: mpirun would follow SIGTERM with SIGKILL within a second */
            pid_t w[4096];
            int k = children_of(ch[i].pid, w, 4096);
            for (int j = 0; j < k; j++) kill(w[j], sig);
            if (k == 0) kill(ch[i].pid, sig);
        } else {
            kill(ch[i].pid, sig);
        }
    }
}

static void describe(const child *c, int via_mpirun, char *buf, size_t n) {
    char who[64];
    if (via_mpirun) snprintf(who, sizeof who, "mpirun (pid %d)", (int)c->pid);
    else snprintf(who, sizeof who, "rank %d (pid %d)", c->rank, (int)c->pid);
    if (WIFSIGNALED(c->status))
        snprintf(buf, n, "%s was killed by signal %d (%s)", who, WTERMSIG(c->status), strsignal(WTERMSIG(c->status)));
    else
        snprintf(buf, n, "%s exited with status %d", who, WEXITSTATUS(c->status));
}

/* Waits for every child. Returns the exit status of the job. */
static int supervise(child *ch, int n, int via_mpirun, double grace_interrupt) {
    int left = n, first_bad = -1, seen_signals = 0;
    double kill_at = 0;
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (int i = 0; i < n; i++) {
                if (ch[i].pid != p || ch[i].done) continue;
                ch[i].done = 1;
                ch[i].status = st;
                left--;
                int bad = !WIFEXITED(st) || WEXITSTATUS(st) != 0;
                if (bad && first_bad < 0) {
                    first_bad = i;
                    char msg[256];
                    describe(&ch[i], via_mpirun, msg, sizeof msg);
                    if (left > 0 && seen_signals == 0) {
                        glm_info("launcher: %s; stopping the other %d worker(s)", msg, left);
                        signal_workers(ch, n, 0, SIGTERM);
                        if (kill_at == 0) kill_at = glm_now() + 30;
                    } else {
                        glm_info("launcher: %s", msg);
                    }
                }
            }
            continue;
        }
        int ns = glm_signal_count();
        if (ns > seen_signals) {
            int sig = glm_signal_pending();
            if (ns >= 2) {
                glm_info("launcher: second %s: killing the workers", glm_signal_name(sig));
                signal_workers(ch, n, via_mpirun, SIGKILL);
            } else {
                glm_info("launcher: %s: asking the workers to stop%s", glm_signal_name(sig),
                         grace_interrupt > 60 ? " (they finish the step and save a checkpoint; Ctrl-C again to kill)" : "");
                signal_workers(ch, n, via_mpirun, SIGTERM);
                kill_at = glm_now() + grace_interrupt;
            }
            seen_signals = ns;
        }
        if (kill_at > 0 && glm_now() > kill_at) {
            glm_info("launcher: workers still running after the grace period; killing them");
            signal_workers(ch, n, via_mpirun, SIGKILL);
            kill_at = glm_now() + 1e9;
        }
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
    }
    if (first_bad < 0) return 0;
    int st = ch[first_bad].status;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int self_exe(char *buf, size_t n, glm_err *err) {
    ssize_t k = readlink("/proc/self/exe", buf, n - 1);
    if (k <= 0) return glm_fail(err, "cannot find this program's path (/proc/self/exe): %s", strerror(errno));
    buf[k] = 0;
    return 0;
}

static int launch_mpirun(const glm_par_opts *a, int nproc, int argc, char **argv, double grace, glm_err *err) {
#ifndef GLM_HAVE_MPI
    glm_fail(err, "--nproc_per_node %d on the CPU needs MPI, and this glmtrain was built without it", nproc);
    return glm_hint(err, "rebuild with `make MPI=1` (OpenMPI: scripts/install-deps.sh), or train on GPUs");
#else
    if (a->nnodes > 1) {
        glm_fail(err, "--nnodes %d: CPU ranks on several nodes are started by mpirun itself", a->nnodes);
        return glm_hint(err, "run mpirun -np N --hostfile FILE glmtrain train ... (without --nproc_per_node)");
    }
    char exe[4096], np[16];
    if (self_exe(exe, sizeof exe, err)) return -1;
    snprintf(np, sizeof np, "%d", nproc);
    char **args = glm_calloc((size_t)argc + 16, sizeof *args);
    int k = 0;
    args[k++] = "mpirun";
    args[k++] = "-np"; args[k++] = np;
    args[k++] = "--oversubscribe";           /* N may exceed the cores (tests, small machines) */
    args[k++] = "--bind-to"; args[k++] = "none"; /* each rank runs OpenMP threads */
    args[k++] = "--stdin"; args[k++] = "none";   /* mpirun sits in its own process group */
    if (geteuid() == 0) args[k++] = "--allow-run-as-root";
    args[k++] = exe;
    args[k++] = "train";
    for (int i = 0; i < argc; i++) args[k++] = argv[i];
    char omp[48];
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(omp, sizeof omp, "OMP_NUM_THREADS=%ld", cores / nproc > 1 ? cores / nproc : 1);
    char *add[1] = {omp};
    char **envp = env_with(add, getenv("OMP_NUM_THREADS") ? 0 : 1);
    /* mpirun is found through PATH: resolve it the way execvp would, before forking */
    char path[4096] = "";
    const char *pathenv = getenv("PATH");
    for (const char *p = pathenv ? pathenv : "/usr/bin"; p && *p;) {
        const char *e = strchr(p, ':');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        snprintf(path, sizeof path, "%.*s/mpirun", (int)len, p);
        if (access(path, X_OK) == 0) break;
        path[0] = 0;
        p = e ? e + 1 : NULL;
    }
    if (!path[0]) { free(args); free(envp); return glm_fail(err, "mpirun is not on PATH"), glm_hint(err, "install OpenMPI (apt-get install openmpi-bin)"); }
    glm_info("launcher: %d CPU ranks through %s (OpenMPI)", nproc, path);
    child ch = {.pid = spawn(path, args, envp, 1), .rank = 0};
    free(args);
    free(envp);
    if (ch.pid < 0) return glm_fail(err, "fork: %s", strerror(errno));
    return supervise(&ch, 1, 1, grace);
#endif
}

static int launch_gpu(const glm_par_opts *a, int nproc, int argc, char **argv, double grace, glm_err *err) {
    int world = nproc * a->nnodes, port = a->master_port;
    const char *addr = a->master_addr ? a->master_addr : "127.0.0.1";
    if (a->nnodes > 1 && !a->master_addr)
        return glm_fail(err, "--nnodes %d needs --master_addr (the address of node 0)", a->nnodes);
    if (port == 0 && a->nnodes > 1) port = 29500;
    if (port == 0) {
        if ((port = glm_port_free(err)) < 0) return -1;
    } else if (a->node_rank == 0 && glm_port_check(port, err)) {
        return -1;
    }
    int gpus = glm_cuda_device_count();
    if (nproc > gpus) {
        glm_fail(err, "--nproc_per_node %d but %d GPU(s) are visible", nproc, gpus);
        return glm_hint(err, "use --nproc_per_node auto (one per GPU), or --device cpu for CPU ranks");
    }
    char exe[4096];
    if (self_exe(exe, sizeof exe, err)) return -1;
    char **args = glm_calloc((size_t)argc + 3, sizeof *args);
    args[0] = exe;
    args[1] = "train";
    for (int i = 0; i < argc; i++) args[2 + i] = argv[i];
    child *ch = glm_calloc((size_t)nproc, sizeof *ch);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    glm_info("launcher: %d GPU workers on node %d of %d (world %d), rendezvous at %s:%d", nproc, a->node_rank,
             a->nnodes, world, addr, port);
    int rc = 0;
    for (int i = 0; i < nproc; i++) {
        char v[9][300];
        snprintf(v[0], 300, "RANK=%d", a->node_rank * nproc + i);
        snprintf(v[1], 300, "LOCAL_RANK=%d", i);
        snprintf(v[2], 300, "WORLD_SIZE=%d", world);
        snprintf(v[3], 300, "LOCAL_WORLD_SIZE=%d", nproc);
        snprintf(v[4], 300, "GROUP_RANK=%d", a->node_rank);
        snprintf(v[5], 300, "MASTER_ADDR=%s", addr);
        snprintf(v[6], 300, "MASTER_PORT=%d", port);
        snprintf(v[7], 300, "NCCL_NVLS_ENABLE=%s", getenv("NCCL_NVLS_ENABLE") ? getenv("NCCL_NVLS_ENABLE") : "0");
        if (getenv("OMP_NUM_THREADS")) snprintf(v[8], 300, "OMP_NUM_THREADS=%s", getenv("OMP_NUM_THREADS"));
        else snprintf(v[8], 300, "OMP_NUM_THREADS=%ld", cores / nproc > 1 ? cores / nproc : 1);
        char *add[9];
        for (int j = 0; j < 9; j++) add[j] = v[j];
        char **envp = env_with(add, 9);
        ch[i] = (child){.pid = spawn(exe, args, envp, 0), .rank = a->node_rank * nproc + i};
        free(envp);
        if (ch[i].pid < 0) { rc = glm_fail(err, "fork: %s", strerror(errno)); break; }
    }
    free(args);
    if (rc == 0) {
        rc = supervise(ch, nproc, 0, grace);
    } else {
        signal_workers(ch, nproc, 0, SIGKILL);
        for (int i = 0; i < nproc; i++) if (ch[i].pid > 0) waitpid(ch[i].pid, NULL, 0);
    }
    free(ch);
    return rc;
}

int glm_launch(const glm_par_opts *a, int argc, char **argv, glm_err *err) {
    int nproc = 1;
    if (glm_launch_nproc(a->nproc_per_node, a->device, &nproc, err)) return -1;
    glm_signals_install();
    /* with --save_on_interrupt the workers need time for the last step and the checkpoint */
    double grace = a->save_on_interrupt ? (a->ddp_timeout > 600 ? a->ddp_timeout : 600) : 30;
    int gpu = strcmp(a->device, "cpu") != 0 && glm_cuda_device_count() > 0;
    if (!gpu && !strcmp(a->device, "cuda")) return glm_fail(err, "--device cuda but no GPU is visible");
    return gpu ? launch_gpu(a, nproc, argc, argv, grace, err) : launch_mpirun(a, nproc, argc, argv, grace, err);
}
