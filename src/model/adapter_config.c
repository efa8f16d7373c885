/* Reading an adapter folder's settings (adapter.h): peft's adapter_config.json checked against
 * its tensor names, or a P-Tuning v2 checkpoint's config.json. Apart from adapter.c (the tensors'
 * load, save and merge) so that it needs no model: tests/fuzz/fuzz_adapter_config.c runs it. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/fileutil.h"
#include "core/json_text.h"
#include "model/adapter.h"
#include "model/ckpt.h"
#include "model/family_names.h"

int glm_is_adapter_dir(const char *dir) {
    char path[4096];
    glm_path_join(path, sizeof path, dir, "adapter_config.json");
    return glm_is_file(path);
}

/* A P-Tuning v2 checkpoint (THUDM's ptuning output, or glmtrain's): config.json with
 * pre_seq_len; 0 when it is one, 1 when it is not, -1 on a broken file. */
static int read_ptuning(const char *dir, glm_peft *p, glm_err *err) {
    char path[4096];
    glm_path_join(path, sizeof path, dir, "config.json");
    if (!glm_is_file(path)) return 1;
    size_t len;
    char *text = glm_read_file(path, &len, err);
    if (!text) return -1;
    cJSON *o = glm_json_parse_doc(text, len, path, "a model's or P-Tuning checkpoint's config.json", err);
    free(text);
    if (!o) return -1;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "pre_seq_len");
    int rc = 1;
    if (cJSON_IsNumber(v) && v->valuedouble > 0 && (v->valuedouble != floor(v->valuedouble) || v->valuedouble > 65536)) {
        /* checked before any allocation: the prefix is [pre_seq_len, 2 L H] per layer stack */
        rc = glm_fail(err, "%s: pre_seq_len %g is not a P-Tuning v2 prefix length (a whole number of tokens, at most 65536; "
                           "THUDM's ptuning uses 128)", path, v->valuedouble);
    } else if (cJSON_IsNumber(v) && v->valueint > 0) {
        *p = (glm_peft){.kind = GLM_FT_PTUNING, .pre_seq_len = v->valueint,
                        .prefix_projection = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "prefix_projection"))};
        rc = 0;
    }
    cJSON_Delete(o);
    return rc;
}

int glm_adapter_file(const char *dir, char *path, size_t n) {
    glm_path_join(path, n, dir, "adapter_model.safetensors");
    if (glm_is_file(path)) return 0;
    glm_path_join(path, n, dir, "adapter_model.bin");
    return glm_is_file(path) ? 0 : -1;
}

/* The rows outside the layers in either family, by their GLM_EXTRA_* bits: what peft's
 * modules_to_save can hold whole beside the adapters. */
static const struct { const char *row; int bit; } outside_rows[] = {
    {GLM_V1_EMBED, GLM_EXTRA_EMB}, {GLM_V1_FINAL_NORM_W, GLM_EXTRA_LNF}, {GLM_V1_FINAL_NORM_B, GLM_EXTRA_LNF},
    {GLM_V1_HEAD, GLM_EXTRA_HEAD}, {GLM_V2_EMBED, GLM_EXTRA_EMB}, {GLM_V2_FINAL_NORM_W, GLM_EXTRA_LNF},
    {GLM_V2_HEAD, GLM_EXTRA_HEAD},
};

/* The bit of a row's Hugging Face name (transformer.output_layer.weight, lm_head.weight, ...), 0
 * for any other row. */
static int outside_bit_of_row(const char *name) {
    for (size_t i = 0; i < sizeof outside_rows / sizeof *outside_rows; i++)
        if (!strcmp(outside_rows[i].row, name)) return outside_rows[i].bit;
    return 0;
}

/* Whether module names path's last parts ("output_layer", "transformer.output_layer" of
 * "transformer.output_layer"), as peft matches the end of a module's name. */
static int names_end_of(const char *module, const char *path, size_t n) {
    size_t k = strlen(module);
    return k && k <= n && !strncmp(path + n - k, module, k) && (k == n || path[n - k - 1] == '.');
}

/* The bit of a module peft's modules_to_save names: a row's module (its name less .weight /
 * .bias), or ChatGLM2's transformer.embedding, which holds the word embedding alone. */
static int outside_bit_of_module(const char *module) {
    for (size_t i = 0; i < sizeof outside_rows / sizeof *outside_rows; i++) {
        const char *r = outside_rows[i].row;
        if (names_end_of(module, r, (size_t)(strrchr(r, '.') - r))) return outside_rows[i].bit;
    }
    return names_end_of(module, GLM_V2_EMBED_MODULE, strlen(GLM_V2_EMBED_MODULE)) ? GLM_EXTRA_EMB : 0;
}

/* The end of name when it ends with suffix, else NULL. */
static const char *ends_with(const char *name, const char *suffix) {
    size_t n = strlen(name), k = strlen(suffix);
    return n >= k && !strcmp(name + n - k, suffix) ? name + n - k : NULL;
}

/* What to do with an adapter glmtrain cannot apply as it is. */
static const char merge_hint[] = "merge the adapter into its base with peft (merge_and_unload, save_pretrained) and use the "
                                 "merged folder as --model_name_or_path";

/* The layer number in a tensor's name ("...layers.3.attention..."), -1 for none. */
static int name_layer(const char *name) {
    const char *p = strstr(name, "layers.");
    return p && p[7] >= '0' && p[7] <= '9' ? atoi(p + 7) : -1;
}

/* The module bit a peft LoRA tensor adapts: "<...>.<module>.lora_A.weight", lora_B, or DoRA's
 * "<module>.lora_magnitude_vector" (*dora set); a whole module's row of modules_to_save outside
 * the layers ("base_model.model.transformer.output_layer.weight") returns 0 with its GLM_EXTRA_*
 * bit in *extra. 0 with why for what glmtrain would not apply: peft's other tensors (whole copies
 * of modules in the layers, LoRA on embeddings, LoRA biases) or LoRA on another module. */
static int tensor_bit(const char *name, int *dora, int *extra, char *why, size_t n) {
    const char *end = ends_with(name, ".lora_A.weight");
    if (!end) end = ends_with(name, ".lora_B.weight");
    if (!end && (end = ends_with(name, ".lora_magnitude_vector"))) *dora = 1;
    if (!end && (end = ends_with(name, ".lora_magnitude_vector.weight"))) *dora = 1;
    if (end) {
        const char *leaf = end;
        while (leaf > name && leaf[-1] != '.') leaf--;
        char mod[64];
        snprintf(mod, sizeof mod, "%.*s", (int)(end - leaf), leaf);
        for (int bit = 1; bit <= 8; bit <<= 1)
            if (!strcmp(mod, glm_lora_target_name(bit))) return bit;
        snprintf(why, n, "LoRA on %s, a module glmtrain does not adapt (it adapts query_key_value, dense, dense_h_to_4h "
                         "and dense_4h_to_h)", mod);
    } else if (strstr(name, "lora_embedding_")) {
        snprintf(why, n, "LoRA on an embedding, which glmtrain does not adapt");
    } else if (strstr(name, ".lora_")) {
        snprintf(why, n, "not a LoRA A or B weight (a LoRA bias, lora_bias?)");
    } else if (!strncmp(name, GLM_ADAPTER_PREFIX, strlen(GLM_ADAPTER_PREFIX)) &&
               (*extra = outside_bit_of_row(name + strlen(GLM_ADAPTER_PREFIX)))) {
        return 0;
    } else {
        snprintf(why, n, "a whole module's weights (modules_to_save, LLaMA-Factory's --additional_target) of a module "
                         "glmtrain does not train whole beside LoRA (it does the word embedding, the final norm and the head)");
    }
    return 0;
}

/* Whether comma list `list` holds `name` as one of its items. */
static int in_list(const char *list, const char *name) {
    size_t n = strlen(name);
    if (!n) return 0; /* "final_layernorm.": an empty leaf, which the targets' parser refuses */
    for (const char *p = list; (p = strstr(p, name)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || !p[n])) return 1;
    return 0;
}

/* peft's target_modules -> module bits: a list of names, each a module's name or a dotted suffix
 * of its path (peft matches the end: "attention.query_key_value"; a path through a layer's number
 * sets *per_layer, LLaMA-Factory's list for LoRA on LLaMA Pro's added blocks: the tensors then say
 * which layers); 0 with *from_tensors set when it is a string peft reads as a regular expression,
 * or absent (then the tensors say which). */
static int config_targets(const cJSON *v, int *bits, int *qkv_parts, int *from_tensors, uint64_t *per_layer,
                          const char *path, glm_err *err) {
    char list[512] = "";
    int plain = 0;
    *from_tensors = !v || cJSON_IsNull(v);
    if (*from_tensors) return 0;
    if (cJSON_IsString(v)) {
        if (strpbrk(v->valuestring, ".*+?[](){}|^$\\")) { *from_tensors = 1; return 0; }
        snprintf(list, sizeof list, "%s", v->valuestring);
    }
    const cJSON *it, *arr = cJSON_IsArray(v) ? v : NULL;
    cJSON_ArrayForEach(it, arr) {
        if (!cJSON_IsString(it)) continue;
        const char *leaf = strrchr(it->valuestring, '.');
        leaf = leaf ? leaf + 1 : it->valuestring;
        int l = name_layer(it->valuestring); /* "transformer.layers.3.attention...": one layer's module */
        if (l >= 64) return glm_fail(err, "%s: target_modules \"%s\": glmtrain reads adapters of models up to 64 layers", path,
                                     it->valuestring);
        if (l >= 0) *per_layer |= 1ull << l;
        else plain = 1;
        if (l >= 0 && plain)
            return glm_fail(err, "%s: target_modules mixes modules of every layer with single layers' (\"%s\")", path,
                            it->valuestring),
                   glm_hint(err, "%s", merge_hint);
        if (in_list(list, leaf)) continue; /* the same module on another layer */
        if (strlen(list) + strlen(leaf) + 2 > sizeof list) break; /* longer than four names and commas: refused below */
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", list[0] ? "," : "", leaf);
    }
    if (*per_layer && plain)
        return glm_fail(err, "%s: target_modules mixes modules of every layer with single layers'", path),
               glm_hint(err, "%s", merge_hint);
    if (glm_lora_targets_parse_layout(list, -1, bits, qkv_parts, err)) return glm_wrap(err, "%s: target_modules: ", path);
    return 0;
}

/* Whether a key's value asks for something: true, a number, or a non-empty string, list or object
 * (peft writes false, null, [] and {} for what is off). */
static int set(const cJSON *v) {
    return cJSON_IsTrue(v) || cJSON_IsNumber(v) || (cJSON_IsString(v) && v->valuestring[0]) ||
           ((cJSON_IsArray(v) || cJSON_IsObject(v)) && v->child);
}

/* A key that changes what peft computes and glmtrain does not apply: refused, naming it and its value. */
static int unsupported_key(const cJSON *o, const char *path, glm_err *err) {
    static const struct { const char *key, *why; } keys[] = {
        {"lora_bias", "the adapter trains biases of its B sides; glmtrain's LoRA has none"},
        {"rank_pattern", "ranks that differ by module; glmtrain uses one r"},
        {"alpha_pattern", "alphas that differ by module; glmtrain uses one lora_alpha"},
        /* keys that change what peft computes, which a plain reading would silently drop */
        {"fan_in_fan_out", "the adapter's weights are laid out [in, out] (peft's setting for GPT-2's Conv1D); ChatGLM's "
                           "modules are nn.Linear, [out, in]"},
        {"layer_replication", "the adapter was trained on a model whose layers were replicated into a deeper stack"},
        {"trainable_token_indices", "the adapter trains some rows of the embedding as well"},
        {"target_parameters", "the adapter adapts parameters directly rather than linear modules"},
    };
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, keys[i].key);
        if (!set(v)) continue;
        char *s = cJSON_PrintUnformatted(v);
        glm_fail(err, "%s: %s %.200s: %s", path, keys[i].key, s, keys[i].why);
        free(s);
        return glm_hint(err, "%s", merge_hint);
    }
    return 0;
}

/* peft's init_lora_weights: how A and B started matters once the start changed the base too.
 * PiSSA's residual is rebuilt from the first values its folder carries (model/pissa.h); the
 * other inits that change the base (OLoRA, CorDA, LoftQ) cannot be rebuilt here and are refused
 * rather than applied to a base they were not trained on. */
static int init_weights(const cJSON *v, glm_peft *p, const char *path, glm_err *err) {
    if (!v || cJSON_IsBool(v) || cJSON_IsNull(v)) return 0;
    const char *s = cJSON_IsString(v) ? v->valuestring : NULL;
    static const char *const plain[] = {"gaussian", "eva", "orthogonal"}; /* the base stays as it was */
    for (size_t i = 0; s && i < sizeof plain / sizeof *plain; i++)
        if (!strcmp(s, plain[i])) return 0;
    if (s && !strcmp(s, "pissa")) { p->pissa = 1; p->pissa_niter = -1; return 0; }
    int n, used = 0;
    if (s && sscanf(s, "pissa_niter_%d%n", &n, &used) == 1 && !s[used] && n >= 0) { p->pissa = 1; p->pissa_niter = n; return 0; }
    char *text = cJSON_PrintUnformatted(v);
    glm_fail(err, "%s: init_lora_weights %.100s: %s", path, text,
             s && (!strcmp(s, "olora") || !strcmp(s, "corda") || !strcmp(s, "loftq"))
                 ? "that start changed the base weights too, so the adapter fits only that changed base"
                 : "glmtrain knows no such start (peft's: true, gaussian, eva, orthogonal, pissa, pissa_niter_N, olora, corda, "
                   "loftq)");
    free(text);
    return glm_hint(err, "convert it into a plain LoRA for the original base (peft: save_pretrained(..., "
                         "path_initial_model_for_weight_conversion=...)), or merge it with its own base and use that folder");
}

/* peft's modules_to_save -> GLM_EXTRA_* bits: the modules outside the layers (a name or a dotted
 * suffix of the module's path, as peft matches the end); any other module is refused. */
static int config_extra(const cJSON *v, int *bits, const char *path, glm_err *err) {
    const cJSON *it, *list = cJSON_IsArray(v) ? v : NULL;
    *bits = 0;
    cJSON_ArrayForEach(it, list) {
        int bit = cJSON_IsString(it) ? outside_bit_of_module(it->valuestring) : 0;
        if (!bit) {
            char *s = cJSON_PrintUnformatted(it);
            glm_fail(err, "%s: modules_to_save %.200s: glmtrain trains whole beside LoRA only the modules outside the layers "
                          "(word_embeddings, final_layernorm, lm_head or output_layer)", path, s);
            free(s);
            return glm_hint(err, "%s", merge_hint);
        }
        *bits |= bit;
    }
    if (cJSON_IsString(v) || (v && !cJSON_IsArray(v) && !cJSON_IsNull(v)))
        return glm_fail(err, "%s: modules_to_save is not a list of module names", path),
               glm_hint(err, "peft writes a list, e.g. [\"output_layer\"], or null");
    return 0;
}

/* The modules the adapter's tensors adapt (0 when it has no tensor file yet: the load says so),
 * every tensor one glmtrain applies: LoRA's, or a whole module that modules_to_save names
 * (GLM_EXTRA_* bits `whole`); layers[i]: the layers module bit 1 << i has tensors on. */
static int tensor_targets(const char *dir, int whole, int *bits, int *dora, uint64_t layers[4], glm_err *err) {
    char path[4096];
    *bits = *dora = 0;
    memset(layers, 0, 4 * sizeof *layers);
    if (glm_adapter_file(dir, path, sizeof path)) return 0;
    glm_ckpt c;
    if (glm_ckpt_open(&c, path, err)) return -1;
    int rc = 0;
    for (int i = 0; i < glm_ckpt_count(&c) && !rc; i++) {
        char why[256];
        const char *name = glm_ckpt_name(&c, i);
        int x = 0, bit = tensor_bit(name, dora, &x, why, sizeof why);
        if (x && !(x & whole)) snprintf(why, sizeof why, "a whole module (peft's modules_to_save), but the adapter_config.json's "
                                                         "modules_to_save does not name it");
        if (!bit && !(x & whole)) {
            rc = glm_fail(err, "%s: tensor %s: %s", path, name, why);
            glm_hint(err, "%s", merge_hint);
        }
        *bits |= bit;
        int l = bit ? name_layer(name) : -1;
        if (bit && l >= 64) {
            rc = glm_fail(err, "%s: tensor %s is on layer %d: glmtrain reads adapters of models up to 64 layers", path, name, l);
            break;
        }
        for (int i = 0; l >= 0 && i < 4; i++)
            if (bit == 1 << i) layers[i] |= 1ull << l;
    }
    if (!rc && glm_ckpt_count(&c) > 0 && !*bits) { /* whole modules alone: not a LoRA adapter's file */
        rc = glm_fail(err, "%s: none of its %d tensors is a LoRA A or B weight", path, glm_ckpt_count(&c));
        glm_hint(err, "the folder's adapter_config.json and tensor file come from different adapters");
    }
    glm_ckpt_close(&c);
    return rc;
}

/* ---- adapter lists ---- */

/* The items of a list end at commas, unless the whole string is one folder (a name with a comma). */
static int is_list(const char *list) { return list && strchr(list, ',') && !glm_is_dir(list); }

int glm_adapter_list_count(const char *list) {
    if (!list || !list[0]) return 0;
    if (!is_list(list)) return 1;
    int n = 1;
    for (const char *p = list; *p; p++) n += *p == ',';
    return n;
}

void glm_adapter_list_split(const char *list, int merge_all, char *merged, size_t nm, char *last, size_t nl) {
    merged[0] = last[0] = 0;
    if (!list || !list[0]) return;
    const char *cut = is_list(list) ? strrchr(list, ',') : NULL;
    if (merge_all) { snprintf(merged, nm, "%s", list); return; }
    if (!cut) { snprintf(last, nl, "%s", list); return; }
    snprintf(merged, nm, "%.*s", (int)(cut - list), list);
    snprintf(last, nl, "%s", cut + 1);
}

static int add_layer(const cJSON *v, uint64_t *mask, const char *path, glm_err *err) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= 64 || v->valuedouble != (int)v->valuedouble)
        return glm_fail(err, "%s: layers_to_transform: %s is not a layer number from 0 to 63", path,
                        cJSON_IsNumber(v) ? "a value" : "an entry");
    *mask |= 1ull << v->valueint;
    return 0;
}

/* peft's layers_to_transform (a layer number or a list of them) under layers_pattern "layers"
 * (ChatGLM's module paths: transformer.layers.N, transformer.encoder.layers.N) -> a layer mask. */
static int config_layers(const cJSON *o, uint64_t *mask, const char *path, glm_err *err) {
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(o, "layers_to_transform"), *lp = cJSON_GetObjectItemCaseSensitive(o, "layers_pattern");
    *mask = 0;
    if (!lt || cJSON_IsNull(lt) || (cJSON_IsArray(lt) && !lt->child)) return 0;
    const cJSON *pat = cJSON_IsArray(lp) && cJSON_GetArraySize(lp) == 1 ? lp->child : lp;
    if (pat && !cJSON_IsNull(pat) && !(cJSON_IsString(pat) && !strcmp(pat->valuestring, "layers"))) {
        char *s = cJSON_PrintUnformatted(lp);
        glm_fail(err, "%s: layers_pattern %.100s: ChatGLM's layers are found under \"layers\"", path, s);
        free(s);
        return glm_hint(err, "%s", merge_hint);
    }
    if (cJSON_IsNumber(lt)) return add_layer(lt, mask, path, err);
    if (!cJSON_IsArray(lt)) return glm_fail(err, "%s: layers_to_transform is not a layer number or a list of them", path);
    const cJSON *it;
    cJSON_ArrayForEach(it, lt) if (add_layer(it, mask, path, err)) return -1;
    return 0;
}

/* Every adapted module on the same layers (what one layer mask can say), and those layers_to_transform's
 * when it gives them. */
static int layer_set(int bits, const uint64_t layers[4], uint64_t cfg, const char *path, glm_err *err) {
    uint64_t first = 0;
    int seen = 0;
    for (int i = 0; i < 4; i++) {
        if (!(bits >> i & 1)) continue;
        if (seen && layers[i] != first)
            return glm_fail(err, "%s: the adapter's modules are on different layers (%s on other layers than %s)", path,
                            glm_lora_target_name(1 << i), glm_lora_target_name(bits & -bits)),
                   glm_hint(err, "%s", merge_hint);
        first = layers[i];
        seen = 1;
    }
    if (cfg && first != cfg)
        return glm_fail(err, "%s: names other layers (layers_to_transform, or target_modules of single layers) than the "
                             "adapter's tensors are on", path),
               glm_hint(err, "the folder's adapter_config.json and tensor file come from different adapters");
    return 0;
}

static uint64_t layers_of(int bits, const uint64_t layers[4]) {
    for (int i = 0; i < 4; i++)
        if (bits >> i & 1) return layers[i];
    return 0;
}

int glm_adapter_read_config(const char *dir, glm_peft *p, glm_err *err) {
    char path[4096];
    if (glm_adapter_list_count(dir) > 1) { /* a list where one folder is read */
        glm_fail(err, "%s names several adapters where one is read", dir);
        return glm_hint(err, "merge them into the base first (glmtrain merge --model_name_or_path BASE --adapter %s "
                             "--output_dir MERGED) and give MERGED as --model_name_or_path", dir);
    }
    glm_path_join(path, sizeof path, dir, "adapter_config.json");
    if (!glm_is_file(path)) {
        int pt = read_ptuning(dir, p, err);
        if (pt <= 0) return pt;
        glm_fail(err, "%s holds neither adapter_config.json (a LoRA adapter) nor a config.json with pre_seq_len (a P-Tuning v2 "
                      "checkpoint)", dir);
        return glm_hint(err, "pass the folder glmtrain wrote (--finetuning_type lora or ptuning: the output_dir or a "
                             "checkpoint-N in it), peft's save_pretrained folder, or THUDM's ptuning output");
    }
    size_t len;
    char *text = glm_read_file(path, &len, err);
    if (!text) return glm_hint(err, "--adapter takes a folder written by glmtrain (--finetuning_type lora) or by peft's save_pretrained");
    cJSON *o = glm_json_parse_doc(text, len, path, "peft's adapter_config.json", err);
    free(text);
    if (!o) return -1;
    int rc = 0, from_tensors = 0, file_bits = 0, file_dora = 0;
    uint64_t file_layers[4], cfg_layers = 0, per_layer = 0;
    const cJSON *v;
    *p = (glm_peft){.kind = GLM_FT_LORA, .lora_alpha = 8, .lora_rank = 8};
    if (!cJSON_IsObject(o)) { rc = glm_fail(err, "%s: not a JSON object", path); goto done; }
    v = cJSON_GetObjectItemCaseSensitive(o, "peft_type");
    if (cJSON_IsString(v) && strcmp(v->valuestring, "LORA") != 0) {
        rc = glm_fail(err, "%s: peft_type %s: glmtrain reads LoRA adapters (P-Tuning v2 prefixes live in config.json)", path, v->valuestring);
        goto done;
    }
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(o, "r"))) p->lora_rank = v->valueint;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(o, "lora_alpha"))) p->lora_alpha = (float)v->valuedouble;
    if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(o, "lora_dropout"))) p->lora_dropout = (float)v->valuedouble;
    p->use_rslora = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "use_rslora"));
    p->use_dora = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "use_dora"));
    if ((rc = init_weights(cJSON_GetObjectItemCaseSensitive(o, "init_lora_weights"), p, path, err))) goto done;
    if (p->lora_rank < 1) { rc = glm_fail(err, "%s: r must be at least 1", path); goto done; }
    if (!isfinite(p->lora_alpha)) { rc = glm_fail(err, "%s: lora_alpha is not a finite number", path); goto done; }
    v = cJSON_GetObjectItemCaseSensitive(o, "bias");
    if (cJSON_IsString(v) && strcmp(v->valuestring, "none") != 0) {
        rc = glm_fail(err, "%s: bias \"%s\": glmtrain's LoRA trains no biases", path, v->valuestring);
        glm_hint(err, "train the adapter with bias \"none\"");
        goto done;
    }
    if ((rc = unsupported_key(o, path, err))) goto done;
    if ((rc = config_targets(cJSON_GetObjectItemCaseSensitive(o, "target_modules"), &p->lora_targets, &p->lora_qkv_parts,
                             &from_tensors, &per_layer, path, err))) goto done;
    if ((rc = config_layers(o, &cfg_layers, path, err))) goto done;
    if (per_layer && cfg_layers && per_layer != cfg_layers) {
        rc = glm_fail(err, "%s: target_modules names modules of other layers than layers_to_transform", path);
        goto done;
    }
    if (per_layer) cfg_layers = per_layer; /* LLaMA-Factory's list: the layers its names give */
    if ((rc = config_extra(cJSON_GetObjectItemCaseSensitive(o, "modules_to_save"), &p->extra_modules, path, err))) goto done;
    if ((rc = tensor_targets(dir, p->extra_modules, &file_bits, &file_dora, file_layers, err))) goto done;
    if (file_dora && !p->use_dora) {
        rc = glm_fail(err, "%s: the adapter's tensors hold DoRA magnitude vectors (lora_magnitude_vector) but use_dora is not "
                           "true", path);
        glm_hint(err, "the folder's adapter_config.json and tensor file come from different adapters (a DoRA adapter's "
                      "config says \"use_dora\": true)");
        goto done;
    }
    if (from_tensors && !file_bits) {
        rc = glm_fail(err, "%s: target_modules is %s and the folder has no adapter tensors to read the modules from", path,
                      cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "target_modules")) ? "a regular expression" : "not given");
        goto done;
    }
    if (file_bits && (rc = layer_set(file_bits, file_layers, cfg_layers, path, err))) goto done;
    /* the layers: layers_to_transform's, or where per-layer names or an expression put tensors */
    p->lora_layers = cfg_layers ? cfg_layers : from_tensors && file_bits ? layers_of(file_bits, file_layers) : 0;
    if (from_tensors) p->lora_targets = file_bits; /* the modules the expression matched: those with tensors */
    else if (file_bits && file_bits != p->lora_targets) {
        char want[96], have[96];
        rc = glm_fail(err, "%s: target_modules says %s but the adapter's tensors adapt %s", path,
                      glm_lora_targets_str(p->lora_targets, want, sizeof want), glm_lora_targets_str(file_bits, have, sizeof have));
        glm_hint(err, "the folder's adapter_config.json and tensor file come from different adapters");
    }
done:
    cJSON_Delete(o);
    return rc;
}
