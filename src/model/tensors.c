#include "model/tensors.h"
#include "model/hf_layout.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/err.h"
#include "model/family.h"
#include "model/family_names.h"

/* Each tensor starts on a 64-element boundary so vector loads and later shards stay aligned. */
#define ALIGN_ELEMS 64

static void add(glm_table *tab, glm_tkind kind, int layer, const char *name, int ndim, int64_t d0, int64_t d1, int qtype) {
    glm_tensor *t = &tab->t[tab->n];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->layer = layer;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim > 1 ? d1 : 1;
    t->numel = (size_t)d0 * (size_t)t->shape[1];
    t->offset = tab->total;
    t->decay = ndim >= 2;
    t->lr_scale = 1.0f;
    t->qtype = qtype;
    if (qtype) tab->total += glm_qlayout_of((glm_qtype)qtype, (size_t)d0, (size_t)t->shape[1]).bytes;
    else tab->total += (t->numel + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS;
    tab->n_params += t->numel;
    int slot = (layer < 0 ? tab->num_layers : layer) * T_NKINDS + kind;
    tab->index[slot] = tab->n;
    tab->n++;
}

void glm_table_build(glm_table *tab, const glm_config *c) {
    glm_table_build_part(tab, c, 0, c->num_layers, 1, 1, ALIGN_ELEMS, GLM_PART_BASE);
}

/* The next tensor starts a unit: the flat offset moves up to a multiple of unit_align. */
static void unit_start(glm_table *tab, size_t unit_align) { tab->total = (tab->total + unit_align - 1) / unit_align * unit_align; }

void glm_table_build_range(glm_table *tab, const glm_config *c, int l0, int l1, int with_embed, int with_head) {
    glm_table_build_units(tab, c, l0, l1, with_embed, with_head, ALIGN_ELEMS);
}

void glm_table_build_units(glm_table *tab, const glm_config *c, int l0, int l1, int with_embed, int with_head,
                           size_t unit_align) {
    glm_table_build_part(tab, c, l0, l1, with_embed, with_head, unit_align, GLM_PART_TRAINABLE);
}


/* The modules that freeze mode and peft's modules_to_save name, by LLaMA-Factory's names: a layer
 * row's module is the first part of its name inside the layer (input_layernorm, attention or
 * self_attention, post_attention_layernorm, mlp), its bit the module's place among the family's;
 * a row outside the layers is named by the part before its last (word_embeddings,
 * final_layernorm, lm_head or output_layer). */
static size_t first_part(const char *s) { return strcspn(s, "."); }
static int layer_module_bit(const glm_family *fam, int k) {
    const char *seen[GLM_LAYER_KINDS];
    int ns = 0;
    for (int i = 0; i < GLM_LAYER_KINDS; i++) {
        const char *r = fam->layer_row[i];
        if (!r) continue;
        int j = 0;
        while (j < ns && !(first_part(seen[j]) == first_part(r) && !strncmp(seen[j], r, first_part(r)))) j++;
        if (j == ns) seen[ns++] = r;
        if (i == k) return 1 << j;
    }
    return 0;
}
/* the row that stands for an outside module (its bit), NULL where the model has none: a tied head
 * is the embedding's own row, as Hugging Face's named_parameters lists it once */
static const char *extra_row(const glm_config *c, int bit) {
    const glm_family *fam = glm_family_of(c);
    return bit == GLM_EXTRA_EMB ? fam->embed : bit == GLM_EXTRA_LNF ? fam->final_norm_w
                                              : c->tie_word_embeddings ? NULL : fam->head;
}
static void extra_part(const char *row, const char **p, size_t *n) {
    const char *last = strrchr(row, '.'), *s = last;
    while (s > row && s[-1] != '.') s--;
    *p = s;
    *n = (size_t)(last - s);
}
/* the GLM_EXTRA_* bit of a row kind (0 for the rows of the layers and the adapters) */
static int glm_extra_bit(glm_tkind kind) {
    return kind == T_WORD_EMB ? GLM_EXTRA_EMB : kind == T_LNF_W || kind == T_LNF_B ? GLM_EXTRA_LNF
                                              : kind == T_LM_HEAD ? GLM_EXTRA_HEAD : 0;
}

int glm_whole_row(const glm_peft *p, glm_tkind kind) {
    return p->kind == GLM_FT_LORA && (p->extra_modules & glm_extra_bit(kind));
}

static int freeze_trains(const glm_config *c, int layer, glm_tkind kind) {
    const glm_peft *p = &c->peft;
    if (glm_is_extra(kind)) return 0;
    if (layer < 0) return (p->extra_modules & glm_extra_bit(kind)) != 0;
    if (p->badam) return layer == p->badam_layer;
    int n = p->num_layer_trainable, mods = p->freeze_modules ? p->freeze_modules : ~0;
    int in = p->llama_pro ? layer % p->llama_pro == p->llama_pro - 1 : n > 0 ? layer >= c->num_layers - n : layer < -n;
    return in && (mods & layer_module_bit(glm_family_of(c), glm_layer_place(kind)));
}

/* the names --freeze_trainable_modules (layer modules) or --freeze_extra_modules takes, in
 * order, into buf as a comma list */
static const char *module_names(const glm_config *c, int extra, int bits, char *buf, size_t n) {
    const glm_family *fam = glm_family_of(c);
    size_t u = 0;
    int done = 0;
    buf[0] = 0;
    for (int i = 0; i < (extra ? 3 : GLM_LAYER_KINDS); i++) {
        const char *s = extra ? extra_row(c, 1 << i) : fam->layer_row[i];
        int bit = extra ? 1 << i : layer_module_bit(fam, i);
        if (!s || !(bits & bit) || (done & bit)) continue;
        size_t len;
        if (extra) extra_part(s, &s, &len);
        else len = first_part(s);
        done |= bit;
        if (u + len + 3 < n) u += (size_t)snprintf(buf + u, n - u, "%s%.*s", u ? ", " : "", (int)len, s);
    }
    return buf;
}

const char *glm_modules_str(const glm_config *c, int bits, int extra, char *buf, size_t n) {
    if (!extra && (!bits || bits == glm_modules_all(c))) return snprintf(buf, n, "all"), buf;
    if (extra && !bits) return snprintf(buf, n, "none"), buf;
    return module_names(c, extra, bits, buf, n);
}

const char *glm_freeze_describe(const glm_config *c, const glm_peft *p, char *buf, size_t n) {
    if (p->badam) return snprintf(buf, n, "layer %d (all modules; BAdam moves it along)", p->badam_layer), buf;
    int k = p->num_layer_trainable, lo = k > 0 ? c->num_layers - k : 0, hi = k > 0 ? c->num_layers - 1 : -k - 1;
    char mods[160], extra[96], span[96];
    if (p->llama_pro) { /* every llama_pro-th layer: all of them when few, else the first two and the last */
        int nb = c->num_layers / p->llama_pro;
        size_t u = (size_t)snprintf(span, sizeof span, "LLaMA Pro's added layer%s", nb > 1 ? "s" : "");
        for (int b = 0; b < nb && u < sizeof span; b++) {
            if (nb > 4 && b == 2) { u += (size_t)snprintf(span + u, sizeof span - u, ", ..."); b = nb - 2; continue; }
            u += (size_t)snprintf(span + u, sizeof span - u, "%s %d", b ? "," : "", (b + 1) * p->llama_pro - 1);
        }
    } else if (lo == hi) snprintf(span, sizeof span, "layer %d", lo);
    else snprintf(span, sizeof span, "layers %d-%d", lo, hi);
    glm_modules_str(c, p->freeze_modules, 0, mods, sizeof mods);
    snprintf(buf, n, "%s (%s%s)%s%s", span, mods, strcmp(mods, "all") ? "" : " modules", p->extra_modules ? " and " : "",
             p->extra_modules ? glm_modules_str(c, p->extra_modules, 1, extra, sizeof extra) : "");
    return buf;
}

int glm_modules_all(const glm_config *c) {
    int all = 0;
    for (int i = 0; i < GLM_LAYER_KINDS; i++) all |= layer_module_bit(glm_family_of(c), i);
    return all;
}

int glm_modules_parse(const glm_config *c, const char *flag, const char *list, int outside, int *bits, glm_err *err) {
    const glm_family *fam = glm_family_of(c);
    *bits = 0;
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        while (n && *p == ' ') p++, n--;
        while (n && p[n - 1] == ' ') n--;
        int bit = 0;
        if (!outside && n == 3 && !strncmp(p, "all", 3)) bit = glm_modules_all(c);
        char orig[64]; /* transformers' GLM layout names these modules its own way (model/hf_layout.h) */
        if (c->hf_layout && !bit && n && glm_hf_module_orig(p, n, orig, sizeof orig) == 0) { p = orig; n = strlen(p); }
        for (int i = 0; i < (outside ? 3 : GLM_LAYER_KINDS) && !bit && n; i++) {
            const char *s = outside ? extra_row(c, 1 << i) : fam->layer_row[i];
            size_t len;
            if (!s) continue;
            if (outside) extra_part(s, &s, &len);
            else len = first_part(s);
            if (len == n && !strncmp(s, p, n)) bit = outside ? 1 << i : layer_module_bit(fam, i);
        }
        if (!bit && n) {
            char names[160];
            module_names(c, outside, outside ? 7 : glm_modules_all(c), names, sizeof names);
            glm_fail(err, "%s: \"%.*s\" is not a module %s this model (%s)", flag, (int)n, p,
                     outside ? "outside the layers of" : "of a layer of", fam->name);
            int head = (n == 7 && !strncmp(p, "lm_head", 7)) || (n == 12 && !strncmp(p, "output_layer", 12));
            if (outside && head && c->tie_word_embeddings)
                return glm_hint(err, "the head is tied to the word embedding here: word_embeddings is the one matrix both use");
            return glm_hint(err, "use a comma list of %s%s", outside ? "" : "all, ", names);
        }
        *bits |= bit;
        if (!e) break;
        p = e + 1;
    }
    if (!outside && !*bits)
        return glm_fail(err, "%s is empty", flag), glm_hint(err, "all (every module of the layers that train), or e.g. mlp");
    return 0;
}

const char *glm_extra_module_name(const glm_config *c, int bit, char *buf, size_t n) {
    return module_names(c, 1, bit, buf, n);
}

int glm_extra_modules_check(const glm_config *c, const glm_peft *p, const char *src, glm_err *err) {
    int split = p->kind == GLM_FT_LORA && glm_lora_split(c, 0) > 1 && (p->lora_targets & GLM_LORA_QKV);
    /* DoRA's magnitude covers every row of the stacked q | k | v, so those without an adapter of
     * their own would train a magnitude peft does not have */
    if (split && p->use_dora && p->lora_qkv_parts && p->lora_qkv_parts != 7)
        return glm_fail(err, "%s: DoRA on some of q_proj, k_proj and v_proj: glmtrain runs DoRA on all three together",
                        src),
               glm_hint(err, "name all three (q_proj,k_proj,v_proj), or none of them, with --use_dora");
    if (p->kind != GLM_FT_LORA || !c->tie_word_embeddings || !(p->extra_modules & (GLM_EXTRA_EMB | GLM_EXTRA_HEAD)))
        return 0;
    glm_fail(err, "%s: a whole copy of the word embedding beside LoRA (modules_to_save), but this model's head is tied to it: "
                  "peft trains the copy as the input embedding alone and leaves the head on the original, which glmtrain's "
                  "one tied matrix cannot do", src);
    return glm_hint(err, "train the tied matrix with --finetuning_type freeze --freeze_extra_modules word_embeddings (or "
                         "full); beside LoRA, final_layernorm is the module that can train whole here");
}

int glm_tensor_trains(const glm_config *c, int layer, glm_tkind kind) {
    const glm_peft *p = &c->peft;
    if (glm_is_vhead(kind)) return c->value_head; /* with every finetuning type */
    switch (p->kind) {
    case GLM_FT_FULL: return !glm_is_extra(kind);
    case GLM_FT_LORA: /* the adapters, and peft's modules_to_save whole */
        if (!glm_is_lora(kind)) return glm_whole_row(p, kind);
        return (p->lora_targets >> glm_lora_module(kind) & 1) && (!glm_is_dora(kind) || p->use_dora) &&
               glm_lora_on_layer(p, layer);
    case GLM_FT_PTUNING: return glm_is_prefix(kind) && (kind == T_PREFIX_EMB || p->prefix_projection);
    case GLM_FT_FREEZE: return freeze_trains(c, layer, kind);
    default: return 0;
    }
}

int glm_tensor_quantized(const glm_config *c, int layer, glm_tkind kind) {
    /* a model for generation says full fine-tuning: nothing trains there, so all are quantized */
    return c->quant != GLM_Q_NONE && layer >= 0 && glm_is_linear_w(kind) &&
           (c->peft.kind == GLM_FT_FULL || !glm_tensor_trains(c, layer, kind));
}

/* Whether row (layer, kind) belongs in `part`; adapters exist only where they train. */
static int in_part(const glm_config *c, int layer, glm_tkind kind, glm_part part) {
    int trains = glm_tensor_trains(c, layer, kind);
    if (glm_is_extra(kind)) return trains && part == GLM_PART_TRAINABLE;
    if (part == GLM_PART_BASE) return 1;
    int q = glm_tensor_quantized(c, layer, kind);
    if (part == GLM_PART_QUANT) return q;
    return !q && (part == GLM_PART_TRAINABLE) == trains;
}

void glm_table_build_part(glm_table *tab, const glm_config *c, int l0, int l1, int with_embed, int with_head,
                          size_t unit_align, glm_part part) {
    int L = c->num_layers, H = c->hidden_size, F = c->inner_hidden_size, V = c->vocab_size, r = c->peft.lora_rank;
    *tab = (glm_table){0};
    tab->num_layers = L;
    tab->t = glm_calloc((size_t)L * (GLM_LAYER_KINDS + 12) + 16, sizeof(glm_tensor)); /* a layer's rows, 8 LoRA and 4 DoRA */
    tab->index = glm_malloc(sizeof(int) * (size_t)(L + 1) * T_NKINDS);
    for (int i = 0; i < (L + 1) * T_NKINDS; i++) tab->index[i] = -1;
    char n[128];
    int opened = 0; /* rows of the current unit so far */
#define ROW(kind, layer, name, nd, d0, d1) \
    do { if (in_part(c, layer, kind, part)) { add(tab, kind, layer, name, nd, d0, d1, part == GLM_PART_QUANT ? c->quant : GLM_Q_NONE); tab->t[tab->n - 1].opens_unit = !opened++; } } while (0)
    /* the prefix encoder feeds every layer: its gradient is final last, with the embedding's; a
     * pipeline stage without the embedding keeps its own copy for its layers (parallel/pipe/pipeline.c
     * sums the copies' gradients) */
    if (with_embed || (c->peft.pre_seq_len > 0 && l1 > l0)) {
        int64_t P = c->peft.pre_seq_len, KV = glm_prefix_width(c), E = glm_prefix_emb_width(c);
        ROW(T_PREFIX_EMB, -1, "transformer.prefix_encoder.embedding.weight", 2, P, E);
        ROW(T_PREFIX_W1, -1, "transformer.prefix_encoder.trans.0.weight", 2, H, E);
        ROW(T_PREFIX_B1, -1, "transformer.prefix_encoder.trans.0.bias", 1, H, 1);
        ROW(T_PREFIX_W2, -1, "transformer.prefix_encoder.trans.2.weight", 2, KV, H);
        ROW(T_PREFIX_B2, -1, "transformer.prefix_encoder.trans.2.bias", 1, KV, 1);
    }
    const glm_family *fam = glm_family_of(c);
    if (with_embed || (with_head && c->tie_word_embeddings))
        ROW(T_WORD_EMB, -1, fam->embed, 2, V, H);
    /* the widths of config.h: q|k|v, the attention output, the first MLP linear */
    int64_t W = glm_qkv_width(c), A = glm_attn_width(c), F1 = glm_fc1_width(c);
    /* each layer row's shape by kind (T_LN1_W on); a NULL name in the family: no such row */
    const int64_t shape[GLM_LAYER_KINDS][3] = {{1, H, 1}, {1, H, 1}, {2, W, H}, {1, W, 1}, {2, H, A}, {1, H, 1},
                                               {1, H, 1}, {1, H, 1}, {2, F1, H}, {1, F1, 1}, {2, H, F}, {1, H, 1},
                                               {1, H, 1}, {1, H, 1}};
    for (int l = l0; l < l1; l++) {
        unit_start(tab, unit_align);
        opened = 0;
        int np = snprintf(n, sizeof n, fam->layer_fmt, l);
        for (int k = 0; k < GLM_LAYER_KINDS; k++) {
            glm_tkind kind = glm_layer_kind(k);
            if (!fam->layer_row[k] || (kind == T_QKV_B && c->family == GLM_FAMILY_GLM2 && !c->qkv_bias)) continue;
            snprintf(n + np, sizeof n - np, "%s", fam->layer_row[k]);
            ROW(kind, l, n, (int)shape[k][0], shape[k][1], shape[k][2]);
        }
        for (int i = 0; i < 4; i++) {
            snprintf(n + np, sizeof n - np, "%s.lora_A.weight", fam->modules[i]);
            ROW(glm_lora_kind(i, 0), l, n, 2, (int64_t)r * glm_lora_split(c, i), glm_linear_in(c, i));
            snprintf(n + np, sizeof n - np, "%s.lora_B.weight", fam->modules[i]);
            int before = tab->n;
            ROW(glm_lora_kind(i, 1), l, n, 2, glm_linear_out(c, i), r);
            if (tab->n > before && c->peft.loraplus_lr_ratio > 0) tab->t[before].lr_scale = c->peft.loraplus_lr_ratio;
            snprintf(n + np, sizeof n - np, "%s.lora_magnitude_vector", fam->modules[i]);
            before = tab->n;
            ROW(glm_dora_kind(i), l, n, 1, glm_linear_out(c, i), 1);
            if (tab->n > before) tab->t[before].decay = 1; /* the Trainer's rule spares biases and norms by name:
                                                              * this vector decays */
        }
    }
    if (with_head) {
        unit_start(tab, unit_align);
        opened = 0;
        ROW(T_LNF_W, -1, fam->final_norm_w, 1, H, 1);
        if (fam->final_norm_b) ROW(T_LNF_B, -1, fam->final_norm_b, 1, H, 1);
        if (!c->tie_word_embeddings) ROW(T_LM_HEAD, -1, fam->head, 2, V, H);
        /* --stage rm: the value head reads the final norm's output instead of the LM head, which
         * then gets no gradient; without decay it stays as loaded (torch's AdamW skips it) */
        int head_row = tab->n - 1;
        if (c->value_head && head_row >= 0 && tab->t[head_row].kind == T_LM_HEAD) tab->t[head_row].decay = 0;
        ROW(T_VHEAD_W, -1, GLM_VHEAD_W, 2, 1, H);
        ROW(T_VHEAD_B, -1, GLM_VHEAD_B, 1, 1, 1);
    }
#undef ROW
    unit_start(tab, unit_align);
    for (int i = 0; part == GLM_PART_TRAINABLE && c->peft.galore_rank > 0 && i < tab->n; i++)
        tab->t[i].galore = glm_galore_applies(c, &tab->t[i]);
}

void glm_table_free(glm_table *tab) {
    free(tab->t);
    free(tab->index);
    *tab = (glm_table){0};
}

const glm_tensor *glm_table_get(const glm_table *tab, int layer, glm_tkind kind) {
    int slot = (layer < 0 ? tab->num_layers : layer) * T_NKINDS + kind;
    int i = tab->index[slot];
    return i < 0 ? NULL : &tab->t[i];
}

const glm_tensor *glm_table_find(const glm_table *tab, const char *name) {
    for (int i = 0; i < tab->n; i++)
        if (strcmp(tab->t[i].name, name) == 0) return &tab->t[i];
    return NULL;
}

int glm_table_units(const glm_table *tab, glm_span *out) {
    int n = 0;
    for (int i = 0; i < tab->n; i++) /* the table lists tensors in flat order */
        if (tab->t[i].opens_unit) out[n++].lo = tab->t[i].offset;
    for (int i = 0; i < n; i++) out[i].n = (i + 1 < n ? out[i + 1].lo : tab->total) - out[i].lo;
    return n;
}

void glm_table_unit_slots(const glm_table *tab, int tie_word_embeddings, size_t *ring, size_t *tied) {
    *ring = *tied = 0;
    const glm_tensor *wte = tie_word_embeddings ? glm_table_get(tab, -1, T_WORD_EMB) : NULL;
    glm_span *u = glm_malloc(sizeof *u * (size_t)(tab->n + 1));
    int nu = glm_table_units(tab, u);
    for (int i = 0; i < nu; i++) {
        if (wte && u[i].lo == wte->offset) *tied = u[i].n;
        else if (u[i].n > *ring) *ring = u[i].n;
    }
    free(u);
}

uint64_t glm_table_fingerprint(const glm_table *tab) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a, 64 bits */
    for (int i = 0; i < tab->n; i++) {
        const glm_tensor *t = &tab->t[i];
        for (const char *c = t->name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ULL;
        uint64_t v[2] = {t->offset, t->numel};
        for (int k = 0; k < 2; k++)
            for (int b = 0; b < 8; b++) h = (h ^ ((v[k] >> (8 * b)) & 0xff)) * 1099511628211ULL;
    }
    return h & 0x7fffffffffffffffULL; /* stored as int64 */
}

/* ---------------------------------------------------------------- GaLore */

int glm_galore_proj_parse(const char *name) {
    static const char *names[] = {"std", "reverse_std", "right", "left", "full"};
    for (int i = 0; i < 5; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

int glm_galore_applies(const glm_config *c, const glm_tensor *t) {
    const char *list = c->peft.galore_target;
    int head = t->kind == T_LM_HEAD;
    if (t->ndim != 2 || !(glm_is_linear_w(t->kind) || head) || !glm_tensor_trains(c, t->layer, t->kind)) return 0;
    if (!list[0] || strcmp(list, "all") == 0) return !head; /* find_all_linear_modules leaves the output layer out */
    /* LLaMA-Factory: any(target in name) over the module's full name */
    char module[128];
    snprintf(module, sizeof module, "%s", t->name);
    size_t n = strlen(module);
    if (n > 7 && strcmp(module + n - 7, ".weight") == 0) module[n - 7] = 0;
    for (const char *p = list; *p;) {
        while (*p == ',' || *p == ' ') p++;
        size_t k = strcspn(p, ",");
        while (k && p[k - 1] == ' ') k--;
        char part[160];
        snprintf(part, sizeof part, "%.*s", (int)k, p);
        if (k && strstr(module, part)) return 1;
        p += strcspn(p, ",");
    }
    return 0;
}

int glm_galore_shape(const glm_config *c, const glm_tensor *t, int *r, size_t *low, size_t *proj) {
    size_t rows = (size_t)t->shape[0], cols = (size_t)t->shape[1];
    int pt = c->peft.galore_proj, tall = rows >= cols;
    int right = pt == GLM_GALORE_RIGHT || (pt == GLM_GALORE_STD && tall) || (pt == GLM_GALORE_REVERSE_STD && !tall);
    size_t side = rows < cols ? rows : cols, rk = (size_t)c->peft.galore_rank < side ? (size_t)c->peft.galore_rank : side;
    *r = (int)rk;
    if (pt == GLM_GALORE_FULL) {
        *low = rk * rk;
        *proj = rk * (rows + cols);
        return GLM_GALORE_FROM_BOTH;
    }
    *low = rk * (right ? rows : cols);
    *proj = rk * (right ? cols : rows);
    return right ? GLM_GALORE_FROM_RIGHT : GLM_GALORE_FROM_LEFT;
}

void glm_galore_state(const glm_config *c, const glm_table *tab, size_t *flat, size_t *low, size_t *scratch, size_t *offset) {
    *flat = *low = *scratch = 0;
    for (int i = 0; i < tab->n; i++) {
        const glm_tensor *t = &tab->t[i];
        if (offset) offset[i] = t->galore ? (size_t)-1 : *flat;
        if (!t->galore) { *flat += (t->numel + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS; continue; }
        int r;
        size_t lo, pr;
        glm_galore_shape(c, t, &r, &lo, &pr);
        *low += 2 * lo + pr;
        if (t->numel > *scratch) *scratch = t->numel;
    }
}
