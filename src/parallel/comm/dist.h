/* Where this process sits in a data-parallel job, read from the launcher's environment, in
 * this order:
 *   torchrun (and glmtrain's own --nproc_per_node spawn): RANK, WORLD_SIZE, LOCAL_RANK,
 *       LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT;
 *   SLURM srun: SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID,
 *       SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE ("2(x3),1"), SLURM_NODEID,
 *       SLURM_STEP_NUM_NODES; master = MASTER_ADDR or the first host of SLURM_STEP_NODELIST;
 *   OpenMPI mpirun: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE;
 *   none of these: a single process. */
#ifndef GLM_PARALLEL_DIST_H
#define GLM_PARALLEL_DIST_H
#include "core/err.h"

typedef struct glm_dist {
    int rank, world;
    int local_rank, local_world; /* on this node */
    int node_rank, nnodes;
    char master_addr[256];       /* "" when not given */
    int master_port;             /* 0 when not given */
    const char *source;          /* "single", "torchrun", "slurm", "openmpi" */
    int mpi;                     /* started by an MPI launcher: MPI_Init can join the job */
} glm_dist;

/* Reads the environment. Fails naming the variable when one is malformed or inconsistent. */
int glm_dist_from_env(glm_dist *d, glm_err *err);
/* The first host of a SLURM node list ("gpu[07-09,12],cpu1" -> "gpu07") into out. */
void glm_slurm_first_host(const char *list, char *out, int n);
/* Tasks on node `node` of a SLURM tasks-per-node list ("2(x3),1"); -1 when malformed. */
int glm_slurm_tasks_on_node(const char *list, int node);

#endif
