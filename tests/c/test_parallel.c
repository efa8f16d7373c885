/* Data-parallel plumbing without MPI or GPUs: the launchers' environments (torchrun, SLURM,
 * OpenMPI) parsed by setting the variables, SLURM list forms, the TCP rendezvous between forked
 * ranks (and its timeout naming the missing rank), free and busy ports, the single-process
 * communicator, the CPU twin of the add that sums a shard from what peers copied in. The MPI
 * side runs end to end in tests/py/test_dp.py. */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "backend/backend.h"
#include "core/log.h"
#include "parallel/comm/comm.h"
#include "parallel/comm/dist.h"
#include "parallel/comm/rendezvous.h"
#include "test.h"

static const char *all_vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                                 "MASTER_PORT", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NODEID",
                                 "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_NODELIST",
                                 "SLURM_NODELIST", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                 "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_RANK"};

static void clear_env(void) {
    for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++) unsetenv(all_vars[i]);
}

static void test_env(test_counts *tc) {
    glm_dist d;
    glm_err err = {0};
    clear_env();
    int rc = glm_dist_from_env(&d, &err);
    TEST_CHECK(tc, "env_single", rc == 0 && d.world == 1 && d.rank == 0 && !strcmp(d.source, "single") && !d.mpi,
               "rc %d world %d source %s", rc, d.world, d.source);

    /* torchrun on node 1 of 2, 4 processes per node */
    setenv("RANK", "6", 1); setenv("WORLD_SIZE", "8", 1); setenv("LOCAL_RANK", "2", 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1); setenv("GROUP_RANK", "1", 1);
    setenv("MASTER_ADDR", "10.0.0.5", 1); setenv("MASTER_PORT", "29511", 1);
    rc = glm_dist_from_env(&d, &err);
    TEST_CHECK(tc, "env_torchrun", rc == 0 && d.rank == 6 && d.world == 8 && d.local_rank == 2 && d.local_world == 4 &&
               d.node_rank == 1 && d.nnodes == 2 && !strcmp(d.master_addr, "10.0.0.5") && d.master_port == 29511 &&
               !strcmp(d.source, "torchrun") && !d.mpi, "rc %d %s: rank %d/%d local %d/%d node %d/%d %s:%d", rc, err.msg,
               d.rank, d.world, d.local_rank, d.local_world, d.node_rank, d.nnodes, d.master_addr, d.master_port);
    setenv("RANK", "x1", 1);
    rc = glm_dist_from_env(&d, &err);
    TEST_CHECK(tc, "env_torchrun_malformed", rc != 0 && strstr(err.msg, "RANK") && strstr(err.msg, "x1"), "%s", err.msg);
    setenv("RANK", "8", 1);
    rc = glm_dist_from_env(&d, &err);
    TEST_CHECK(tc, "env_torchrun_rank_out_of_range", rc != 0 && strstr(err.msg, "rank 8"), "%s", err.msg);

    /* OpenMPI mpirun -np 4, 2 per node */
    clear_env();
    setenv("OMPI_COMM_WORLD_RANK", "3", 1); setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1); setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    rc = glm_dist_from_env(&d, &err);
    TEST_CHECK(tc, "env_openmpi", rc == 0 && d.rank == 3 && d.world == 4 && d.local_rank == 1 && d.local_world == 2 &&
               d.node_rank == 1 && d.nnodes == 2 && d.mpi && !strcmp(d.source, "openmpi"),
               "rc %d %s: rank %d/%d local %d/%d node %d mpi %d", rc, err.msg, d.rank, d.world, d.local_rank,
               d.local_world, d.node_rank, d.mpi);
    /* torchrun's variables win over OpenMPI's, but MPI stays usable */
    setenv("RANK", "3", 1); setenv("WORLD_SIZE", "4", 1);
    rc = glm_dist_from_env(&d, &err);
    TEST_CHECK(tc, "env_torchrun_over_openmpi", rc == 0 && !strcmp(d.source, "torchrun") && d.mpi, "source %s mpi %d", d.source, d.mpi);

    /* SLURM srun: 7 tasks on nodes of 2, 2, 2, 1; task 5 is on node 2 */
    clear_env();
    setenv("SLURM_PROCID", "5", 1); setenv("SLURM_STEP_NUM_TASKS", "7", 1); setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_NODEID", "2", 1); setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3),1", 1);
    setenv("SLURM_STEP_NODELIST", "gpu[07-09,12]", 1);
    rc = glm_dist_from_env(&d, &err);
    TEST_CHECK(tc, "env_slurm", rc == 0 && d.rank == 5 && d.world == 7 && d.local_rank == 1 && d.local_world == 2 &&
               d.node_rank == 2 && !strcmp(d.master_addr, "gpu07") && d.master_port == 29500 && !strcmp(d.source, "slurm"),
               "rc %d %s: rank %d/%d local %d/%d node %d %s:%d", rc, err.msg, d.rank, d.world, d.local_rank,
               d.local_world, d.node_rank, d.master_addr, d.master_port);
    /* an sbatch script without srun is one process */
    unsetenv("SLURM_STEP_NUM_TASKS");
    rc = glm_dist_from_env(&d, &err);
    TEST_CHECK(tc, "env_slurm_batch_step_is_single", rc == 0 && d.world == 1, "world %d", d.world);
    clear_env();

    char h[64];
    struct { const char *in, *want; } hosts[] = {{"node1", "node1"}, {"gpu[07-09,12],cpu1", "gpu07"},
                                                 {"a,b", "a"}, {"rack[3]-n[1-2]", "rack3-n[1-2]"}, {"", ""}};
    int ok = 1;
    for (int i = 0; i < 5; i++) {
        glm_slurm_first_host(hosts[i].in, h, sizeof h);
        if (strcmp(h, hosts[i].want)) { ok = 0; printf("  first host of %s: %s\n", hosts[i].in, h); }
    }
    TEST_CHECK(tc, "slurm_first_host", ok, "see above");
    TEST_CHECK(tc, "slurm_tasks_per_node",
               glm_slurm_tasks_on_node("2(x3),1", 0) == 2 && glm_slurm_tasks_on_node("2(x3),1", 2) == 2 &&
               glm_slurm_tasks_on_node("2(x3),1", 3) == 1 && glm_slurm_tasks_on_node("2(x3),1", 4) == -1 &&
               glm_slurm_tasks_on_node("4", 0) == 4 && glm_slurm_tasks_on_node("2(3)", 0) == -1,
               "parse of 2(x3),1");
}

static void test_ports(test_counts *tc) {
    glm_err err = {0};
    int p = glm_port_free(&err);
    TEST_CHECK(tc, "port_free", p > 0 && glm_port_check(p, &err) == 0, "port %d: %s", p, err.msg);
    /* a listener holds the port: a clear error naming it */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p), .sin_addr.s_addr = htonl(INADDR_ANY)};
    int bound = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(fd, 1) == 0;
    char want[64];
    snprintf(want, sizeof want, "port %d is already in use", p);
    int rc = glm_port_check(p, &err);
    TEST_CHECK(tc, "port_busy_is_clear_error", bound && rc != 0 && strstr(err.msg, want) && strstr(err.hint, "--master_port"),
               "bound %d rc %d: %s / %s", bound, rc, err.msg, err.hint);
    close(fd);
}

static void test_rendezvous(test_counts *tc) {
    glm_err err = {0};
    int port = glm_port_free(&err), world = 4;
    unsigned char blob[128];
    for (int i = 0; i < 128; i++) blob[i] = (unsigned char)(i * 7 + 3);
    pid_t kids[3];
    for (int r = 1; r < world; r++) {
        kids[r - 1] = fork();
        if (kids[r - 1] == 0) {
            if (r == 2) usleep(300000); /* a late rank: rank 0 waits for it */
            unsigned char got[128] = {0};
            glm_err e = {0};
            int rc = glm_rdzv_exchange("127.0.0.1", port, r, world, got, sizeof got, 10, &e);
            _exit(rc == 0 && memcmp(got, blob, sizeof got) == 0 ? 0 : 1);
        }
    }
    int rc = glm_rdzv_exchange("127.0.0.1", port, 0, world, blob, sizeof blob, 10, &err);
    int kids_ok = 1;
    for (int i = 0; i < 3; i++) {
        int st;
        waitpid(kids[i], &st, 0);
        kids_ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    TEST_CHECK(tc, "rendezvous_4_ranks", rc == 0 && kids_ok, "rc %d (%s), children ok %d", rc, err.msg, kids_ok);

    /* rank 2 of 3 never comes: rank 0 gives up in time and names it */
    port = glm_port_free(&err);
    pid_t k = fork();
    if (k == 0) {
        unsigned char got[16];
        glm_err e = {0};
        _exit(glm_rdzv_exchange("127.0.0.1", port, 1, 3, got, sizeof got, 1.5, &e) == 0 ? 1 : 0);
    }
    unsigned char b16[16] = {0};
    double t0 = glm_now();
    rc = glm_rdzv_exchange("127.0.0.1", port, 0, 3, b16, sizeof b16, 0.7, &err);
    double dt = glm_now() - t0;
    int st;
    waitpid(k, &st, 0);
    TEST_CHECK(tc, "rendezvous_timeout_names_missing_rank",
               rc != 0 && strstr(err.msg, "timed out") && strstr(err.msg, "missing: 2") && dt < 3,
               "rc %d after %.1f s: %s", rc, dt, err.msg);
    /* a rank whose rank 0 never listens times out on its side too */
    port = glm_port_free(&err);
    t0 = glm_now();
    rc = glm_rdzv_exchange("127.0.0.1", port, 1, 2, b16, sizeof b16, 0.5, &err);
    TEST_CHECK(tc, "rendezvous_no_rank0_times_out", rc != 0 && strstr(err.msg, "rank 1") && strstr(err.msg, "timed out"),
               "rc %d: %s", rc, err.msg);
}

static void test_single_comm(test_counts *tc) {
    glm_comm *c = glm_comm_single();
    glm_err err = {0};
    float x[4] = {1, 2, 3, 4};
    double v[2] = {5, 6};
    int rc = glm_comm_allreduce_sync(c, x, 4, GLM_C_F32, "x", &err) || c->sum_host(c, v, 2, -1, "v", &err) ||
             glm_comm_barrier(c, 0, "b", &err);
    TEST_CHECK(tc, "single_comm_is_identity", rc == 0 && x[3] == 4 && v[1] == 6 && c->world == 1, "rc %d", rc);
    c->close(c);
}

/* add_sumsq_spans (parallel/dp/dp_peer.c's reduce): ranges of x get ranges of y added, the rest
 * of x stays, and the result is the sum of squares of the sums; against a double reference. */
static void test_add_sumsq_spans(test_counts *tc) {
    glm_backend *be = glm_backend_cpu();
    enum { N = 1000, K = 4 };
    float x[N], y[N], want[N];
    for (int i = 0; i < N; i++) { x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f; y[i] = (float)((i * 53) % 97) / 40.0f - 1.2f; }
    memcpy(want, x, sizeof x);
    glm_span s[K] = {{0, 100}, {250, 0}, {300, 211}, {900, 100}};
    size_t yoff[K] = {500, 0, 7, 0};
    double ref = 0;
    for (int k = 0; k < K; k++)
        for (size_t j = 0; j < s[k].n; j++) {
            want[s[k].lo + j] = x[s[k].lo + j] + y[yoff[k] + j];
            ref += (double)want[s[k].lo + j] * want[s[k].lo + j];
        }
    double got = be->add_sumsq_spans(be, x, y, yoff, s, K);
    TEST_CHECK(tc, "add_sumsq_spans_cpu", memcmp(x, want, sizeof x) == 0 && fabs(got - ref) <= 1e-9 * ref,
               "sum of squares %.9g vs %.9g", got, ref);
    be->destroy(be);
}

int main(void) {
    test_counts tc = {0};
    test_add_sumsq_spans(&tc);
    test_env(&tc);
    test_ports(&tc);
    test_rendezvous(&tc);
    test_single_comm(&tc);
    TEST_EXIT(&tc);
}
