#include "parallel/pipe/pipeline.h"
#include <stdlib.h>
#include <string.h>
#include "core/log.h"

static glm_cdtype cdtype(const glm_backend *be) {
    return be->dtype == GLM_F32 ? GLM_C_F32 : be->dtype == GLM_BF16 ? GLM_C_BF16 : GLM_C_F16;
}
static int rank_of(const glm_pipe *p, int stage) { return p->replica * p->P + stage; }
static int is_first(const glm_pipe *p) { return p->stage == 0; }
static int is_last(const glm_pipe *p) { return p->stage == p->P - 1; }
/* the last stage holds its own copy of a tied embedding */
static int tied_split(const glm_pipe *p) { return p->P > 1 && p->m && p->m->cfg.tie_word_embeddings; }

int glm_pipe_init(glm_pipe *p, glm_comm *world, const glm_device_map *map, const glm_config *c, glm_err *err) {
    *p = (glm_pipe){.map = *map, .P = map->n, .world = world};
    if (world->world % map->n) {
        glm_fail(err, "%d ranks cannot be split into pipelines of %d stages", world->world, map->n);
        return glm_hint(err, "launch --pipeline_parallel_size x (data-parallel replicas) processes");
    }
    p->D = world->world / map->n;
    p->stage = world->rank % p->P;
    p->replica = world->rank / p->P;
    int ends = p->P > 1 && (is_first(p) || is_last(p));
    /* the splits are collective over the world, so every rank makes each call */
    if (world->split(world, ends ? p->replica : -1, p->stage, &p->tied, err)) return -1;
    if (world->split(world, p->D > 1 ? p->stage : -1, p->replica, &p->dp, err)) return -1;
    if (world->split(world, p->P > 1 && c->peft.pre_seq_len > 0 ? p->replica : -1, p->stage, &p->stages, err)) return -1;
    return 0;
}

const glm_stage *glm_pipe_my_stage(const glm_pipe *p) { return &p->map.s[p->stage]; }

void glm_pipe_model_init(glm_pipe *p, glm_model *m, const glm_config *c, glm_backend *be) {
    const glm_stage *s = glm_pipe_my_stage(p);
    glm_model_init_stage(m, c, be, s->l0, s->l1, s->embed, s->head);
    p->m = m;
}

static void free_bufs(glm_pipe *p) {
    glm_backend *be = p->m ? p->m->be : NULL;
    if (!be) return;
    for (int i = 0; i < p->n_stash; i++) be->free(be, p->stash[i]);
    free(p->stash);
    void *b[] = {p->h_out, p->dh_out, p->dh_in};
    for (int i = 0; i < 3; i++) if (b[i]) be->free(be, b[i]);
    p->stash = NULL;
    p->n_stash = p->slots = 0;
    p->h_out = p->dh_out = p->dh_in = NULL;
    p->cap = 0;
}

void glm_pipe_free(glm_pipe *p) {
    free_bufs(p);
    if (p->tied) p->tied->close(p->tied);
    if (p->dp) p->dp->close(p->dp);
    if (p->stages) p->stages->close(p->stages);
    p->tied = p->dp = p->stages = NULL;
}

/* Buffers for `slots` stashed inputs of up to n elements each (only what this stage uses). */
static void ensure_bufs(glm_pipe *p, int slots, size_t n) {
    if (n <= p->cap && slots <= p->slots) return;
    free_bufs(p);
    glm_backend *be = p->m->be;
    size_t bytes = n * glm_dtype_size(be->dtype);
    p->cap = n;
    p->slots = slots;
    if (!is_first(p)) {
        p->n_stash = slots;
        p->stash = glm_calloc((size_t)slots, sizeof(void *));
        for (int i = 0; i < slots; i++) p->stash[i] = be->alloc(be, bytes);
        p->dh_in = be->alloc(be, bytes);
    }
    if (!is_last(p)) {
        p->h_out = be->alloc(be, bytes);
        p->dh_out = be->alloc(be, bytes);
    }
}

static size_t hid_bytes(const glm_pipe *p, const glm_batch *b) {
    return (size_t)b->B * b->T * p->m->cfg.hidden_size * glm_dtype_size(p->m->be->dtype);
}

/* ---------------------------------------------------------------- the schedule */

typedef struct sched {
    glm_pipe *p;
    const glm_batch *mb;
    float dscale;
    double loss;
    int K;           /* stash slots */
    int k;           /* micro-batches */
    glm_err *err;
} sched;

static void *slot(sched *s, int i) { return is_first(s->p) ? NULL : s->p->stash[i % s->K]; }

/* One exchange with a neighbour; a stage at the end of the pipeline skips the missing side. */
static int xchg(sched *s, const void *sb, size_t sn, int to_stage, void *rb, size_t rn, int from_stage, const char *what) {
    glm_pipe *p = s->p;
    int to = to_stage >= 0 && to_stage < p->P ? rank_of(p, to_stage) : -1;
    int from = from_stage >= 0 && from_stage < p->P ? rank_of(p, from_stage) : -1;
    if (to < 0 && from < 0) return 0;
    p->world->step = p->step;
    return p->world->exchange(p->world, sb, sn, to, rb, rn, from, 0, what, s->err);
}

static void compute_done(sched *s, double t0) {
    s->p->m->be->sync(s->p->m->be);
    s->p->busy_s += glm_now() - t0;
}

static int recv_forward(sched *s, int i) {
    return xchg(s, NULL, 0, -1, slot(s, i), hid_bytes(s->p, &s->mb[i]), s->p->stage - 1, "receive activations");
}

/* A non-last stage's forward of micro-batch i (the input is in its slot). */
/* Micro-batch i's dropout masks, as the training loop draws them for one process. */
static void masks_for(glm_pipe *p, int i) {
    glm_model_set_dropout_seed(p->m, glm_dropout_seed(p->run_seed, p->step - 1, p->replica, i));
}

static void forward(sched *s, int i) {
    double t0 = glm_now();
    masks_for(s->p, i);
    glm_stage_forward(s->p->m, &s->mb[i], slot(s, i), s->p->h_out);
    compute_done(s, t0);
}

/* Backward of micro-batch i: dh_out holds its output gradient (nothing on the last stage). */
static void backward(sched *s, int i) {
    glm_pipe *p = s->p;
    if (p->before_backward) p->before_backward(p->hook_ctx, i == s->k - 1);
    double t0 = glm_now();
    masks_for(p, i); /* backward recomputes the forward: the same masks */
    s->loss += glm_stage_backward(p->m, &s->mb[i], slot(s, i), is_last(p) ? NULL : p->dh_out,
                                  is_first(p) ? NULL : p->dh_in, s->dscale);
    compute_done(s, t0);
}

int glm_pipe_forward_backward(glm_pipe *p, const glm_batch *mb, int k, float dscale, double *loss_sum, glm_err *err) {
    double t_start = glm_now();
    p->busy_s = 0;
    *loss_sum = 0;
    if (k <= 0) return 0;
    size_t n = 0;
    for (int i = 0; i < k; i++)
        if ((size_t)mb[i].B * mb[i].T > n) n = (size_t)mb[i].B * mb[i].T;
    int K = p->P - p->stage < k ? p->P - p->stage : k;
    ensure_bufs(p, K, n * p->m->cfg.hidden_size);
    sched s = {.p = p, .mb = mb, .dscale = dscale, .K = K, .k = k, .err = err};
    int up = p->stage - 1, down = p->stage + 1;
    int warm = p->P - p->stage - 1 < k ? p->P - p->stage - 1 : k, rem = k - warm, f = 0, b = 0;
    for (int w = 0; w < warm; w++, f++) {
        if (recv_forward(&s, f)) return -1;
        forward(&s, f);
        if (xchg(&s, p->h_out, hid_bytes(p, &mb[f]), down, NULL, 0, -1, "send activations")) return -1;
    }
    if (rem > 0 && recv_forward(&s, f)) return -1;
    for (int r = 0; r < rem; r++, f++, b++) {
        if (!is_last(p)) {
            forward(&s, f);
            /* send this forward's output, receive the oldest micro-batch's output gradient */
            if (xchg(&s, p->h_out, hid_bytes(p, &mb[f]), down, p->dh_out, hid_bytes(p, &mb[b]), down,
                     "send activations / receive gradients"))
                return -1;
        }
        backward(&s, b);
        if (r == rem - 1) {
            if (xchg(&s, p->dh_in, hid_bytes(p, &mb[b]), up, NULL, 0, -1, "send gradients")) return -1;
        } else if (xchg(&s, p->dh_in, hid_bytes(p, &mb[b]), up, slot(&s, f + 1), hid_bytes(p, &mb[f + 1]), up,
                        "send gradients / receive activations")) {
            return -1;
        }
    }
    for (int w = 0; w < warm; w++, b++) {
        if (xchg(&s, NULL, 0, -1, p->dh_out, hid_bytes(p, &mb[b]), down, "receive gradients")) return -1;
        backward(&s, b);
        if (xchg(&s, p->dh_in, hid_bytes(p, &mb[b]), up, NULL, 0, -1, "send gradients")) return -1;
    }
    *loss_sum = s.loss;
    p->step_s = glm_now() - t_start;
    return 0;
}

int glm_pipe_forward_loss(glm_pipe *p, const glm_batch *b, double *loss_sum, glm_err *err) {
    *loss_sum = 0;
    ensure_bufs(p, 1, (size_t)b->B * b->T * p->m->cfg.hidden_size);
    sched s = {.p = p, .mb = b, .K = 1, .err = err};
    if (recv_forward(&s, 0)) return -1;
    if (is_last(p)) {
        *loss_sum = glm_stage_loss(p->m, b, slot(&s, 0));
        return 0;
    }
    glm_stage_forward_eval(p->m, b, slot(&s, 0), p->h_out);
    return xchg(&s, p->h_out, hid_bytes(p, b), p->stage + 1, NULL, 0, -1, "send activations");
}

/* ---------------------------------------------------------------- tied head, gradients */

int glm_pipe_sync_tied(glm_pipe *p, glm_err *err) {
    if (!tied_split(p) || !(is_first(p) || is_last(p))) return 0;
    if (!p->tied)
        return glm_fail(err, "rank %d: stage %d holds a tied embedding but has no communicator to copy it",
                        p->world->rank, p->stage);
    /* trainable (full fine-tuning) or frozen (LoRA, freeze): either way both copies start equal */
    const glm_tensor *t = glm_table_get(&p->m->tab, -1, T_WORD_EMB);
    void *w = t ? glm_at(p->m->be, p->m->params, t->offset) : NULL;
    if (!t) {
        t = glm_table_get(&p->m->ftab, -1, T_WORD_EMB);
        if (!t) return glm_fail(err, "rank %d: stage %d holds a tied embedding the model has no row for", p->world->rank, p->stage);
        w = glm_at(p->m->be, p->m->fparams, t->offset);
    }
    size_t bytes = t->numel * glm_dtype_size(p->m->be->dtype);
    /* in the two-rank communicator the first stage is rank 0 (split key = stage) */
    return is_first(p) ? p->tied->exchange(p->tied, w, bytes, 1, NULL, 0, -1, 0, "tied embedding copy", err)
                       : p->tied->exchange(p->tied, NULL, 0, -1, w, bytes, 0, 0, "tied embedding copy", err);
}

int glm_pipe_reduce_tied(glm_pipe *p, glm_err *err) {
    if (!tied_split(p) || !(is_first(p) || is_last(p))) return 0;
    if (!p->tied) /* never silently: each copy would then train on half of its gradient */
        return glm_fail(err, "rank %d: stage %d holds a tied embedding but has no communicator to sum its gradient",
                        p->world->rank, p->stage);
    const glm_tensor *t = glm_table_get(&p->m->tab, -1, T_WORD_EMB);
    if (!t) return 0; /* a frozen embedding has no gradient to sum */
    p->tied->step = p->step;
    return glm_comm_allreduce_sync(p->tied, glm_at(p->m->be, p->m->grads, t->offset), t->numel, cdtype(p->m->be),
                              "tied embedding gradient", err);
}

/* The prefix encoder's rows open the flat buffer of every stage (model/tensors.c). */
static size_t prefix_end(const glm_model *m) {
    size_t end = 0;
    for (int i = 0; i < m->tab.n; i++)
        if (glm_is_prefix(m->tab.t[i].kind)) end = m->tab.t[i].offset + m->tab.t[i].numel;
    return end;
}

int glm_pipe_reduce_prefix(glm_pipe *p, glm_err *err) {
    if (p->P < 2 || p->m->cfg.peft.pre_seq_len <= 0) return 0;
    if (!p->stages)
        return glm_fail(err, "rank %d: stage %d holds a prefix encoder copy but has no communicator to sum its gradient",
                        p->world->rank, p->stage);
    p->stages->step = p->step;
    return glm_comm_allreduce_sync(p->stages, p->m->grads, prefix_end(p->m), cdtype(p->m->be), "prefix encoder gradient", err);
}

int glm_pipe_dp_allreduce(glm_pipe *p, glm_err *err) {
    if (!p->dp) return 0;
    p->dp->step = p->step;
    return glm_comm_allreduce_sync(p->dp, p->m->grads, p->m->tab.total, cdtype(p->m->be), "data-parallel gradients", err);
}

int glm_pipe_owns_tensor(const glm_pipe *p, const glm_tensor *t) {
    return !glm_stage_row_is_copy(is_first(p) || p->P < 2, t->kind);
}

size_t glm_pipe_grad_skip(const glm_pipe *p) {
    /* the copies a later stage holds (prefix encoder, tied embedding) sit at the front of the
     * flat buffer (the table puts them first) and the padding after them is zero */
    size_t skip = 0;
    for (int i = 0; i < p->m->tab.n; i++) {
        const glm_tensor *t = &p->m->tab.t[i];
        if (!glm_pipe_owns_tensor(p, t) && t->offset + t->numel > skip) skip = t->offset + t->numel;
    }
    return skip;
}
