#include "parallel/pipe/device_map.h"
#include "optim/adamw.h"
#include <cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/fileutil.h"
#include "core/json_text.h"

void glm_stage_shape_init(glm_stage_shape *sh) {
    *sh = (glm_stage_shape){.dtype = GLM_F32, .B = 1, .T = 512, .n_micro = 1, .training = 1, .dp = 1, .head_chunk = 256};
}

static int fail_empty(const glm_device_map *map, int k, glm_err *err) {
    glm_fail(err, "device map %s: stage %d has nothing (no layer, embedding or head)", map->source, k);
    return glm_hint(err, "use fewer stages (--pipeline_parallel_size) or give every stage at least one layer");
}

/* ---------------------------------------------------------------- THUDM's split */

int glm_device_map_thudm(glm_device_map *map, int P, const glm_config *c, glm_err *err) {
    *map = (glm_device_map){.n = P};
    snprintf(map->source, sizeof map->source, "thudm");
    if (P < 1 || P > GLM_MAX_STAGES) return glm_fail(err, "--pipeline_parallel_size %d: use 1 to %d", P, GLM_MAX_STAGES);
    int L = c->num_layers;
    /* utils.py: per_gpu = 30 / num_gpus (a float), GPU 0 starts with used = 2 for the embedding
     * and final_layernorm + lm_head; a new GPU begins when used >= per_gpu. 30 = 28 layers + 2,
     * so other depths get L + 2 units. */
    double per_gpu = (double)(L + 2) / P, used = 2;
    int gpu = 0;
    for (int k = 0; k < P; k++) map->s[k].l0 = map->s[k].l1 = -1;
    for (int i = 0; i < L; i++) {
        if (used >= per_gpu) { gpu++; used = 0; }
        if (gpu >= P) return glm_fail(err, "device map thudm: layer %d falls beyond GPU %d", i, P - 1);
        if (map->s[gpu].l0 < 0) map->s[gpu].l0 = i;
        map->s[gpu].l1 = i + 1;
        used += 1;
    }
    map->s[0].embed = 1;
    map->s[P - 1].head = 1;
    map->head_moved = P > 1;
    for (int k = 0; k < P; k++) {
        if (map->s[k].l0 < 0) { /* no layer: an empty range where the previous stage ended */
            map->s[k].l0 = map->s[k].l1 = k ? map->s[k - 1].l1 : 0;
            if (!map->s[k].embed && !map->s[k].head) return fail_empty(map, k, err);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- memory plan */

glm_mem_plan glm_stage_memory_plan(const glm_config *c, const glm_device_map *map, int k, const glm_stage_shape *sh) {
    const glm_stage *st = &map->s[k];
    size_t us[2] = {0, 0};
    glm_mem_plan p = glm_memory_plan_stage(c, st->l0, st->l1, st->embed, st->head, sh->dtype, sh->B, sh->T,
                                           sh->gradient_checkpointing, sh->head_chunk, us);
    double unit = (double)us[0], slots = (2.0 * us[0] + us[1]) * (double)glm_dtype_size(sh->dtype); /* unit_slots.h */
    if (!sh->training) { p = (glm_mem_plan){.params = p.params, .total = p.params}; return p; }
    double es = (double)glm_dtype_size(sh->dtype), trainable = p.grads / es, hid = (double)sh->B * sh->T * c->hidden_size * es;
    int dp = sh->dp > 1 ? sh->dp : 1;
    if (sh->zero2 && map->n == 1 && dp > 1) /* the shard and the unit slots (parallel/dp/dp_zero2.c) */
        p.grads = trainable / dp * es + slots;
    if (sh->peer_ranks > 1 && map->n == 1 && !sh->zero2) p.grads += trainable * es * (sh->peer_ranks - 1) / sh->peer_ranks;
    int unit_path = (sh->in_backward || sh->offload) && map->n == 1 && dp == 1;
    if (unit_path) p.grads = slots; /* parallel/dp/dp_offload.c, one process: the unit slots instead of the gradient buffer */
    if (sh->zero3 && map->n == 1 && dp > 1) { /* parallel/dp/dp_zero3.c: the shard + two unit slots */
        double largest = unit > (double)c->vocab_size * c->hidden_size ? unit : (double)c->vocab_size * c->hidden_size;
        p.params -= trainable * es * (1.0 - 1.0 / dp);
        p.params += 2.0 * (glm_tensor_trains(c, -1, T_WORD_EMB) ? largest : unit) * es;
    }
    if (sh->optim == GLM_OPTIM_ADAMW8) p.moments = trainable * (glm_optim_state_bytes(GLM_OPTIM_ADAMW8, 0));
    p.master /= dp;
    p.moments /= dp;
    if (sh->offload) { /* the host keeps an fp32 master copy in any case, and a staging copy of the shard in S */
        p.host = trainable / dp * (glm_optim_state_bytes(sh->optim, 1) + es) + (unit_path && !sh->in_backward ? slots : 0); /* + landing */
        p.master = p.moments = 0;
    }
    if (map->n > 1) { /* parallel/pipe/pipeline.c: stashed inputs (1F1B: at most P - k in flight), send/recv */
        int P = map->n, inflight = P - k < sh->n_micro ? P - k : sh->n_micro;
        if (!st->embed) p.activations += inflight * hid + hid; /* + dh_in */
        if (!st->head) p.activations += 2 * hid;               /* h_out, dh_out */
    }
    p.total = p.params + p.grads + p.master + p.moments + p.activations + p.scratch;
    return p;
}

/* ---------------------------------------------------------------- auto */

/* Contiguous ranges minimising the largest stage's planned memory (dynamic programming over
 * where each stage ends); every stage gets at least one layer. */
int glm_device_map_auto(glm_device_map *map, int P, const glm_config *c, const glm_stage_shape *sh, glm_err *err) {
    int L = c->num_layers;
    *map = (glm_device_map){.n = P};
    snprintf(map->source, sizeof map->source, "auto");
    if (P < 1 || P > GLM_MAX_STAGES) return glm_fail(err, "--pipeline_parallel_size %d: use 1 to %d", P, GLM_MAX_STAGES);
    if (P > L) {
        glm_fail(err, "--pipeline_parallel_size %d: the model has only %d layers", P, L);
        return glm_hint(err, "use at most one stage per layer");
    }
    /* best[k][j]: the smallest possible maximum over stages 0..k-1 covering layers [0, j) */
    double *best = glm_malloc(sizeof(double) * (size_t)(P + 1) * (L + 1));
    int *cut = glm_malloc(sizeof(int) * (size_t)(P + 1) * (L + 1));
#define B_(k, j) best[(size_t)(k) * (L + 1) + (j)]
#define C_(k, j) cut[(size_t)(k) * (L + 1) + (j)]
    for (int i = 0; i < (P + 1) * (L + 1); i++) best[i] = INFINITY;
    B_(0, 0) = 0;
    glm_device_map probe = {.n = P};
    for (int k = 1; k <= P; k++)
        for (int j = k; j <= L - (P - k); j++)
            for (int i = k - 1; i < j; i++) {
                if (!isfinite(B_(k - 1, i))) continue;
                probe.s[k - 1] = (glm_stage){.l0 = i, .l1 = j, .embed = k == 1, .head = k == P};
                double m = glm_stage_memory_plan(c, &probe, k - 1, sh).total;
                double v = m > B_(k - 1, i) ? m : B_(k - 1, i);
                if (v < B_(k, j)) { B_(k, j) = v; C_(k, j) = i; }
            }
    for (int k = P, j = L; k >= 1; k--) {
        int i = C_(k, j);
        map->s[k - 1] = (glm_stage){.l0 = i, .l1 = j, .embed = k == 1, .head = k == P};
        j = i;
    }
#undef B_
#undef C_
    free(best);
    free(cut);
    return 0;
}

/* ---------------------------------------------------------------- JSON */

/* The module names of a device map (Hugging Face's accelerate / THUDM's utils.py) per family:
 * the embedding, a layer's prefix, the final norm, the head. */
typedef struct map_names { const char *embed, *layer, *final_norm, *head, *extra; } map_names;
static map_names names_of(const glm_config *c) {
    if (c->family == GLM_FAMILY_GLM2) /* ChatGLM2's utils.py also places the rotary table: with the embedding */
        return (map_names){"transformer.embedding", "transformer.encoder.layers.", "transformer.encoder.final_layernorm",
                           "transformer.output_layer", "transformer.rotary_pos_emb"};
    return (map_names){"transformer.word_embeddings", "transformer.layers.", "transformer.final_layernorm", "lm_head", NULL};
}

/* Position of a module in pipeline order: 0 embedding, 1 + l layer l, L + 1 final norm, L + 2
 * the head; -1 when the name is not one of them. */
static int module_slot(const char *name, const glm_config *c) {
    int L = c->num_layers;
    map_names nm = names_of(c);
    if (!strcmp(name, nm.embed) || (nm.extra && !strcmp(name, nm.extra)) ||
        (c->family == GLM_FAMILY_GLM2 && !strcmp(name, "transformer.embedding.word_embeddings"))) return 0;
    if (!strcmp(name, nm.final_norm)) return L + 1;
    if (!strcmp(name, nm.head)) return L + 2;
    const char *p = nm.layer;
    if (strncmp(name, p, strlen(p))) return -1;
    const char *d = name + strlen(p);
    char *end;
    long l = strtol(d, &end, 10);
    if (end == d || *end || l < 0 || l >= L || (d[0] == '0' && d[1])) return -1;
    return 1 + (int)l;
}

static void slot_name(int slot, const glm_config *c, char *out, size_t n) {
    int L = c->num_layers;
    map_names nm = names_of(c);
    if (slot == 0) snprintf(out, n, "%s", nm.embed);
    else if (slot == L + 1) snprintf(out, n, "%s", nm.final_norm);
    else if (slot == L + 2) snprintf(out, n, "%s", nm.head);
    else snprintf(out, n, "%s%d", nm.layer, slot - 1);
}

static int stage_value(const cJSON *v, const char *where, const char *name, int *out, glm_err *err) {
    if (cJSON_IsNumber(v) && v->valuedouble == (double)(int)v->valuedouble && v->valueint >= 0) {
        *out = v->valueint;
        return 0;
    }
    if (cJSON_IsString(v) && !strncmp(v->valuestring, "cuda:", 5)) {
        char *end;
        long k = strtol(v->valuestring + 5, &end, 10);
        if (end != v->valuestring + 5 && !*end && k >= 0 && k < 1 << 20) { *out = (int)k; return 0; }
    }
    char *s = cJSON_PrintUnformatted(v);
    glm_fail(err, "device map %s: %s -> %s is not a stage", where, name, s ? s : "?");
    free(s);
    return glm_hint(err, "map each module to a stage number 0..P-1 (or \"cuda:N\"); cpu and disk offload are not supported");
}

int glm_device_map_parse(glm_device_map *map, const char *text, const char *where, int P, const glm_config *c,
                         glm_err *err) {
    int L = c->num_layers, nslots = L + 3;
    *map = (glm_device_map){0};
    snprintf(map->source, sizeof map->source, "%s", where);
    cJSON *o = glm_json_parse_doc(text, strlen(text), where, "a device map: module name -> stage", err);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        if (!o) glm_wrap(err, "device map: ");
        else glm_fail(err, "device map %s is not a JSON object", where);
        return glm_hint(err, "write {\"transformer.word_embeddings\": 0, \"transformer.layers.0\": 0, ..., "
                             "\"transformer.final_layernorm\": 1, \"lm_head\": 1}");
    }
    int *stage = glm_malloc(sizeof(int) * (size_t)nslots);
    for (int i = 0; i < nslots; i++) stage[i] = -1;
    char name[64];
    int rc = 0, maxk = -1;
    for (cJSON *it = o->child; it && rc == 0; it = it->next) {
        int slot = module_slot(it->string, c), k = 0;
        if (slot < 0) {
            rc = glm_fail(err, "device map %s: unknown module '%s'", where, it->string);
            glm_hint(err, "the modules are transformer.word_embeddings, transformer.layers.0..%d, "
                          "transformer.final_layernorm and lm_head", L - 1);
        } else if (stage[slot] >= 0) {
            rc = glm_fail(err, "device map %s: %s appears twice", where, it->string);
        } else if ((rc = stage_value(it, where, it->string, &k, err)) == 0) {
            stage[slot] = k;
            if (k > maxk) maxk = k;
        }
    }
    cJSON_Delete(o);
    if (rc == 0 && stage[L + 2] < 0) stage[L + 2] = stage[L + 1]; /* lm_head follows the final norm */
    for (int i = 0; i < L + 2 && rc == 0; i++)
        if (stage[i] < 0) {
            slot_name(i, c, name, sizeof name);
            rc = glm_fail(err, "device map %s: %s is missing", where, name);
            glm_hint(err, "every layer, the embedding and the final LayerNorm must be given a stage");
        }
    if (rc == 0 && P > 0 && maxk >= P) {
        for (int i = 0; i < nslots; i++) if (stage[i] == maxk) { slot_name(i, c, name, sizeof name); break; }
        rc = glm_fail(err, "device map %s: %s is on stage %d but --pipeline_parallel_size is %d", where, name, maxk, P);
    }
    if (rc == 0 && stage[L + 2] != stage[L + 1])
        rc = glm_fail(err, "device map %s: lm_head on stage %d but transformer.final_layernorm on stage %d", where,
                      stage[L + 2], stage[L + 1]);
    if (rc == 0 && stage[0] != 0)
        rc = glm_fail(err, "device map %s: transformer.word_embeddings is on stage %d; the pipeline starts with it on stage 0",
                      where, stage[0]);
    int n = P > 0 ? P : maxk + 1;
    if (rc == 0 && n > GLM_MAX_STAGES) rc = glm_fail(err, "device map %s: %d stages, at most %d", where, n, GLM_MAX_STAGES);
    /* THUDM's placement: final norm and head with the embedding while layers go further */
    int last_layer = L > 0 ? stage[L] : 0;
    if (rc == 0 && stage[L + 1] == 0 && last_layer > 0) {
        map->head_moved = 1;
        stage[L + 1] = stage[L + 2] = last_layer;
    }
    for (int i = 1; i < L + 2 && rc == 0; i++)
        if (stage[i] < stage[i - 1]) {
            char prev[64];
            slot_name(i, c, name, sizeof name);
            slot_name(i - 1, c, prev, sizeof prev);
            rc = glm_fail(err, "device map %s: %s on stage %d comes after %s on stage %d", where, name, stage[i], prev,
                          stage[i - 1]);
            glm_hint(err, "stages must follow the layer order: the embedding and the first layers on stage 0, the last "
                          "layers, final_layernorm and lm_head on the last stage");
        }
    if (rc == 0) {
        map->n = n;
        for (int k = 0; k < n; k++) map->s[k] = (glm_stage){.l0 = -1, .l1 = -1};
        map->s[0].embed = 1;
        map->s[stage[L + 1]].head = 1;
        for (int l = 0; l < L; l++) {
            glm_stage *s = &map->s[stage[1 + l]];
            if (s->l0 < 0) s->l0 = l;
            s->l1 = l + 1;
        }
        for (int k = 0; k < n && rc == 0; k++) {
            glm_stage *s = &map->s[k];
            if (s->l0 < 0) s->l0 = s->l1 = k ? map->s[k - 1].l1 : 0;
            if (s->l0 == s->l1 && !s->embed && !s->head) rc = fail_empty(map, k, err);
        }
        if (rc == 0 && !map->s[n - 1].head)
            rc = glm_fail(err, "device map %s: transformer.final_layernorm is on stage %d, not on the last stage %d", where,
                          stage[L + 1], n - 1);
    }
    free(stage);
    return rc;
}

int glm_device_map_make(glm_device_map *map, const char *spec, int P, const glm_config *c, const glm_stage_shape *sh,
                        glm_err *err) {
    if (!spec || !*spec || !strcmp(spec, "auto")) {
        if (glm_device_map_auto(map, P, c, sh, err)) return -1;
    } else if (!strcmp(spec, "thudm")) {
        if (glm_device_map_thudm(map, P, c, err)) return -1;
    } else {
        if (!glm_is_file(spec)) {
            glm_fail(err, "--device_map %s: no such file", spec);
            return glm_hint(err, "pass auto, thudm, or a JSON file mapping module names to stages");
        }
        char *text = glm_read_file(spec, NULL, err);
        if (!text) return -1;
        int rc = glm_device_map_parse(map, text, spec, P, c, err);
        free(text);
        if (rc) return -1;
    }
    return 0;
}

void glm_device_map_print(FILE *f, const glm_device_map *map) {
    for (int k = 0; k < map->n; k++) {
        const glm_stage *s = &map->s[k];
        char line[160] = "";
        size_t n = 0;
        if (s->embed) n += (size_t)snprintf(line + n, sizeof line - n, " + word_embeddings");
        if (s->l1 == s->l0 + 1) n += (size_t)snprintf(line + n, sizeof line - n, " + layer %d", s->l0);
        else if (s->l1 > s->l0) n += (size_t)snprintf(line + n, sizeof line - n, " + layers %d-%d (%d)", s->l0, s->l1 - 1, s->l1 - s->l0);
        if (s->head) snprintf(line + n, sizeof line - n, " + final_layernorm + lm_head");
        fprintf(f, "  stage %d: %s\n", k, line + 3);
    }
    if (map->head_moved)
        fprintf(f, "  (%s places final_layernorm and lm_head on GPU 0; the pipeline runs them on the last stage)\n",
                map->source);
}

char *glm_device_map_to_json(const glm_device_map *map, const glm_config *c) {
    cJSON *o = cJSON_CreateObject();
    char name[96];
    int L = c->num_layers;
    for (int k = 0; k < map->n; k++) {
        const glm_stage *s = &map->s[k];
        if (s->embed) { slot_name(0, c, name, sizeof name); cJSON_AddNumberToObject(o, name, k); }
        for (int l = s->l0; l < s->l1; l++) {
            slot_name(1 + l, c, name, sizeof name);
            cJSON_AddNumberToObject(o, name, k);
        }
        if (s->head) {
            slot_name(L + 1, c, name, sizeof name);
            cJSON_AddNumberToObject(o, name, k);
            slot_name(L + 2, c, name, sizeof name);
            cJSON_AddNumberToObject(o, name, k);
        }
    }
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}
