/* Checkpoints under data parallelism, in the single-process format (ckpt/checkpoint.h):
 * without ZeRO every rank holds the same state and rank 0 writes it; with ZeRO the optimizer
 * shards are gathered to rank 0's host memory chunk by chunk (so no rank needs a full-size
 * device buffer), each piece put back at its place in the flat layout, and on load each rank
 * reads only its own pieces of every tensor. */
#include <stdlib.h>
#include <string.h>
#include "core/log.h"
#include "parallel/dp/dp.h"

#define CHUNK ((size_t)16 << 20) /* elements per rank gathered at once */

/* Rank r's shard elements [s0, s0 + n), found in src (device), to their flat places in host. */
static void unshard(glm_dp *dp, int r, size_t s0, size_t n, const float *src, float *host) {
    glm_backend *be = dp->m->be;
    for (int i = 0; i < dp->nb; i++) {
        size_t lo, off, pn = glm_dp_piece(dp, r, i, &lo, &off);
        size_t a = s0 > off ? s0 : off, e = s0 + n < off + pn ? s0 + n : off + pn;
        if (a < e) be->download(be, host + lo + (a - off), src + (a - s0), (e - a) * sizeof(float));
    }
}

/* State kind k (0 m, 1 v, 2 master) of every rank's shard -> host (flat layout, dp->shard * world)
 * on rank 0, chunk by chunk: each chunk read out of the state as fp32 (8-bit moments decoded,
 * a host state copied), sent through a device buffer. */
static int gather_to_host(glm_dp *dp, int kind, float *host, float *tmp, glm_err *err) {
    glm_backend *be = dp->m->be;
    size_t S = dp->shard, C = S < CHUNK ? S : CHUNK;
    float *h = glm_malloc(C * sizeof(float)), *d = be->alloc(be, C * sizeof(float));
    int rc = 0;
    for (size_t c0 = 0; c0 < S && rc == 0; c0 += C) {
        size_t k = S - c0 < C ? S - c0 : C;
        glm_adamw_get(dp->opt, be, c0, k, kind == 0 ? h : NULL, kind == 1 ? h : NULL, kind == 2 ? h : NULL);
        be->upload(be, d, h, k * sizeof(float));
        if (dp->comm->gather(dp->comm, d, tmp, k, GLM_C_F32, 0, "optimizer state for the checkpoint", err) ||
            dp->comm->wait(dp->comm, -1, err))
            rc = -1;
        if (rc == 0 && dp->rank == 0)
            for (int r = 0; r < dp->world; r++) unshard(dp, r, c0, k, tmp + (size_t)r * k, host);
    }
    be->free(be, d);
    free(h);
    return rc;
}

/* bytes of every rank's host src to rank 0's dst (rank-major: rank r's at r * bytes), through a
 * device buffer chunk by chunk as floats (bytes a multiple of 4). */
static int gather_bytes(glm_dp *dp, const void *src, void *dst, size_t bytes, glm_err *err) {
    glm_backend *be = dp->m->be;
    size_t nf = bytes / 4, C = nf < CHUNK ? nf : CHUNK;
    float *d = be->alloc(be, C * sizeof(float)), *all = dp->rank == 0 ? be->alloc(be, C * (size_t)dp->world * sizeof(float)) : NULL;
    float *h = dp->rank == 0 ? glm_malloc(C * (size_t)dp->world * sizeof(float)) : NULL;
    int rc = 0;
    for (size_t c0 = 0; c0 < nf && rc == 0; c0 += C) {
        size_t k = nf - c0 < C ? nf - c0 : C;
        be->upload(be, d, (const float *)src + c0, k * sizeof(float));
        if (dp->comm->gather(dp->comm, d, all, k, GLM_C_F32, 0, "8-bit optimizer state for the checkpoint", err) ||
            dp->comm->wait(dp->comm, -1, err))
            rc = -1;
        if (rc == 0 && dp->rank == 0) {
            be->download(be, h, all, k * (size_t)dp->world * sizeof(float));
            for (int r = 0; r < dp->world; r++) memcpy((char *)dst + (size_t)r * bytes + c0 * 4, h + (size_t)r * k, k * 4);
        }
    }
    be->free(be, d);
    if (all) be->free(be, all);
    free(h);
    return rc;
}

/* The 8-bit states as stored, every rank's shard after the other on rank 0 (os's q8 fields). */
static int gather_q8(glm_dp *dp, glm_opt_state *os, glm_err *err) {
    glm_adamw *o = dp->opt;
    size_t S = dp->shard, nb = S / GLM_ADAM8_BLOCK, W = (size_t)dp->world;
    uint8_t *qm = glm_malloc(S), *qv = glm_malloc(S);
    float *am = glm_malloc(nb * sizeof(float) + 4), *av = glm_malloc(nb * sizeof(float) + 4);
    glm_adamw_get_q8(o, dp->m->be, 0, S, qm, qv, am, av);
    if (dp->rank == 0) glm_opt_state_alloc_q8(os, S * W, dp->world, &dp->m->tab);
    int rc = gather_bytes(dp, qm, os->qm, S, err) || gather_bytes(dp, qv, os->qv, S, err) ||
             gather_bytes(dp, am, os->am, nb * sizeof(float), err) || gather_bytes(dp, av, os->av, nb * sizeof(float), err) ? -1 : 0;
    free(qm); free(qv); free(am); free(av);
    return rc;
}

static int save_sharded(glm_dp *dp, const char *output_dir, const glm_train_state *st, const char *tok,
                        const char *args, glm_err *err) {
    glm_backend *be = dp->m->be;
    glm_adamw *o = dp->opt;
    size_t S = dp->shard, padded = S * (size_t)dp->world, C = S < CHUNK ? S : CHUNK;
    int kinds = o->master ? 3 : 2;
    float *host = NULL, *tmp = NULL;
    if (dp->rank == 0) {
        host = glm_malloc(padded * kinds * sizeof(float));
        tmp = be->alloc(be, C * (size_t)dp->world * sizeof(float));
    }
    int rc = 0;
    for (int k = 0; k < kinds && rc == 0; k++) rc = gather_to_host(dp, k, host ? host + (size_t)k * padded : NULL, tmp, err);
    glm_opt_state q8 = {0}; /* 8-bit: the codes as stored, so the same layout resumes exactly */
    if (rc == 0 && o->kind == GLM_OPTIM_ADAMW8) rc = gather_q8(dp, &q8, err);
    if (rc == 0 && dp->rank == 0) {
        glm_opt_state os = {.lo = 0, .hi = dp->m->tab.total, .m = host, .v = host + padded,
                            .master = o->master ? host + 2 * padded : NULL, .step = o->step, .q8_n = q8.q8_n,
                            .q8_ranks = q8.q8_ranks, .qm = q8.qm, .qv = q8.qv, .am = q8.am, .av = q8.av};
        rc = glm_checkpoint_save_state(output_dir, dp->m, &os, st, tok, args, err);
        if (rc) rc = 1; /* a local failure: the others still learn of it below */
    }
    glm_opt_state_free_q8(&q8);
    if (tmp) be->free(be, tmp);
    free(host);
    return rc;
}

int glm_dp_save(glm_dp *dp, const char *output_dir, const glm_train_state *st, const char *tokenizer_path,
                const char *args_json, glm_err *err) {
    if (dp->world == 1) return glm_checkpoint_save(output_dir, dp->m, dp->opt, st, tokenizer_path, args_json, err);
    int rc = 0;
    if (glm_dp_z3_gather_all(dp, err)) return -1; /* ZeRO-3: the weights whole for the writer */
    if (dp->sharded) rc = save_sharded(dp, output_dir, st, tokenizer_path, args_json, err);
    else if (dp->rank == 0 && glm_checkpoint_save(output_dir, dp->m, dp->opt, st, tokenizer_path, args_json, err)) rc = 1;
    glm_dp_z3_release_all(dp);
    if (rc < 0) return -1; /* a collective failed: every rank fails the same way */
    /* the other ranks wait here while rank 0 writes, and all learn whether it worked */
    double failed = rc;
    if (glm_dp_sum_long(dp, &failed, 1, "checkpoint written", err)) return -1;
    if (failed > 0 && rc == 0)
        return glm_fail(err, "rank %d: rank 0 could not write checkpoint-%ld (see rank 0's error)", dp->rank, st->global_step);
    return rc ? -1 : 0;
}

int glm_dp_load(glm_dp *dp, const char *dir, glm_train_state *st, glm_err *err) {
    if (!dp->sharded) return glm_checkpoint_load_as(dir, dp->m, dp->opt, dp->q8_file[0] ? dp->q8_file : NULL, st, err);
    glm_backend *be = dp->m->be;
    glm_adamw *o = dp->opt;
    size_t S = dp->shard;
    float *host = glm_malloc(S * 3 * sizeof(float));
    glm_span *pieces = glm_dp_shard_spans(dp);
    glm_opt_state os = {.span = pieces, .nspan = dp->nb, .m = host, .v = host + S, .master = o->master ? host + 2 * S : NULL};
    if (glm_dp_z3_gather_all(dp, err)) { free(pieces); free(host); return -1; } /* a whole buffer takes the weights read */
    int rc = glm_checkpoint_load_state(dir, dp->m, &os, st, err);
    if (dp->z3) { if (rc == 0) glm_dp_z3_store_all(dp); glm_dp_z3_release_all(dp); }
    free(pieces);
    if (rc == 0) {
        glm_adamw_put(o, be, 0, S, os.m, os.v, os.master);
        o->step = os.step;
    }
    if (rc == 0 && o->kind == GLM_OPTIM_ADAMW8) { /* the same ranks and shards: this rank's codes as they were */
        size_t W = (size_t)dp->world, nb = S / GLM_ADAM8_BLOCK;
        glm_opt_state q = {0};
        glm_opt_state_alloc_q8(&q, S * W, dp->world, &dp->m->tab);
        int got = glm_checkpoint_load_8bit(dir, dp->q8_file[0] ? dp->q8_file : NULL, &q, err);
        if (got < 0) rc = -1;
        if (got > 0)
            glm_adamw_put_q8(o, be, 0, S, q.qm + (size_t)dp->rank * S, q.qv + (size_t)dp->rank * S, q.am + (size_t)dp->rank * nb,
                             q.av + (size_t)dp->rank * nb);
        glm_opt_state_free_q8(&q);
    }
    free(host);
    return rc;
}

int glm_dp_load_weights(glm_dp *dp, const char *dir, glm_err *err) {
    if (glm_dp_z3_gather_all(dp, err)) return -1; /* a whole buffer takes the weights read */
    int rc = glm_model_load_trainable(dp->m, dir, err);
    if (dp->z3) { if (rc == 0) glm_dp_z3_store_all(dp); glm_dp_z3_release_all(dp); }
    return rc;
}

int glm_dp_opt_state(glm_dp *dp, glm_opt_state *o, glm_err *err) {
    glm_backend *be = dp->m->be;
    glm_adamw *a = dp->opt;
    size_t total = dp->m->tab.total, S = dp->shard, C = S < CHUNK ? S : CHUNK;
    int kinds = a->master ? 3 : 2, sharded = dp->sharded && dp->world > 1;
    size_t n = sharded ? S * (size_t)dp->world : total; /* the gathered shards cover the padding too */
    *o = (glm_opt_state){.lo = 0, .hi = total, .step = a->step};
    float *host = dp->rank == 0 ? glm_malloc(n * kinds * sizeof(float)) : NULL;
    int rc = 0;
    if (!sharded) {
        if (host) glm_adamw_get(a, be, 0, total, host, host + n, a->master ? host + 2 * n : NULL);
    } else {
        float *tmp = dp->rank == 0 ? be->alloc(be, C * (size_t)dp->world * sizeof(float)) : NULL;
        for (int k = 0; k < kinds && rc == 0; k++) rc = gather_to_host(dp, k, host ? host + (size_t)k * n : NULL, tmp, err);
        if (tmp) be->free(be, tmp);
    }
    if (host) { o->m = host; o->v = host + n; o->master = a->master ? host + 2 * n : NULL; }
    if (rc == 0 && a->kind == GLM_OPTIM_ADAMW8) { /* and the codes as stored (rank 0), for an exact resume */
        glm_opt_state q = {0};
        if (sharded) {
            rc = gather_q8(dp, &q, err);
        } else if (dp->rank == 0) {
            glm_opt_state_alloc_q8(&q, a->n, 1, &dp->m->tab);
            glm_adamw_get_q8(a, be, 0, a->n, q.qm, q.qv, q.am, q.av);
        }
        o->q8_n = q.q8_n; o->q8_ranks = q.q8_ranks; o->q8_table = q.q8_table;
        o->qm = q.qm; o->qv = q.qv; o->am = q.am; o->av = q.av;
    }
    if (rc) { free(host); glm_opt_state_free_q8(o); *o = (glm_opt_state){0}; }
    return rc;
}

