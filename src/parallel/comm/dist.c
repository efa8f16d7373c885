#include "parallel/comm/dist.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An integer environment variable: 1 found, 0 absent, -1 malformed (err names it). */
static int env_int(const char *name, int *out, glm_err *err) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 0 || v > 1 << 24) {
        glm_fail(err, "environment variable %s=\"%s\" is not a non-negative integer", name, s);
        return -1;
    }
    *out = (int)v;
    return 1;
}

void glm_slurm_first_host(const char *list, char *out, int n) {
    out[0] = 0;
    if (!list) return;
    int len = 0;
    const char *p = list;
    while (*p && *p != ',' && *p != '[' && len < n - 1) out[len++] = *p++;
    if (*p == '[') { /* prefix[a-b,c]suffix: the first number keeps its zero padding */
        p++;
        while (*p && *p != '-' && *p != ',' && *p != ']' && len < n - 1) out[len++] = *p++;
        while (*p && *p != ']') p++;
        if (*p == ']') p++;
        while (*p && *p != ',' && len < n - 1) out[len++] = *p++;
    }
    out[len] = 0;
}

int glm_slurm_tasks_on_node(const char *list, int node) {
    if (!list || !*list) return -1;
    const char *p = list;
    for (int seen = 0; *p;) {
        char *end;
        long c = strtol(p, &end, 10), reps = 1;
        if (end == p || c <= 0) return -1;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x') return -1;
            reps = strtol(p + 2, &end, 10);
            if (end == p + 2 || *end != ')' || reps <= 0) return -1;
            p = end + 1;
        }
        if (node < seen + reps) return (int)c;
        seen += (int)reps;
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return -1;
}

static int need(int found, const char *name, const char *src, glm_err *err) {
    if (found > 0) return 0;
    if (found == 0) glm_fail(err, "%s launch: environment variable %s is missing", src, name);
    return -1;
}

static int from_torchrun(glm_dist *d, glm_err *err) {
    d->source = "torchrun";
    if (need(env_int("RANK", &d->rank, err), "RANK", d->source, err)) return -1;
    if (need(env_int("WORLD_SIZE", &d->world, err), "WORLD_SIZE", d->source, err)) return -1;
    int f = env_int("LOCAL_RANK", &d->local_rank, err);
    if (f < 0) return -1;
    if (f == 0) d->local_rank = d->rank;
    f = env_int("LOCAL_WORLD_SIZE", &d->local_world, err);
    if (f < 0) return -1;
    if (f == 0) d->local_world = d->world;
    f = env_int("GROUP_RANK", &d->node_rank, err);
    if (f < 0) return -1;
    if (f == 0) d->node_rank = d->rank / (d->local_world > 0 ? d->local_world : 1);
    if (env_int("MASTER_PORT", &d->master_port, err) < 0) return -1;
    const char *a = getenv("MASTER_ADDR");
    snprintf(d->master_addr, sizeof d->master_addr, "%s", a ? a : "");
    return 0;
}

static int from_slurm(glm_dist *d, glm_err *err) {
    d->source = "slurm";
    if (need(env_int("SLURM_PROCID", &d->rank, err), "SLURM_PROCID", d->source, err)) return -1;
    int f;
    if (need(env_int("SLURM_STEP_NUM_TASKS", &d->world, err), "SLURM_STEP_NUM_TASKS", d->source, err)) return -1;
    if (need(env_int("SLURM_LOCALID", &d->local_rank, err), "SLURM_LOCALID", d->source, err)) return -1;
    if ((f = env_int("SLURM_NODEID", &d->node_rank, err)) < 0) return -1;
    const char *tpn = getenv("SLURM_STEP_TASKS_PER_NODE");
    if (!tpn) tpn = getenv("SLURM_TASKS_PER_NODE");
    d->local_world = tpn ? glm_slurm_tasks_on_node(tpn, d->node_rank) : d->world;
    if (d->local_world <= 0)
        return glm_fail(err, "SLURM_STEP_TASKS_PER_NODE=\"%s\" does not list node %d", tpn, d->node_rank);
    if (env_int("MASTER_PORT", &d->master_port, err) < 0) return -1;
    if (d->master_port == 0) d->master_port = 29500;
    const char *a = getenv("MASTER_ADDR");
    if (a && *a) snprintf(d->master_addr, sizeof d->master_addr, "%s", a);
    else {
        const char *nl = getenv("SLURM_STEP_NODELIST");
        glm_slurm_first_host(nl ? nl : getenv("SLURM_NODELIST"), d->master_addr, (int)sizeof d->master_addr);
    }
    return 0;
}

static int from_openmpi(glm_dist *d, glm_err *err) {
    d->source = "openmpi";
    d->mpi = 1;
    if (need(env_int("OMPI_COMM_WORLD_RANK", &d->rank, err), "OMPI_COMM_WORLD_RANK", d->source, err)) return -1;
    if (need(env_int("OMPI_COMM_WORLD_SIZE", &d->world, err), "OMPI_COMM_WORLD_SIZE", d->source, err)) return -1;
    int f = env_int("OMPI_COMM_WORLD_LOCAL_RANK", &d->local_rank, err);
    if (f < 0) return -1;
    if (f == 0) d->local_rank = d->rank;
    f = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", &d->local_world, err);
    if (f < 0) return -1;
    if (f == 0) d->local_world = d->world;
    d->node_rank = d->rank / d->local_world; /* mpirun maps by slot: ranks fill a node first */
    if (env_int("MASTER_PORT", &d->master_port, err) < 0) return -1;
    const char *a = getenv("MASTER_ADDR");
    snprintf(d->master_addr, sizeof d->master_addr, "%s", a ? a : "");
    return 0;
}

int glm_dist_from_env(glm_dist *d, glm_err *err) {
    *d = (glm_dist){.world = 1, .local_world = 1, .nnodes = 1, .source = "single"};
    int rc;
    if (getenv("RANK") && getenv("WORLD_SIZE")) rc = from_torchrun(d, err);
    /* srun sets the STEP variables; an sbatch script alone (one process) has only the allocation's */
    else if (getenv("SLURM_PROCID") && getenv("SLURM_STEP_NUM_TASKS")) rc = from_slurm(d, err);
    else if (getenv("OMPI_COMM_WORLD_SIZE")) rc = from_openmpi(d, err);
    else return 0;
    if (rc) return glm_hint(err, "start data-parallel runs with glmtrain train --nproc_per_node N, torchrun, srun or mpirun");
    /* an OpenMPI launcher below another (srun --mpi=pmix, mpirun -x RANK) can still run MPI */
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK")) d->mpi = 1;
    if (d->world < 1 || d->rank >= d->world)
        return glm_fail(err, "%s launch: rank %d is outside world size %d", d->source, d->rank, d->world);
    if (d->local_world < 1 || d->local_rank >= d->local_world)
        return glm_fail(err, "%s launch: local rank %d is outside the %d ranks of this node", d->source, d->local_rank, d->local_world);
    d->nnodes = (d->world + d->local_world - 1) / d->local_world;
    return 0;
}
