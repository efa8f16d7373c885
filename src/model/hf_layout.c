/* Names of transformers' own GLM layout against THUDM's original (model/hf_layout.h). */
#include "model/hf_layout.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/tensors.h"

/* Modules outside the layers, and inside a layer (after the layer's prefix). query_key_value
 * has three -hf modules; the others one. */
static const struct { const char *orig, *hf[3]; } kOutside[] = {
    {"transformer.embedding.word_embeddings", {"model.embed_tokens"}},
    {"transformer.encoder.final_layernorm", {"model.norm"}},
    {"transformer.output_layer", {"lm_head"}},
};
static const struct { const char *orig, *hf[3]; } kInLayer[] = {
    {"input_layernorm", {"input_layernorm"}},
    {"self_attention.query_key_value", {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}},
    {"self_attention.dense", {"self_attn.o_proj"}},
    {"post_attention_layernorm", {"post_attention_layernorm"}},
    {"mlp.dense_h_to_4h", {"mlp.gate_up_proj"}},
    {"mlp.dense_4h_to_h", {"mlp.down_proj"}},
    {"post_self_attn_layernorm", {"post_self_attn_layernorm"}}, /* GLM-4-0414's (its only layout) */
    {"post_mlp_layernorm", {"post_mlp_layernorm"}},
};
enum { N_OUT = sizeof kOutside / sizeof kOutside[0], N_IN = sizeof kInLayer / sizeof kInLayer[0] };
static const char kOrigLayer[] = "transformer.encoder.layers.", kHfLayer[] = "model.layers.";

/* s starts with module m followed by the end or a '.': the length of m, else 0 */
static size_t module_at(const char *s, const char *m) {
    size_t k = strlen(m);
    return strncmp(s, m, k) == 0 && (s[k] == 0 || s[k] == '.') ? k : 0;
}

/* A layer's prefix at s ("<layer>N."): the length up to the number's dot, with *num at the number */
static size_t layer_at(const char *s, const char *layer, const char **num, size_t *num_len) {
    size_t k = strlen(layer);
    if (strncmp(s, layer, k) != 0) return 0;
    size_t d = 0;
    while (s[k + d] >= '0' && s[k + d] <= '9') d++;
    if (d == 0 || s[k + d] != '.') return 0;
    *num = s + k;
    *num_len = d;
    return k + d + 1;
}

int glm_hf_names(const char *orig, char names[3][GLM_HF_NAME]) {
    const char *at = strstr(orig, "transformer.");
    if (!at) return 0;
    int pre = (int)(at - orig);
    for (int i = 0; i < N_OUT; i++) {
        size_t k = module_at(at, kOutside[i].orig);
        if (k) {
            snprintf(names[0], GLM_HF_NAME, "%.*s%s%s", pre, orig, kOutside[i].hf[0], at + k);
            return 1;
        }
    }
    const char *num;
    size_t nl, lk = layer_at(at, kOrigLayer, &num, &nl);
    if (!lk) return 0;
    for (int i = 0; i < N_IN; i++) {
        size_t k = module_at(at + lk, kInLayer[i].orig);
        if (!k) continue;
        int n = kInLayer[i].hf[1] ? 3 : 1;
        for (int p = 0; p < n; p++)
            snprintf(names[p], GLM_HF_NAME, "%.*s%s%.*s.%s%s", pre, orig, kHfLayer, (int)nl, num, kInLayer[i].hf[p],
                     at + lk + k);
        return n;
    }
    return 0;
}

int glm_hf_orig_name(const char *hf, char *orig, size_t n, int *part) {
    static const char peft[] = "base_model.model.";
    int pre = strncmp(hf, peft, sizeof peft - 1) == 0 ? (int)sizeof peft - 1 : 0;
    const char *at = hf + pre;
    *part = 0;
    for (int i = 0; i < N_OUT; i++) {
        size_t k = module_at(at, kOutside[i].hf[0]);
        if (k) {
            snprintf(orig, n, "%.*s%s%s", pre, hf, kOutside[i].orig, at + k);
            return 0;
        }
    }
    const char *num;
    size_t nl, lk = layer_at(at, kHfLayer, &num, &nl);
    if (!lk) return -1;
    for (int i = 0; i < N_IN; i++)
        for (int p = 0; p < 3 && kInLayer[i].hf[p]; p++) {
            size_t k = module_at(at + lk, kInLayer[i].hf[p]);
            if (!k) continue;
            snprintf(orig, n, "%.*s%s%.*s.%s%s", pre, hf, kOrigLayer, (int)nl, num, kInLayer[i].orig, at + lk + k);
            *part = p;
            return 0;
        }
    return -1;
}

int glm_hf_row_parts(const glm_config *c, const glm_tensor *t, const char *name, char names[3][GLM_HF_NAME],
                     int64_t row0[3], int64_t rows[3]) {
    char hf[3][GLM_HF_NAME];
    int parts = glm_hf_names(name, hf), n = 0, qkv_parts = c->peft.lora_qkv_parts;
    if (parts == 0) { /* no -hf form: as it is */
        snprintf(names[0], GLM_HF_NAME, "%s", name);
        row0[0] = 0;
        rows[0] = t->shape[0];
        return 1;
    }
    int64_t r0 = 0;
    for (int k = 0; k < parts; k++) {
        int64_t nr = parts == 1 ? t->shape[0] : t->kind == T_QKV_LA ? t->shape[0] / 3 : glm_hf_part_rows(c, k);
        int adapter = t->kind == T_QKV_LA || t->kind == T_QKV_LB;
        if (!(parts == 3 && adapter && qkv_parts && !(qkv_parts >> k & 1))) { /* else no adapter there */
            memcpy(names[n], hf[k], GLM_HF_NAME);
            row0[n] = r0;
            rows[n] = nr;
            n++;
        }
        r0 += nr;
    }
    return n;
}

int64_t glm_hf_part_rows(const glm_config *c, int part) {
    return (int64_t)(part == 0 ? c->num_attention_heads : glm_kv_heads(c)) * glm_head_dim(c);
}

int glm_lora_blocks(const glm_config *c, int split, int64_t out, int64_t row0[3], int64_t rows[3]) {
    int64_t o = 0;
    for (int k = 0; k < split; k++) {
        row0[k] = o;
        rows[k] = split > 1 ? glm_hf_part_rows(c, k) : out;
        o += rows[k];
    }
    return split;
}

/* The part of path s after `skip` dots, to the next dot or the end: its start and length. */
static const char *path_part(const char *s, int skip, size_t *len) {
    for (int i = 0; i < skip && s; i++) s = strchr(s, '.') ? strchr(s, '.') + 1 : NULL;
    if (!s) return NULL;
    *len = strcspn(s, ".");
    return s;
}
static int dots(const char *s) { int d = 0; for (; *s; s++) d += *s == '.'; return d; }

/* One part of a module's name, in the layout it is given in (to_orig: -hf's) as the other's. */
static int module_part(const char *m, size_t len, int to_orig, char *out, size_t n) {
    for (int i = 0; i < N_OUT + N_IN; i++) {
        const char *orig = i < N_OUT ? kOutside[i].orig : kInLayer[i - N_OUT].orig;
        const char *const *hf = i < N_OUT ? kOutside[i].hf : kInLayer[i - N_OUT].hf;
        for (int p = 0; p < 3 && hf[p]; p++)
            for (int first = 0; first < 2; first++) {
                /* the last parts of the two paths; and a layer module's first parts (self_attn, mlp) */
                if (first && !(i >= N_OUT && dots(hf[p]) == 1 && dots(orig) == 1)) continue;
                size_t hl = 0, ol = 0;
                const char *h = path_part(hf[p], first ? 0 : dots(hf[p]), &hl), *o = path_part(orig, first ? 0 : dots(orig), &ol);
                const char *from = to_orig ? h : o, *to = to_orig ? o : h;
                if ((to_orig ? hl : ol) == len && !strncmp(from, m, len)) {
                    snprintf(out, n, "%.*s", (int)(to_orig ? ol : hl), to);
                    return 0;
                }
            }
    }
    return -1;
}

int glm_hf_module_orig(const char *m, size_t len, char *out, size_t n) { return module_part(m, len, 1, out, n); }
int glm_hf_module_name(const char *orig, char *out, size_t n) { return module_part(orig, strlen(orig), 0, out, n); }

int glm_hf_short_names(const char *orig_module, const char *out[3]) {
    for (int i = 0; i < N_IN; i++) {
        if (strcmp(kInLayer[i].orig, orig_module)) continue;
        int n = 0;
        for (int p = 0; p < 3 && kInLayer[i].hf[p]; p++) out[n++] = strrchr(kInLayer[i].hf[p], '.') + 1;
        return n;
    }
    return 0;
}
