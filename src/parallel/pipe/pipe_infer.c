#include "parallel/pipe/pipe_infer.h"
#include <stdlib.h>
#include <string.h>
#include "core/log.h"
#include "model/adapter.h"
#ifdef GLM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* The CUDA backend binds its device when it is made; with several in one process, the device
 * of the stage about to run (allocations included) must be made current first, and the
 * caller's current device is given back at the end of every call here. */
static void use(glm_backend *be) {
#ifdef GLM_HAVE_CUDA
    if (glm_backend_on_gpu(be)) cudaSetDevice(be->device);
#else
    (void)be;
#endif
}

static int current_device(void) {
    int d = -1;
#ifdef GLM_HAVE_CUDA
    if (cudaGetDevice(&d) != cudaSuccess) d = -1;
#endif
    return d;
}

static void restore_device(int d) {
#ifdef GLM_HAVE_CUDA
    if (d >= 0) cudaSetDevice(d);
#else
    (void)d;
#endif
}

int glm_pipe_enter(const glm_pipe_lm *lm, int k) {
    int prev = current_device();
    use(lm->be[k]);
    return prev;
}
void glm_pipe_restore(int prev) { restore_device(prev); }

void glm_pipe_lm_init(glm_pipe_lm *lm, const glm_config *c, const glm_device_map *map, glm_backend **be) {
    int prev = current_device();
    *lm = (glm_pipe_lm){.map = *map, .cfg = *c, .n = map->n};
    lm->be = glm_calloc((size_t)lm->n, sizeof *lm->be);
    lm->st = glm_calloc((size_t)lm->n, sizeof *lm->st);
    for (int k = 0; k < lm->n; k++) {
        const glm_stage *s = &map->s[k];
        lm->be[k] = be[k];
        use(be[k]);
        glm_model_init_stage_inference(&lm->st[k], c, be[k], s->l0, s->l1, s->embed, s->head);
    }
    restore_device(prev);
}

/* load(stage k, path) for every stage, each on its own device. */
static int each_stage(glm_pipe_lm *lm, int (*load)(glm_model *, const char *, glm_err *), const char *path, glm_err *err) {
    int prev = current_device(), rc = 0;
    for (int k = 0; k < lm->n && rc == 0; k++) {
        use(lm->be[k]);
        if (load(&lm->st[k], path, err)) rc = glm_wrap(err, "stage %d: ", k);
    }
    restore_device(prev);
    return rc;
}

int glm_pipe_lm_load(glm_pipe_lm *lm, const char *path, glm_err *err) { return each_stage(lm, glm_model_load, path, err); }

int glm_pipe_lm_load_adapter(glm_pipe_lm *lm, const char *dir, glm_err *err) {
    return each_stage(lm, glm_adapter_load, dir, err);
}

void glm_pipe_lm_free(glm_pipe_lm *lm) {
    int prev = current_device();
    for (int k = 0; k < lm->n; k++) {
        use(lm->be[k]);
        if (lm->st[k].params) glm_model_free(&lm->st[k]);
    }
    if (lm->owns_backends)
        for (int k = 0; k < lm->n; k++) {
            int seen = 0; /* a backend shared by several stages is destroyed once */
            for (int j = 0; j < k; j++) seen |= lm->be[j] == lm->be[k];
            if (!seen && lm->be[k]) { use(lm->be[k]); lm->be[k]->destroy(lm->be[k]); }
        }
    free(lm->be);
    free(lm->st);
    *lm = (glm_pipe_lm){0};
    restore_device(prev);
}

int glm_pipe_lm_open(glm_pipe_lm *lm, const glm_config *cfg, const char *model_path, const char *merged,
                     const char *adapter, const char *device_map, int P, const char *device, glm_dtype dtype, glm_err *err) {
    *lm = (glm_pipe_lm){0};
    glm_config c;
    if (cfg) c = *cfg; /* the caller's: a quantized base's settings with it */
    else if (glm_config_load(&c, model_path, err)) return -1;
    /* the stages get the adapter's rows (each its layers' LoRA pairs, or its copy of the prefix
     * encoder) before the map is made, so the map's memory estimate counts them */
    if (adapter && glm_adapter_read_config(adapter, &c.peft, err)) return -1;
    int gpus = glm_cuda_device_count(), cuda = !strcmp(device, "cuda") || (!strcmp(device, "auto") && gpus > 0);
    if (cuda && gpus == 0) return glm_fail(err, "--device cuda: no GPU is visible");
    int is_file = device_map && strcmp(device_map, "auto") && strcmp(device_map, "thudm");
    if (P <= 0 && !is_file) P = cuda ? gpus : 1;
    glm_stage_shape sh;
    glm_stage_shape_init(&sh);
    sh.training = 0;
    sh.dtype = cuda ? dtype : GLM_F32;
    glm_device_map map;
    if (glm_device_map_make(&map, device_map, P, &c, &sh, err)) return -1;
    if (cuda && map.n > gpus) {
        glm_fail(err, "--device_map %s: %d stages but %d GPUs are visible", device_map, map.n, gpus);
        return glm_hint(err, "one stage per GPU: lower --pipeline_parallel_size or set CUDA_VISIBLE_DEVICES");
    }
    glm_backend **be = glm_calloc((size_t)map.n, sizeof *be);
    int rc = 0, prev = current_device();
    for (int k = 0; k < map.n && rc == 0; k++) {
        char why[512];
        if (!cuda) be[k] = k ? be[0] : glm_backend_cpu();
        else if (glm_backend_open("cuda", k, &dtype, 1, &be[k], why, sizeof why, err))
            rc = glm_wrap(err, "stage %d on GPU %d: ", k, k);
    }
    if (rc == 0) {
        glm_pipe_lm_init(lm, &c, &map, be);
        lm->owns_backends = 1;
        for (int k = 0; k < lm->n && merged; k++) snprintf(lm->st[k].merged, sizeof lm->st[k].merged, "%s", merged);
        rc = glm_pipe_lm_load(lm, model_path, err);
        if (rc == 0 && adapter) rc = glm_pipe_lm_load_adapter(lm, adapter, err);
        if (rc == 0) {
            glm_info("model split over %d stages (%s):", map.n, map.source);
            glm_device_map_print(stderr, &map);
        }
    } else {
        for (int k = 0; k < map.n; k++) if (be[k]) be[k]->destroy(be[k]);
    }
    free(be);
    restore_device(prev);
    return rc;
}

/* ---------------------------------------------------------------- cache and forward */

void glm_pipe_cache_init(glm_pipe_lm *lm, glm_pipe_cache *c, int B, int Tmax) {
    int prev = current_device();
    *c = (glm_pipe_cache){.B = B, .Tmax = Tmax};
    c->kv = glm_calloc((size_t)lm->n, sizeof *c->kv);
    for (int k = 0; k < lm->n; k++) {
        use(lm->be[k]);
        glm_kvcache_init(&lm->st[k], &c->kv[k], B, Tmax);
    }
    restore_device(prev);
}

void glm_pipe_cache_grow(glm_pipe_lm *lm, glm_pipe_cache *c, int T) {
    if (T <= c->Tmax) return;
    int prev = current_device();
    for (int k = 0; k < lm->n; k++) {
        use(lm->be[k]);
        glm_kvcache_grow(&lm->st[k], &c->kv[k], T);
    }
    c->Tmax = T;
    restore_device(prev);
}

void glm_pipe_cache_free(glm_pipe_lm *lm, glm_pipe_cache *c) {
    int prev = current_device();
    for (int k = 0; k < lm->n; k++) {
        use(lm->be[k]);
        glm_kvcache_free(&lm->st[k], &c->kv[k]);
    }
    free(c->kv);
    free(c->h[0]);
    free(c->h[1]);
    *c = (glm_pipe_cache){0};
    restore_device(prev);
}

/* The two host buffers the stages hand hidden states through, for `need` floats: stage k reads
 * h[(k+1)%2] (what stage k-1 wrote) and writes h[k%2]. */
static void host_stage(glm_pipe_cache *c, size_t need) {
    if (need <= c->cap) return;
    for (int i = 0; i < 2; i++) { free(c->h[i]); c->h[i] = glm_malloc(need * sizeof(float)); }
    c->cap = need;
}

int glm_pipe_forward_cached(glm_pipe_lm *lm, glm_pipe_cache *c, int Tq, const int32_t *ids, const int32_t *pos,
                            const int32_t *block_pos, const int32_t *kv_lo, const int32_t *kv_hi, float *hidden_out,
                            float *logits_out, glm_err *err) {
    host_stage(c, (size_t)c->B * Tq * lm->cfg.hidden_size);
    int prev = current_device(), rc = 0;
    for (int k = 0; k < lm->n && rc == 0; k++) {
        int last = k == lm->n - 1;
        use(lm->be[k]);
        if (glm_stage_forward_cached(&lm->st[k], &c->kv[k], Tq, ids, pos, block_pos, kv_lo, kv_hi,
                                     k ? c->h[(k + 1) % 2] : NULL, last ? NULL : c->h[k % 2], last ? hidden_out : NULL,
                                     last ? logits_out : NULL, err))
            rc = k ? glm_wrap(err, "stage %d: ", k) : -1;
    }
    restore_device(prev);
    if (rc == 0) c->len = c->kv[0].len;
    return rc;
}

/* ---------------------------------------------------------------- continuous batching */

void glm_pipe_cache_copy_slot(glm_pipe_lm *lm, glm_pipe_cache *c, int src, int dst, int n) {
    int prev = current_device();
    for (int k = 0; k < lm->n; k++) {
        use(lm->be[k]);
        glm_kvcache_copy_slot(&lm->st[k], &c->kv[k], src, dst, n);
    }
    restore_device(prev);
}

void glm_pipe_cache_reserve(glm_pipe_lm *lm, glm_pipe_cache *c, int ntokens) {
    int prev = current_device();
    for (int k = 0; k < lm->n; k++) {
        use(lm->be[k]);
        glm_kvcache_reserve(&lm->st[k], &c->kv[k], ntokens);
    }
    restore_device(prev);
}

int glm_pipe_forward_cached_slots(glm_pipe_lm *lm, glm_pipe_cache *c, int slot0, int nrows, int Tq, const int *len,
                                  const int *n_new, const int32_t *ids, const int32_t *pos, const int32_t *block_pos,
                                  const int32_t *kv_lo, const int32_t *kv_hi, float *logits_out, int32_t *greedy_out, float *last_hidden_out,
                                  glm_err *err) {
    host_stage(c, (size_t)nrows * Tq * lm->cfg.hidden_size);
    int prev = current_device(), rc = 0;
    for (int k = 0; k < lm->n && rc == 0; k++) {
        int last = k == lm->n - 1;
        use(lm->be[k]);
        if (glm_stage_forward_cached_slots(&lm->st[k], &c->kv[k], slot0, nrows, Tq, len, n_new, ids, pos, block_pos, kv_lo, kv_hi,
                                           k ? c->h[(k + 1) % 2] : NULL, last ? NULL : c->h[k % 2],
                                           last ? logits_out : NULL, last ? greedy_out : NULL,
                                           last ? last_hidden_out : NULL, err))
            rc = k ? glm_wrap(err, "stage %d: ", k) : -1;
    }
    restore_device(prev);
    return rc;
}

int glm_pipe_cached_rows_logits(glm_pipe_lm *lm, glm_pipe_cache *c, int r0, int n, float *logits_out, glm_err *err) {
    int prev = current_device(), k = lm->n - 1;
    use(lm->be[k]);
    int rc = glm_cached_rows_logits(&lm->st[k], &c->kv[k], r0, n, logits_out, err);
    restore_device(prev);
    return rc;
}

int glm_pipe_cached_picked_logits(glm_pipe_lm *lm, glm_pipe_cache *c, const int32_t *rows, int n, float *logits_out,
                                  glm_err *err) {
    int prev = current_device(), k = lm->n - 1;
    use(lm->be[k]);
    int rc = glm_cached_picked_logits(&lm->st[k], &c->kv[k], rows, n, logits_out, err);
    restore_device(prev);
    return rc;
}

int glm_pipe_cached_rows_logprobs(glm_pipe_lm *lm, glm_pipe_cache *c, int r0, int n, const int32_t *targets, float *lp,
                                  int32_t *best_id, float *best_lp, glm_err *err) {
    int prev = current_device(), k = lm->n - 1;
    use(lm->be[k]);
    int rc = glm_cached_rows_logprobs(&lm->st[k], &c->kv[k], r0, n, targets, lp, best_id, best_lp, err);
    restore_device(prev);
    return rc;
}
