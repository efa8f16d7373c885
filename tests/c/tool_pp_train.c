/* Driver for the pipeline tests (tests/sh/test_pipeline.sh): trains a tiny random GLM on
 * synthetic micro-batches and prints "step S loss L norm N" per optimizer step (rank 0).
 *
 *   tool_pp_train [--pp P] [--steps N] [--micro K] [--tie 0|1] [--ckpt 0|1|2 (none, full, selective)] [--map SPEC]
 *                 [--save_at S --out DIR] [--resume DIR] [--timeout SEC --hang_rank R]
 *
 * Alone (no mpirun) it is the single-process reference: the whole model, every micro-batch of
 * the global batch through glm_forward_backward. Under mpirun -np P*D it runs P stages x D
 * replicas: the 1F1B schedule, the tied-head gradient sum, a data-parallel all-reduce per
 * stage, the global norm and AdamW per stage. Global micro-batch j of step s is the same in
 * every layout (replica d takes j = d*K .. d*K+K-1), so every layout must print the same curve.
 * Checkpoints: the single-process format alone, the pipeline's shards under mpirun; either
 * resumes in any layout. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "core/rng.h"
#include "model/glm.h"
#include "optim/adamw.h"
#include "parallel/pipe/pipe_ckpt.h"
#include "parallel/pipe/pipeline.h"
#include "ckpt/checkpoint.h"
#ifdef GLM_HAVE_MPI
#include "parallel/comm/comm.h"
#endif

static glm_config tiny_config(int tie) {
    return (glm_config){.vocab_size = 40, .hidden_size = 32, .num_layers = 5, .num_attention_heads = 4,
                        .inner_hidden_size = 64, .max_sequence_length = 64, .layernorm_epsilon = 1e-5f,
                        .position_encoding_2d = 1, .tie_word_embeddings = tie, .bos_token_id = 37,
                        .eos_token_id = 38, .mask_token_id = 35, .gmask_token_id = 36, .pad_token_id = 3,
                        .alpha = 7.483314773547883f};
}

/* Global micro-batch j of step s: 2 rows of prompt + [gMASK] <sop> + answer + <eop>, lengths
 * and so the padded T vary from batch to batch. */
static void make_micro(glm_batch *b, const glm_config *c, long s, int j) {
    glm_rng rng;
    glm_rng_seed(&rng, 1000003ULL * (uint64_t)s + (uint64_t)j + 17);
    int la[2], lb[2], T = 0;
    for (int r = 0; r < 2; r++) {
        la[r] = 1 + (int)glm_rng_below(&rng, 6);
        lb[r] = 1 + (int)glm_rng_below(&rng, 6);
        if (la[r] + lb[r] + 3 > T) T = la[r] + lb[r] + 3;
    }
    glm_batch_alloc(b, 2, T);
    for (int r = 0; r < 2; r++) {
        int32_t ids[32], lab[32], n = 0;
        for (int i = 0; i < la[r]; i++) ids[n++] = 4 + (int)glm_rng_below(&rng, 30);
        ids[n++] = c->gmask_token_id;
        int ctx = n;
        ids[n++] = c->bos_token_id;
        /* a learnable answer: the prompt's tokens shifted by one */
        for (int i = 0; i < lb[r]; i++) ids[n++] = 4 + (ids[i % la[r]] - 4 + 1) % 30;
        ids[n++] = c->eos_token_id;
        for (int i = 0; i < n; i++) lab[i] = i < ctx ? -100 : ids[i];
        glm_batch_set_row(b, r, ids, lab, n, c->pad_token_id, c->gmask_token_id, c->mask_token_id, c->bos_token_id);
    }
    glm_batch_count_targets(b);
}

typedef struct opts {
    int pp, steps, micro, tie, ckpt, save_at, hang_rank;
    double timeout;
    const char *map, *out, *resume;
} opts;

static int parse(opts *o, int argc, char **argv) {
    *o = (opts){.pp = 1, .steps = 20, .micro = 4, .tie = 1, .map = "auto", .hang_rank = -1, .timeout = 60};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--pp")) o->pp = atoi(v);
        else if (!strcmp(k, "--steps")) o->steps = atoi(v);
        else if (!strcmp(k, "--micro")) o->micro = atoi(v);
        else if (!strcmp(k, "--tie")) o->tie = atoi(v);
        else if (!strcmp(k, "--ckpt")) o->ckpt = atoi(v);
        else if (!strcmp(k, "--map")) o->map = v;
        else if (!strcmp(k, "--save_at")) o->save_at = atoi(v);
        else if (!strcmp(k, "--out")) o->out = v;
        else if (!strcmp(k, "--resume")) o->resume = v;
        else if (!strcmp(k, "--timeout")) o->timeout = atof(v);
        else if (!strcmp(k, "--hang_rank")) o->hang_rank = atoi(v);
        else { fprintf(stderr, "unknown flag %s\n", k); return -1; }
    }
    return 0;
}

#define LR 3e-3f
#define MAX_NORM 1.0f

/* ---------------------------------------------------------------- single process */

static int run_single(const opts *o, glm_err *err) {
    glm_config c = tiny_config(o->tie);
    glm_backend *be = glm_backend_cpu();
    glm_model m;
    glm_model_init(&m, &c, be);
    m.gradient_checkpointing = o->ckpt;
    glm_model_init_random(&m, 5, 0.2f);
    glm_adamw opt;
    glm_adamw_init(&opt, &m, LR, 0.9f, 0.999f, 1e-8f, 0.01f);
    glm_train_state st = {0};
    if (o->resume && glm_checkpoint_load(o->resume, &m, &opt, &st, err)) return -1;
    int D = 1, K = o->micro; /* the reference takes the whole global batch: D * K of the layout */
    const char *dv = getenv("PP_TEST_D");
    if (dv) D = atoi(dv);
    glm_batch *mb = calloc((size_t)D * K, sizeof *mb);
    for (long s = st.global_step; s < o->steps; s++) {
        long n_sup = 0;
        for (int j = 0; j < D * K; j++) { make_micro(&mb[j], &c, s, j); n_sup += mb[j].n_targets; }
        glm_zero_grads(&m);
        double loss = 0;
        for (int j = 0; j < D * K; j++) loss += glm_forward_backward(&m, &mb[j], 1.0f / n_sup);
        double norm = glm_grad_norm(&m, 1.0f);
        glm_adamw_step(&opt, &m, LR, glm_clip_coef(norm, MAX_NORM));
        printf("step %ld loss %.10e norm %.10e\n", s + 1, loss / n_sup, norm);
        for (int j = 0; j < D * K; j++) glm_batch_free(&mb[j]);
        st.global_step = s + 1;
        if (o->out && s + 1 == o->save_at && glm_checkpoint_save(o->out, &m, &opt, &st, NULL, NULL, err)) return -1;
    }
    free(mb);
    glm_adamw_free(&opt, &m);
    glm_model_free(&m);
    be->destroy(be);
    return 0;
}

/* ---------------------------------------------------------------- pipeline */

#ifdef GLM_HAVE_MPI
static int host_opt_state(glm_model *m, const glm_adamw *a, glm_opt_state *o) {
    size_t n = m->tab.total;
    *o = (glm_opt_state){.lo = 0, .hi = n, .m = malloc(n * 4), .v = malloc(n * 4), .step = a->step};
    m->be->download(m->be, o->m, a->m, n * 4);
    m->be->download(m->be, o->v, a->v, n * 4);
    return 0;
}

static int run_pipeline(const opts *o, glm_comm *wc, glm_err *err) {
    glm_config c = tiny_config(o->tie);
    glm_comm *world;
    if (glm_comm_mpi_split(wc, 0, wc->rank, &world, err)) return -1; /* the pipeline's own communicator */
    world->timeout = o->timeout;
    glm_stage_shape sh;
    glm_stage_shape_init(&sh);
    sh.B = 2; sh.T = 16; sh.n_micro = o->micro; sh.gradient_checkpointing = o->ckpt;
    glm_device_map map;
    glm_pipe p;
    if (glm_device_map_make(&map, o->map, o->pp, &c, &sh, err) || glm_pipe_init(&p, world, &map, &c, err)) return -1;
    glm_backend *be = glm_backend_cpu();
    glm_model m;
    glm_pipe_model_init(&p, &m, &c, be);
    m.gradient_checkpointing = o->ckpt;
    glm_model_init_random(&m, 5, 0.2f);
    glm_adamw opt;
    glm_adamw_init(&opt, &m, LR, 0.9f, 0.999f, 1e-8f, 0.01f);
    glm_train_state st = {0};
    if (o->resume) {
        size_t n = m.tab.total;
        glm_opt_state os = {.lo = 0, .hi = n, .m = malloc(n * 4), .v = malloc(n * 4)};
        if (glm_checkpoint_load_state(o->resume, &m, &os, &st, err)) return -1;
        be->upload(be, opt.m, os.m, n * 4);
        be->upload(be, opt.v, os.v, n * 4);
        opt.step = os.step;
        free(os.m); free(os.v);
    }
    if (glm_pipe_sync_tied(&p, err)) return -1;
    int K = o->micro, D = p.D;
    glm_batch *mb = calloc((size_t)K, sizeof *mb);
    for (long s = st.global_step; s < o->steps; s++) {
        p.step = s;
        if (world->rank == o->hang_rank && s == 2) sleep(10 * (unsigned)o->timeout + 30); /* a stuck rank */
        long n_sup = 0;
        for (int j = 0; j < D * K; j++) { /* every rank counts the global batch's targets */
            glm_batch b;
            make_micro(&b, &c, s, j);
            n_sup += b.n_targets;
            glm_batch_free(&b);
        }
        for (int i = 0; i < K; i++) make_micro(&mb[i], &c, s, p.replica * K + i);
        glm_zero_grads(&m);
        double loss = 0;
        if (glm_pipe_forward_backward(&p, mb, K, 1.0f / n_sup, &loss, err) || glm_pipe_reduce_tied(&p, err) ||
            glm_pipe_dp_allreduce(&p, err))
            return -1;
        /* replicas hold the same gradients now: replica 0 counts the norm, every last stage its loss */
        size_t skip = glm_pipe_grad_skip(&p);
        double v[2] = {loss, p.replica == 0 ? m.be->sumsq(m.be, glm_at(m.be, m.grads, skip), m.tab.total - skip) : 0};
        if (world->sum_host(world, v, 2, -1, "loss and norm", err)) return -1;
        double norm = sqrt(v[1]);
        glm_adamw_step(&opt, &m, LR, glm_clip_coef(norm, MAX_NORM));
        if (world->rank == 0) printf("step %ld loss %.10e norm %.10e\n", s + 1, v[0] / n_sup, norm);
        for (int i = 0; i < K; i++) glm_batch_free(&mb[i]);
        st.global_step = s + 1;
        if (o->out && s + 1 == o->save_at) {
            glm_opt_state os = {0};
            if (p.replica == 0) host_opt_state(&m, &opt, &os);
            int rc = glm_pipe_checkpoint_save(&p, o->out, p.replica == 0 ? &os : NULL, &st, NULL, NULL, err);
            free(os.m); free(os.v);
            if (rc) return -1;
        }
    }
    free(mb);
    glm_adamw_free(&opt, &m);
    glm_pipe_free(&p);
    glm_model_free(&m);
    be->destroy(be);
    world->close(world);
    (void)wc;
    return 0;
}
#endif

int main(int argc, char **argv) {
    opts o;
    if (parse(&o, argc, argv)) return 2;
    glm_err err = {0};
    int rc;
    if (!getenv("OMPI_COMM_WORLD_SIZE")) {
        rc = run_single(&o, &err);
    } else {
#ifdef GLM_HAVE_MPI
        glm_comm *wc;
        rc = glm_comm_mpi(&wc, &err);
        if (rc == 0) {
            rc = run_pipeline(&o, wc, &err);
            if (rc) wc->broken = 1;
            wc->close(wc);
        }
#else
        printf("SKIP pipeline: built without MPI\n");
        return 0;
#endif
    }
    if (rc) { glm_err_print(&err); return 1; }
    fflush(stdout);
    return 0;
}
