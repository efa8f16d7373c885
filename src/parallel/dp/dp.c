#include "parallel/dp/dp.h"
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "core/log.h"
#include "parallel/comm/rendezvous.h"
#include "parallel/comm/signals.h"
#ifdef GLM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

/* Tensor offsets in the table are multiples of 64 elements; shards and buckets too, or of the
 * 8-bit state's block, so a block never straddles two pieces of a shard (dp->align). */
#define ALIGN 64

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

int glm_dp_peer_ranks(int gpus_nccl, int world, int zero_stage, int one_node, int one_stage, int whole_update) {
    const char *mode = getenv("GLMTRAIN_DP_PEER"); /* unset: 2 ranks (measured); 1: any count; 0: never */
    if (!gpus_nccl || world < 2 || world > 16 || zero_stage >= 2 || !one_node || !one_stage || whole_update ||
        (mode && !strcmp(mode, "0")))
        return 0;
    return world == 2 || (mode && !strcmp(mode, "1")) ? world : 0;
}

static int env_on(const char *name) { const char *v = getenv(name); return v && strcmp(v, "1") == 0; }

/* The diagnostics and experiments behind environment variables (docs/PARALLEL.md), read once. */
static void read_experiments(glm_dp *dp) {
    dp->debug = env_on("GLMTRAIN_DP_DEBUG");
    dp->no_overlap = env_on("GLMTRAIN_DP_NO_OVERLAP");
    dp->z0_ag_backward = env_on("GLMTRAIN_DP_Z0_AG_BACKWARD");
}

int glm_dp_open(glm_dp **out, const glm_dp_cfg *cfg, glm_err *err) {
    glm_dp *dp = glm_calloc(1, sizeof *dp);
    dp->cfg = *cfg;
    dp->saved_stderr = -1;
    read_experiments(dp);
    *out = dp;
    if (cfg->zero_stage < 0 || cfg->zero_stage > 3) return glm_fail(err, "--zero_stage %d: choose 0, 1, 2 or 3", cfg->zero_stage);
    if (cfg->bucket_mb <= 0) return glm_fail(err, "--bucket_size_mb must be positive");
    if (glm_dist_from_env(&dp->dist, err)) return -1;
    dp->rank = dp->dist.rank;
    dp->world = dp->dist.world;
    dp->align = cfg->optim == GLM_OPTIM_ADAMW8 ? GLM_ADAM8_BLOCK : ALIGN;
    if (dp->world > 1 && cfg->offload && cfg->zero_stage == 0) {
        glm_fail(err, "--offload_optimizer cpu with %d ranks needs --zero_stage 1 or 2", dp->world);
        return glm_hint(err, "each rank then keeps its shard of the optimizer state on the host (as DeepSpeed's ZeRO-Offload)");
    }
    if (dp->world > 1 && cfg->in_backward) {
        glm_fail(err, "--optimizer_in_backward runs in one process only (this launch has %d ranks)", dp->world);
        return glm_hint(err, "several ranks share the memory of the model states with --zero_stage 1/2 and --offload_optimizer cpu");
    }
    if (dp->world > 1) glm_signals_install();
    if (dp->world > 1 && dp->dist.mpi) {
#ifdef GLM_HAVE_MPI
        if (glm_comm_mpi(&dp->boot, err)) return -1;
        if (dp->boot->rank != dp->rank || dp->boot->world != dp->world)
            return glm_fail(err, "MPI says rank %d of %d but the %s environment says rank %d of %d", dp->boot->rank,
                            dp->boot->world, dp->dist.source, dp->rank, dp->world);
        dp->boot->timeout = cfg->timeout;
        dp->boot->interruptible = !cfg->save_on_interrupt;
#endif
    }
    dp->comm = dp->boot ? dp->boot : glm_comm_single();
    dp->comm->rank = dp->rank;
    return 0;
}

int glm_dp_redirect_log(glm_dp *dp, const char *output_dir, glm_err *err) {
    if (dp->rank == 0) {
        if (dp->world > 1) glm_info("data parallel: %d ranks (%s), ZeRO stage %d; ranks 1..%d log to %s/logs/", dp->world,
                                    dp->dist.source, dp->cfg.zero_stage, dp->world - 1, output_dir);
        return 0;
    }
    char dir[4096], path[4200];
    glm_path_join(dir, sizeof dir, output_dir, "logs");
    if (glm_mkdirs(dir, err)) return -1;
    snprintf(path, sizeof path, "%s/rank-%d.log", dir, dp->rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return glm_fail(err, "rank %d: cannot write its log %s", dp->rank, path);
    fflush(stderr);
    dp->saved_stderr = dup(2);
    dup2(fd, 2);
    close(fd);
    glm_info("rank %d of %d (%s launch, local rank %d, pid %d)", dp->rank, dp->world, dp->dist.source,
             dp->dist.local_rank, (int)getpid());
    return 0;
}

/* ---------------------------------------------------------------- GPU communicator */

static int open_nccl(glm_dp *dp, glm_err *err) {
#ifdef GLM_HAVE_CUDA
    unsigned char id[128] = {0};
    if (dp->rank == 0 && glm_nccl_unique_id(id, err)) return -1;
    if (dp->boot) {
        /* launched by mpirun: the id travels over MPI (as 32 floats of raw bytes) */
        float buf[32];
        memcpy(buf, id, sizeof buf);
        if (dp->boot->bcast(dp->boot, buf, 32, GLM_C_F32, 0, "nccl id", err) || dp->boot->wait(dp->boot, -1, err)) return -1;
        memcpy(id, buf, sizeof buf);
    } else {
        const char *addr = dp->dist.master_addr[0] ? dp->dist.master_addr : "127.0.0.1";
        if (dp->dist.master_port <= 0) {
            glm_fail(err, "rank %d: MASTER_PORT is not set (%s launch)", dp->rank, dp->dist.source);
            return glm_hint(err, "export MASTER_ADDR and MASTER_PORT, or start with glmtrain train --nproc_per_node N");
        }
        if (glm_rdzv_exchange(addr, dp->dist.master_port, dp->rank, dp->world, id, sizeof id, dp->cfg.timeout, err)) return -1;
    }
    glm_comm *nc;
    if (glm_comm_nccl(&nc, dp->rank, dp->world, id, glm_cuda_stream(dp->m->be), dp->cfg.timeout, err)) return -1;
    if (dp->comm != dp->boot) dp->comm->close(dp->comm);
    dp->comm = nc;
    return 0;
#else
    return glm_fail(err, "no GPU communicator in this build");
#endif
}

/* ---------------------------------------------------------------- buckets */

size_t glm_dp_piece(const glm_dp *dp, int rank, int i, size_t *lo, size_t *off) {
    const glm_dp_bucket *b = &dp->b[i];
    size_t n = (b->hi - b->lo) / (size_t)dp->world;
    *lo = b->lo + (size_t)rank * n;
    *off = b->lo / (size_t)dp->world; /* every bucket below this one gave 1/world of itself */
    return n;
}

glm_span *glm_dp_shard_spans(const glm_dp *dp) {
    glm_span *s = glm_malloc(sizeof *s * (size_t)dp->nb);
    for (int i = dp->nb - 1, j = 0; i >= 0; i--, j++) {
        size_t off;
        s[j].n = glm_dp_piece(dp, dp->rank, i, &s[j].lo, &off);
    }
    return s;
}

double glm_dp_shard_sumsq(glm_dp *dp, size_t skip) {
    glm_span *s = glm_dp_shard_spans(dp);
    for (int j = 0; j < dp->nb; j++) {
        size_t e = s[j].lo + s[j].n, lo = s[j].lo > skip ? s[j].lo : skip;
        s[j] = (glm_span){lo, e > lo ? e - lo : 0};
    }
    double r = dp->m->be->sumsq_spans(dp->m->be, dp->m->grads, s, dp->nb);
    free(s);
    return r;
}

/* Starts the reduction of bucket i: a reduce-scatter that leaves each rank the sum of its own
 * piece (ZeRO-0 all-gathers the sums back in the update, glm_dp_optimizer_step). Every rank
 * starts the same calls in the same order. */
static int start_bucket(glm_dp *dp, int i, glm_err *err) {
    glm_dp_bucket *b = &dp->b[i];
    b->started = 1;
    if (dp->peer) { glm_dp_peer_send(dp, i); return 0; }
    char what[64];
    snprintf(what, sizeof what, "gradient bucket %d", i);
    size_t n = (b->hi - b->lo) / (size_t)dp->world;
    void *buf = glm_at(dp->m->be, dp->m->grads, b->lo);
    if (dp->comm->reduce_scatter(dp->comm, buf, glm_at(dp->m->be, buf, (size_t)dp->rank * n), n, dp->gdt, what, err)) return -1;
    /* GLMTRAIN_DP_Z0_AG_BACKWARD=1 (ZeRO-0, an experiment): the sums come back at once, on the
     * same lane, so the update is AdamW alone */
    if (dp->cfg.zero_stage == 0 && dp->z0_ag_backward) {
        /* MPI requests on one buffer do not run in order: finish the reduce-scatter first */
        if (!dp->comm->ordered && dp->comm->wait(dp->comm, -1, err)) return -1;
        return dp->comm->allgather(dp->comm, buf, n, dp->gdt, what, err);
    }
    return 0;
}

static void on_grads_ready(void *ctx, size_t first) {
    glm_dp *dp = ctx;
    if (!dp->armed || dp->hook_failed) return;
    if (dp->zero2) {
        glm_dp_z2_ready(dp, first);
        return;
    }
    double t0 = glm_now();
    int started = 0;
    for (int i = 0; i < dp->nb && dp->b[i].lo >= first; i++) {
        if (dp->b[i].started) continue;
        if (!started) dp->last_batch = i;
        if (start_bucket(dp, i, &dp->hook_err)) { dp->hook_failed = 1; return; }
        started++;
    }
    dp->comm->poke(dp->comm);
    dp->hook_s += glm_now() - t0;
}

/* Buckets of at most bucket_mb from the end of the flat buffer; every size a multiple of
 * ALIGN * world (padded is one), so each splits into world aligned pieces. */
static void make_buckets(glm_dp *dp, size_t padded) {
    size_t es = glm_cdtype_size(dp->gdt), unit = dp->align * (size_t)dp->world;
    size_t cap = round_up((size_t)(dp->cfg.bucket_mb * 1048576.0 / es), unit);
    if (cap > ((size_t)1 << 30)) cap = ((size_t)1 << 30) / unit * unit;
    if (cap < unit) cap = unit;
    dp->nb = (int)((padded + cap - 1) / cap);
    dp->b = glm_calloc((size_t)dp->nb, sizeof *dp->b);
    for (int i = 0; i < dp->nb; i++) {
        dp->b[i].hi = padded - (size_t)i * cap;
        dp->b[i].lo = dp->b[i].hi > cap ? dp->b[i].hi - cap : 0;
    }
}

/* ---------------------------------------------------------------- setup */

/* AdamW state for this rank's shard only; the master copy starts from the (broadcast) weights. */
static void init_sharded_opt(glm_dp *dp, glm_adamw *o, float lr, float b1, float b2, float eps, float wd) {
    glm_adamw_alloc(o, dp->m, dp->cfg.optim, dp->cfg.offload, dp->shard, lr, b1, b2, eps, wd);
    for (int i = 0; i < dp->nb; i++) {
        size_t lo, off, n = glm_dp_piece(dp, dp->rank, i, &lo, &off);
        glm_adamw_master_from(o, dp->m, off, lo, n);
    }
}

void glm_dp_restart_optimizer(glm_dp *dp) {
    glm_adamw *o = dp->opt;
    glm_adamw_restart(o, dp->m);
    if (!dp->sharded) { glm_adamw_master_from(o, dp->m, 0, 0, dp->m->tab.total); return; }
    for (int i = 0; i < dp->nb; i++) { /* this rank's pieces, as init_sharded_opt fills them */
        size_t lo, off, n = glm_dp_piece(dp, dp->rank, i, &lo, &off);
        glm_adamw_master_from(o, dp->m, off, lo, n);
    }
}

int glm_dp_whole_grads(const glm_dp *dp, int whole_model) {
    if (dp->world == 1) return !(dp->cfg.in_backward || dp->cfg.offload); /* as attach_single */
    return !(dp->cfg.zero_stage >= 2 && whole_model);                      /* as glm_dp_attach's zero2 */
}

/* One process: the whole model's state, and the staging the options ask for. */
static int attach_single(glm_dp *dp, glm_model *m, glm_adamw *opt, float lr, float b1, float b2, float eps, float wd,
                         glm_err *err) {
    /* offloaded or updating in backward: units staged, no gradient buffer of the whole model */
    int staged = dp->cfg.in_backward || dp->cfg.offload;
    if (staged) glm_model_drop_grads(m); /* first: no moment with two copies of it */
    /* 8-bit states: every unit starts a block, so a step inside backward cuts the blocks the whole
     * model's step does (and either resumes the other's checkpoints exactly) */
    if (dp->align > ALIGN) glm_model_relayout(m, dp->align);
    glm_adamw_alloc(opt, m, dp->cfg.optim, dp->cfg.offload, m->tab.total, lr, b1, b2, eps, wd);
    glm_adamw_master_from(opt, m, 0, 0, m->tab.total);
    if (dp->cfg.offload) glm_dp_off_attach(dp, m->tab.total);
    if (staged && glm_dp_ib_attach(dp, err)) return -1;
    return 0;
}

int glm_dp_attach(glm_dp *dp, glm_model *m, glm_adamw *opt, float lr, float b1, float b2, float eps, float wd,
                  glm_err *err) {
    dp->m = m;
    dp->opt = opt;
    glm_backend *be = m->be;
    if (dp->world == 1) return attach_single(dp, m, opt, lr, b1, b2, eps, wd, err);
    int gpu = glm_backend_on_gpu(be);
    if (gpu) {
        /* a pipeline run hands in its stage's group communicator (parallel/pipe/pipe_train.c) */
        if (strcmp(dp->comm->kind, "nccl") != 0 && open_nccl(dp, err)) return -1;
    } else if (!dp->boot) {
        glm_fail(err, "rank %d: CPU ranks communicate through MPI, but this %s launch is not an MPI job", dp->rank, dp->dist.source);
#ifdef GLM_HAVE_MPI
        return glm_hint(err, "start CPU ranks with mpirun, or with glmtrain train --nproc_per_node N (which uses mpirun)");
#else
        return glm_hint(err, "this glmtrain was built without MPI; rebuild with make MPI=1");
#endif
    }
    dp->comm->timeout = dp->cfg.timeout;
    dp->comm->interruptible = !dp->cfg.save_on_interrupt;
    dp->gdt = be->dtype == GLM_F32 ? GLM_C_F32 : be->dtype == GLM_BF16 ? GLM_C_BF16 : GLM_C_F16;
    dp->zero2 = dp->cfg.zero_stage >= 2 && m->first && m->last; /* ZeRO-3 stages gradients as ZeRO-2 */
    if (dp->cfg.zero_stage == 3 && !dp->zero2)
        return glm_fail(err, "--zero_stage 3 does not combine with pipeline stages"),
               glm_hint(err, "use --zero_stage 1 or 2 with --pipeline_parallel_size");
    if (dp->cfg.zero_stage == 2 && !dp->zero2) glm_info("--zero_stage 2 with pipeline stages: gradients stay whole (stage 1)");
    if (dp->zero2 && glm_dp_z2_attach(dp, err)) return -1;
    size_t padded = dp->zero2 ? m->tab.total : round_up(m->tab.total, dp->align * (size_t)dp->world);
    if (!dp->zero2) {
        dp->shard = padded / (size_t)dp->world;
        glm_model_reserve_flat(m, padded);
        make_buckets(dp, padded);
    }
    if (dp->comm->register_buffer) {
        size_t bytes = padded * glm_cdtype_size(dp->gdt);
        dp->comm->register_buffer(dp->comm, m->params, bytes);
        if (m->grads) dp->comm->register_buffer(dp->comm, m->grads, bytes);
    }
    /* the same start on every rank, whatever each rank's initialisation did */
    if (dp->comm->bcast(dp->comm, m->params, padded, dp->gdt, 0, "initial parameters", err) ||
        dp->comm->wait(dp->comm, -1, err))
        return -1;
    if (gpu && glm_dp_peer_open(dp, err)) return -1;
    m->grads_ready = on_grads_ready;
    m->grads_ready_ctx = dp;
    dp->sharded = dp->cfg.zero_stage >= 1;
    if (dp->sharded) {
        init_sharded_opt(dp, opt, lr, b1, b2, eps, wd);
        if (dp->cfg.offload) glm_dp_off_attach(dp, dp->shard);
        if (dp->cfg.zero_stage == 3 && glm_dp_z3_attach(dp, err)) return -1;
    } else {
        glm_adamw_alloc(opt, m, dp->cfg.optim, 0, m->tab.total, lr, b1, b2, eps, wd);
        glm_adamw_master_from(opt, m, 0, 0, m->tab.total);
    }
    glm_info("data parallel: %s communicator, %d gradient buckets of <= %.1f MiB, shard %zu elements per rank%s",
             dp->comm->kind, dp->nb, dp->cfg.bucket_mb, dp->shard, dp->sharded ? " (optimizer state sharded)" : "");
    return 0;
}

/* ---------------------------------------------------------------- per step */

void glm_dp_set_step(glm_dp *dp, long step) {
    dp->comm->step = step;
    if (dp->boot) dp->boot->step = step;
}

int glm_dp_sum(glm_dp *dp, double *v, int n, const char *what, glm_err *err) {
    if (dp->world == 1) return 0;
    return dp->comm->sum_host(dp->comm, v, n, -1, what, err);
}

int glm_dp_sum_long(glm_dp *dp, double *v, int n, const char *what, glm_err *err) {
    if (dp->world == 1) return 0;
    /* rank 0 may be building the data cache or writing a checkpoint meanwhile */
    double t = dp->cfg.timeout > 3600 ? dp->cfg.timeout : 3600;
    return dp->comm->sum_host(dp->comm, v, n, t, what, err);
}

void glm_dp_micro_begin(glm_dp *dp, int last) {
    if (dp->ib) { glm_dp_ib_micro(dp); return; }
    if (dp->zero2) { /* every micro-batch's gradients are reduce-scattered as backward makes them */
        dp->armed = 1;
        glm_dp_z2_micro_begin(dp);
        return;
    }
    dp->armed = dp->world > 1 && last && !dp->no_overlap;
}

void glm_dp_begin_step(glm_dp *dp, float lr, int backward) {
    if (dp->ib) glm_dp_ib_begin(dp, lr, backward);
}

void glm_dp_zero_grads(glm_dp *dp) {
    if (!dp->zero2 && !dp->ib) glm_zero_grads(dp->m);
}

int glm_dp_reduce_grads(glm_dp *dp, glm_err *err) {
    if (dp->ib) return glm_dp_ib_finish(dp, &dp->ib_ss, err);
    if (dp->world == 1) return 0;
    dp->armed = 0;
    if (dp->debug && dp->rank == 0) glm_info("backward: host time in bucket starts %.2f ms", 1e3 * dp->hook_s);
    dp->hook_s = 0;
    int rc = 0;
    if (dp->hook_failed) { *err = dp->hook_err; rc = -1; }
    if (dp->zero2) {
        if (rc == 0) rc = glm_dp_z2_finish(dp, err);
    } else {
        for (int i = 0, any = 0; i < dp->nb && rc == 0; i++)
            if (!dp->b[i].started) {
                if (!any++) dp->last_batch = i;
                rc = start_bucket(dp, i, err);
            }
        if (rc == 0 && dp->peer) rc = glm_dp_peer_reduce(dp, dp->last_batch, err);
    }
    if (rc == 0) rc = dp->comm->wait(dp->comm, -1, err);
    for (int i = 0; i < dp->nb; i++) dp->b[i].started = 0;
    return rc;
}

int glm_dp_grad_norm(glm_dp *dp, float grad_scale, double *loss_sum, double *norm, glm_err *err) {
    glm_model *m = dp->m;
    if (dp->ib) { *norm = sqrt(dp->ib_ss) * grad_scale; return 0; }
    if (dp->world == 1) { *norm = glm_grad_norm(m, grad_scale); return 0; }
    /* each rank squares its shard (under ZeRO the only part reduced there); padding is zero */
    glm_backend *be = m->be;
    double v[2] = {*loss_sum, dp->zero2  ? be->sumsq(be, dp->z2.sg, dp->shard)
                              : dp->peer ? glm_dp_peer_sumsq(dp) /* the adds computed it */
                                         : glm_dp_shard_sumsq(dp, 0)};
    if (dp->comm->sum_host(dp->comm, v, 2, -1, "loss and gradient norm", err)) return -1;
    *loss_sum = v[0];
    *norm = sqrt(v[1]) * grad_scale;
    return 0;
}

/* AdamW on flat [lo, hi), whose optimizer state sits at index k0 (on the device, or on the host
 * when offloaded: the new weights then come back by a copy glm_dp_off_done orders). */
static void adamw_range(glm_dp *dp, size_t lo, size_t hi, size_t k0, float lr, float gs, float bc1, float bc2) {
    glm_model *m = dp->m;
    glm_backend *be = m->be;
    const void *g = dp->zero2 ? glm_at(be, dp->z2.sg, k0) : glm_at(be, m->grads, lo); /* ZeRO-2: the shard's own */
    void *p = dp->z3 ? glm_dp_z3_shard(dp, k0) : glm_at(be, m->params, lo); /* ZeRO-3: the weights' shard */
    if (dp->opt->host) glm_dp_off_update(dp, lo, hi, k0, p, g, lr, gs, bc1, bc2);
    else glm_adamw_update(dp->opt, m, lo, hi, k0, p, g, lr, gs, bc1, bc2);
}

/* The update when the all-gathers go by copies (dp_peer.c). ZeRO-0: each rank sends its summed
 * pieces bucket by bucket and each bucket's AdamW waits for the peers' pieces of it; ZeRO-1:
 * each piece's updated parameters go to the peers as soon as its AdamW is done. */
static int peer_update(glm_dp *dp, float lr, float gs, float bc1, float bc2, glm_err *err) {
    unsigned t = glm_dp_peer_step(dp), last;
    if (!dp->sharded) {
        unsigned v0 = (t - 1) * (unsigned)dp->nb;
        for (int i = dp->nb - 1, k = 0; i >= 0; i--, k++) glm_dp_peer_put(dp, 0, i, v0 + (unsigned)k + 1);
        for (int i = dp->nb - 1, k = 0; i >= 0; i--, k++) {
            glm_dp_peer_wait_gathered(dp, v0 + (unsigned)k + 1);
            adamw_range(dp, dp->b[i].lo, dp->b[i].hi, dp->b[i].lo, lr, gs, bc1, bc2);
        }
        last = v0 + (unsigned)dp->nb;
    } else {
        for (int i = dp->nb - 1; i >= 0; i--) {
            size_t lo, off, n = glm_dp_piece(dp, dp->rank, i, &lo, &off);
            adamw_range(dp, lo, lo + n, off, lr, gs, bc1, bc2);
            glm_dp_peer_put(dp, 1, i, 0);
        }
        glm_dp_peer_put(dp, 1, -1, t);
        glm_dp_peer_wait_gathered(dp, t);
        last = t;
    }
    return glm_dp_peer_end_update(dp, last, err);
}

int glm_dp_optimizer_step(glm_dp *dp, float lr, float grad_scale, glm_err *err) {
    glm_model *m = dp->m;
    glm_adamw *o = dp->opt;
    if (dp->ib && dp->cfg.in_backward) return 0; /* done during backward */
    if (dp->ib) return glm_dp_ib_step(dp, lr, grad_scale);
    if (dp->world == 1 && !o->host) { glm_adamw_step(o, m, lr, grad_scale); return 0; }
    glm_backend *be = m->be;
    o->step++;
    float bc1, bc2;
    glm_adamw_corrections(o, &bc1, &bc2);

    double t0 = glm_now();
    char what[64];
    if (glm_dp_peer_gathers(dp)) return peer_update(dp, lr, grad_scale, bc1, bc2, err);
    if (!dp->sharded && dp->z0_ag_backward && !dp->peer && !o->galore) {
        for (int i = dp->nb - 1; i >= 0; i--) adamw_range(dp, dp->b[i].lo, dp->b[i].hi, dp->b[i].lo, lr, grad_scale, bc1, bc2);
    } else if (!dp->sharded) {
        /* ZeRO-0: backward left each rank the sum of its own pieces; the whole gradient comes back
         * by an all-gather per bucket, and each bucket's AdamW waits (on the device) for its own,
         * so the AdamW of the whole model hides the all-gathers. They need nothing from the
         * compute stream (the sums are final), so each starts at once: AdamW never waits for the
         * host to issue the next all-gather. */
        for (int i = dp->nb - 1, k = 0; i >= 0; i--, k++) {
            /* after copies, the sums come from adds on the compute stream: the first waits for them */
            dp->comm->detached = !dp->peer || k > 0;
            snprintf(what, sizeof what, "gradient bucket %d", i);
            if (dp->comm->allgather(dp->comm, glm_at(be, m->grads, dp->b[i].lo), (dp->b[i].hi - dp->b[i].lo) / (size_t)dp->world,
                                    dp->gdt, what, err) ||
                dp->comm->fence(dp->comm, k, err)) {
                dp->comm->detached = 0;
                return -1;
            }
            if (!o->galore) adamw_range(dp, dp->b[i].lo, dp->b[i].hi, dp->b[i].lo, lr, grad_scale, bc1, bc2);
        }
        dp->comm->detached = 0;
        if (o->galore) { /* GaLore updates a projected row whole, from the whole sum of its gradient */
            if (dp->comm->wait(dp->comm, -1, err)) return -1;
            glm_adamw_update(o, m, 0, m->tab.total, 0, m->params, m->grads, lr, grad_scale, bc1, bc2);
        }
    } else {
        /* ZeRO-1/2: each rank updates its own pieces, in flat order, and a bucket's parameters are
         * all-gathered as soon as its piece is updated */
        for (int i = dp->nb - 1; i >= 0; i--) {
            size_t lo, off, n = glm_dp_piece(dp, dp->rank, i, &lo, &off);
            adamw_range(dp, lo, lo + n, off, lr, grad_scale, bc1, bc2);
            glm_dp_off_done(dp); /* offloaded: the all-gather reads what came back */
            if (dp->z3) continue; /* the weights stay sharded; each unit is gathered when it is needed */
            snprintf(what, sizeof what, "updated parameters of bucket %d", i);
            if (dp->comm->allgather(dp->comm, glm_at(be, m->params, dp->b[i].lo), n, dp->gdt, what, err)) return -1;
        }
    }
    glm_dp_z3_updated(dp);
    double t1 = glm_now();
    int rc = dp->comm->wait(dp->comm, -1, err);
    if (dp->debug && dp->rank == 0)
        glm_info("update: host enqueue %.2f ms, wait %.2f ms", 1e3 * (t1 - t0), 1e3 * (glm_now() - t1));
    return rc;
}

void glm_dp_close(glm_dp *dp, int ok) {
    if (!dp) return;
    if (!ok) {
        if (dp->comm) dp->comm->broken = 1;
        if (dp->boot) dp->boot->broken = 1;
    }
    glm_dp_peer_free(dp);
    if (dp->comm && dp->comm != dp->boot) dp->comm->close(dp->comm);
    if (dp->boot) dp->boot->close(dp->boot);
    if (dp->m) glm_dp_z3_free(dp);
    glm_dp_z2_free(dp);
    if (dp->m) glm_dp_ib_free(dp);
    glm_dp_off_free(dp);
    if (dp->m) { dp->m->grads_ready = NULL; dp->m->grads_ready_ctx = NULL; dp->m->grads_unit = NULL; dp->m->grads_unit_ctx = NULL; }
    if (dp->saved_stderr >= 0) {
        fflush(stderr);
        dup2(dp->saved_stderr, 2);
        close(dp->saved_stderr);
    }
    free(dp->b);
    free(dp);
}
