#include "model/config.h"
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/args.h"
#include "core/fileutil.h"
#include "core/json_text.h"
#include "model/hf_layout.h"

glm_config glm_config_chatglm6b(void) {
    return (glm_config){
        .vocab_size = 130528, .hidden_size = 4096, .num_layers = 28, .num_attention_heads = 32,
        .inner_hidden_size = 16384, .max_sequence_length = 2048, .layernorm_epsilon = 1e-5f,
        .position_encoding_2d = 1, .tie_word_embeddings = 1, .bos_token_id = 130004,
        .eos_token_id = 130005, .mask_token_id = 130000, .gmask_token_id = 130001,
        .pad_token_id = 3, .alpha = 7.483314773547883f,
    };
}

glm_config glm_config_chatglm2_6b(void) {
    return (glm_config){
        .family = GLM_FAMILY_GLM2, .vocab_size = 65024, .hidden_size = 4096, .num_layers = 28,
        .num_attention_heads = 32, .inner_hidden_size = 13696, .num_kv_heads = 2, .head_dim = 128,
        .rope_theta = 10000.0f, .qkv_bias = 1, .max_sequence_length = 32768, .layernorm_epsilon = 1e-5f,
        .tie_word_embeddings = 0, .bos_token_id = -1, .eos_token_id = 2, .mask_token_id = -1,
        .gmask_token_id = -1, .pad_token_id = 0, .alpha = 1.0f,
    };
}

/* Reads an integer field. required: missing is an error; optional: keeps *out. */
static int get_int(const cJSON *o, const char *key, int required, int32_t *out, const char *src, glm_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (!required) return 0;
        glm_fail(err, "%s: required field \"%s\" is missing", src, key);
        return glm_hint(err, "a chatglm-6b config.json has %s; compare with the original model's config", key);
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return glm_fail(err, "%s: field \"%s\" must be an integer", src, key);
    if (fabs(v->valuedouble) > 2147483647.0)
        return glm_fail(err, "%s: field \"%s\" is %.17g: out of range (a 32-bit integer, at most 2147483647)", src, key,
                        v->valuedouble);
    *out = (int32_t)v->valuedouble;
    return 0;
}

int glm_config_validate(const glm_config *c, const char *src, glm_err *err) {
    if (c->vocab_size <= 0) return glm_fail(err, "%s: vocab_size must be positive", src);
    if (c->hidden_size <= 0 || c->num_layers <= 0 || c->num_attention_heads <= 0 || c->inner_hidden_size <= 0)
        return glm_fail(err, "%s: hidden_size, num_layers, num_attention_heads and inner_hidden_size must be positive", src);
    if (c->family == GLM_FAMILY_GLM2) {
        int NH = c->num_attention_heads, NKV = glm_kv_heads(c);
        if (NKV <= 0 || NH % NKV)
            return glm_fail(err, "%s: num_attention_heads %d is not a multiple of multi_query_group_num %d", src, NH, NKV);
        if (glm_head_dim(c) % 4)
            return glm_fail(err, "%s: kv_channels %d must be a multiple of 4 (rotary turns pairs in the first half)", src,
                            glm_head_dim(c));
        if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
            return glm_fail(err, "%s: rope_ratio must be a positive number", src);
    } else {
        if (c->hidden_size % c->num_attention_heads)
            return glm_fail(err, "%s: hidden_size %d is not divisible by num_attention_heads %d", src, c->hidden_size, c->num_attention_heads);
        if (glm_head_dim(c) % 4)
            return glm_fail(err, "%s: head dim %d must be a multiple of 4 (2D rotary splits each head in two rotated halves)", src, glm_head_dim(c));
        if (!c->position_encoding_2d)
            return glm_fail(err, "%s: position_encoding_2d false is not supported (ChatGLM-6B uses 2D rotary)", src);
    }
    /* finite too: a JSON 1e100 becomes an inf float, and inf would be written out as bare `inf` */
    if (!(c->layernorm_epsilon > 0) || !isfinite(c->layernorm_epsilon))
        return glm_fail(err, "%s: layernorm_epsilon must be a positive number within float range", src);
    const struct { const char *name; int32_t id; } ids[] = {
        {"bos_token_id", c->bos_token_id}, {"eos_token_id", c->eos_token_id}, {"mask_token_id", c->mask_token_id},
        {"gmask_token_id", c->gmask_token_id}, {"pad_token_id", c->pad_token_id}};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if ((ids[i].id < 0 && !(c->family == GLM_FAMILY_GLM2 && ids[i].id == -1)) || ids[i].id >= c->vocab_size)
            return glm_fail(err, "%s: %s %d is outside the vocabulary [0, %d)", src, ids[i].name, ids[i].id, c->vocab_size);
    return 0;
}

/* eos_token_id: a number, or GLM-4's list, whose first is the tokenizer's eos and the rest chat
 * stops; *out keeps its value when absent. */
static int get_eos(const cJSON *o, int32_t *out, const char *src, glm_err *err) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "eos_token_id");
    if (cJSON_IsArray(e) && cJSON_GetArraySize(e) > 0 && cJSON_IsNumber(cJSON_GetArrayItem(e, 0))) {
        *out = cJSON_GetArrayItem(e, 0)->valueint;
        return 0;
    }
    return get_int(o, "eos_token_id", 0, out, src, err);
}

/* A boolean field: *out keeps its value when absent. */
static int get_bool(const cJSON *o, const char *key, int *out, const char *src, glm_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return glm_fail(err, "%s: field \"%s\" must be true or false", src, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* A number field: *out keeps its value when absent. */
static int get_float(const cJSON *o, const char *key, float *out, const char *src, glm_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v)) return glm_fail(err, "%s: field \"%s\" must be a number", src, key);
    *out = (float)v->valuedouble;
    return 0;
}

/* quantization_bit of a THUDM pre-quantized folder (its linear weights stored as int8 `weight` +
 * fp16 `weight_scale`): *quant a glm_qtype, GLM_Q_NONE when absent, null or 0. */
static int get_quant_bit(const cJSON *o, int *quant, const char *src, const char *hint, glm_err *err) {
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(o, "quantization_bit");
    *quant = GLM_Q_NONE;
    if (!q || cJSON_IsNull(q)) return 0;
    int qbit = cJSON_IsNumber(q) ? q->valueint : -1;
    if (!cJSON_IsNumber(q) || (qbit != 0 && qbit != 4 && qbit != 8)) {
        glm_fail(err, "%s: quantization_bit must be 0, 4 or 8 (THUDM's values), not %d", src, qbit);
        return glm_hint(err, "%s", hint);
    }
    *quant = qbit == 4 ? GLM_Q_INT4 : qbit == 8 ? GLM_Q_INT8 : GLM_Q_NONE;
    return 0;
}

/* ChatGLM2-6B / ChatGLM3-6B / GLM-4-9B's config.json (spec 11-12): the ChatGLM2 block. Options
 * THUDM's code has but no released model uses are refused by name rather than run wrong. */
static int parse_glm2(glm_config *c, const cJSON *o, const char *src, glm_err *err) {
    glm_config d = glm_config_chatglm2_6b();
    int32_t vocab = -1, padded = -1, hidden = 0, layers = 0, heads = 0, ffn = 0, kvc = 0, groups = 1, seq = d.max_sequence_length;
    int32_t eos = d.eos_token_id, pad = d.pad_token_id;
    int mqa = 0, rms = 1, post_ln_resid = 0, qkv_bias = 0, bias_linear = 0, post_ln = 1, orig_rope = 1, tie = 0;
    float eps = 1e-5f, rope_ratio = 1.0f;
    int rc = get_int(o, "padded_vocab_size", 0, &padded, src, err);
    if (!rc) rc |= get_int(o, "vocab_size", padded < 0, &vocab, src, err);
    if (!rc) rc |= get_int(o, "hidden_size", 1, &hidden, src, err);
    if (!rc) rc |= get_int(o, "num_layers", 1, &layers, src, err);
    if (!rc) rc |= get_int(o, "num_attention_heads", 1, &heads, src, err);
    if (!rc) rc |= get_int(o, "ffn_hidden_size", 1, &ffn, src, err);
    if (!rc) rc |= get_int(o, "kv_channels", 0, &kvc, src, err);
    if (!rc) rc |= get_int(o, "multi_query_group_num", 0, &groups, src, err);
    if (!rc) rc |= get_int(o, "seq_length", 0, &seq, src, err);
    if (!rc) rc |= get_eos(o, &eos, src, err);
    if (!rc) rc |= get_int(o, "pad_token_id", 0, &pad, src, err);
    if (!rc) rc |= get_bool(o, "multi_query_attention", &mqa, src, err);
    if (!rc) rc |= get_bool(o, "rmsnorm", &rms, src, err);
    if (!rc) rc |= get_bool(o, "apply_residual_connection_post_layernorm", &post_ln_resid, src, err);
    if (!rc) rc |= get_bool(o, "add_qkv_bias", &qkv_bias, src, err);
    if (!rc) rc |= get_bool(o, "add_bias_linear", &bias_linear, src, err);
    if (!rc) rc |= get_bool(o, "post_layer_norm", &post_ln, src, err);
    if (!rc) rc |= get_bool(o, "original_rope", &orig_rope, src, err);
    if (!rc) rc |= get_bool(o, "tie_word_embeddings", &tie, src, err);
    if (!rc) rc |= get_float(o, "layernorm_epsilon", &eps, src, err);
    if (!rc) rc |= get_float(o, "rope_ratio", &rope_ratio, src, err);
    if (rc) return -1;
    const char *refused = !rms ? "rmsnorm false (LayerNorm)" : post_ln_resid ? "apply_residual_connection_post_layernorm true"
                        : bias_linear ? "add_bias_linear true" : !post_ln ? "post_layer_norm false"
                        : !orig_rope ? "original_rope false" : tie ? "tie_word_embeddings true" : NULL;
    if (refused) {
        glm_fail(err, "%s: %s: no ChatGLM2/3 or GLM-4 model uses this option, and glmtrain does not run it", src, refused);
        return glm_hint(err, "compare with THUDM's config.json of chatglm2-6b, chatglm3-6b or glm-4-9b");
    }
    /* THUDM's chatglm2-6b-int4 layout (and glmtrain quantize's): int8 weight + fp16 weight_scale */
    int quant;
    if (get_quant_bit(o, &quant, src, "chatglm2-6b-int4 folders say 4, fp16 ones 0 or nothing", err)) return -1;
    *c = d;
    c->quant = quant;
    c->vocab_size = padded > 0 ? padded : vocab;
    c->hidden_size = hidden; c->num_layers = layers; c->num_attention_heads = heads; c->inner_hidden_size = ffn;
    c->head_dim = kvc > 0 ? kvc : heads > 0 ? hidden / heads : 0;
    c->num_kv_heads = mqa ? groups : heads;
    c->qkv_bias = qkv_bias;
    c->max_sequence_length = seq;
    c->layernorm_epsilon = eps;
    c->rope_theta = 10000.0f * rope_ratio;
    c->eos_token_id = eos; c->pad_token_id = pad;
    return 0;
}

/* transformers' GlmConfig (model_type glm, GlmForCausalLM: glm-4-9b-chat-hf) and Glm4Config
 * (model_type glm4: GLM-4-0414, the same keys and defaults), its defaults where a field is absent
 * (transformers 4.46's configuration_glm.py). Its attention takes the head
 * width as hidden_size / num_attention_heads and rotates head_dim / 2 of each head; GLM-4-9B's
 * head_dim says the same, and a config where they differ is refused rather than guessed. */
static int parse_glm_hf(glm_config *c, const cJSON *o, const char *src, glm_err *err) {
    glm_config d = glm_config_chatglm2_6b();
    int32_t vocab = 151552, hidden = 0, layers = 0, heads = 0, ffn = 0, kv = 2, hd = 128, seq = 131072;
    int32_t eos = 151329, pad = 151329;
    int bias = 1, tie = 0;
    float eps = 1.5625e-07f, theta = 10000.0f, partial = 0.5f;
    int rc = get_int(o, "vocab_size", 0, &vocab, src, err);
    if (!rc) rc |= get_int(o, "hidden_size", 1, &hidden, src, err);
    if (!rc) rc |= get_int(o, "num_hidden_layers", 1, &layers, src, err);
    if (!rc) rc |= get_int(o, "num_attention_heads", 1, &heads, src, err);
    if (!rc) rc |= get_int(o, "intermediate_size", 1, &ffn, src, err);
    if (!rc) rc |= get_int(o, "num_key_value_heads", 0, &kv, src, err);
    if (!rc) rc |= get_int(o, "head_dim", 0, &hd, src, err);
    if (!rc) rc |= get_int(o, "max_position_embeddings", 0, &seq, src, err);
    if (!rc) rc |= get_eos(o, &eos, src, err);
    if (!rc) rc |= get_int(o, "pad_token_id", 0, &pad, src, err);
    if (!rc) rc |= get_bool(o, "attention_bias", &bias, src, err);
    if (!rc) rc |= get_bool(o, "tie_word_embeddings", &tie, src, err);
    if (!rc) rc |= get_float(o, "rms_norm_eps", &eps, src, err);
    if (!rc) rc |= get_float(o, "rope_theta", &theta, src, err);
    if (!rc) rc |= get_float(o, "partial_rotary_factor", &partial, src, err);
    /* later transformers write the rotary settings as rope_parameters */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(o, "rope_parameters");
    const cJSON *rtype = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
    if (!rc && cJSON_IsObject(rp)) rc |= get_float(rp, "rope_theta", &theta, src, err);
    if (!rc && cJSON_IsObject(rp)) rc |= get_float(rp, "partial_rotary_factor", &partial, src, err);
    if (rc) return -1;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(o, "hidden_act");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
    const char *refused = act && !(cJSON_IsString(act) && !strcmp(act->valuestring, "silu")) ? "hidden_act other than silu"
                        : tie ? "tie_word_embeddings true" : partial != 0.5f ? "partial_rotary_factor other than 0.5"
                        : rs && !cJSON_IsNull(rs) ? "rope_scaling"
                        : rtype && !(cJSON_IsString(rtype) && !strcmp(rtype->valuestring, "default")) ? "a rope_type other than default"
                        : NULL;
    if (refused) {
        glm_fail(err, "%s: %s: no GLM-4 model uses this option, and glmtrain does not run it", src, refused);
        return glm_hint(err, "compare with the config.json of THUDM/glm-4-9b-chat-hf or THUDM/GLM-4-9B-0414");
    }
    if (heads > 0 && (int64_t)hd * heads != hidden) {
        glm_fail(err, "%s: head_dim %d is not hidden_size / num_attention_heads (%d / %d)", src, hd, hidden, heads);
        return glm_hint(err, "transformers' GlmAttention takes its head width from hidden_size / num_attention_heads "
                             "and its rotary width from head_dim; GLM-4-9B has them equal (128)");
    }
    *c = d;
    c->hf_layout = 1;
    c->vocab_size = vocab;
    c->hidden_size = hidden; c->num_layers = layers; c->num_attention_heads = heads; c->inner_hidden_size = ffn;
    c->head_dim = hd;
    c->num_kv_heads = kv;
    c->qkv_bias = bias;
    c->max_sequence_length = seq;
    c->layernorm_epsilon = eps;
    c->rope_theta = theta;
    c->eos_token_id = eos; c->pad_token_id = pad;
    return 0;
}

int glm_config_parse(glm_config *c, const char *text, const char *src, glm_err *err) {
    cJSON *o = glm_json_parse_doc(text, strlen(text), src, "config.json of a chatglm model", err);
    if (!o) return -1;
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return glm_fail(err, "%s: not a JSON object (config.json of a chatglm model expected)", src);
    }
    /* transformers' own classes for GLM-4: GlmForCausalLM (glm-4-9b-chat-hf) is the ChatGLM2 block
     * under other names; Glm4ForCausalLM (GLM-4-0414, GLM-Z1) adds two norms a layer */
    const cJSON *mt0 = cJSON_GetObjectItemCaseSensitive(o, "model_type");
    int glm4 = cJSON_IsString(mt0) && !strcmp(mt0->valuestring, "glm4");
    if (glm4 || (cJSON_IsString(mt0) && !strcmp(mt0->valuestring, "glm"))) {
        int rc = parse_glm_hf(c, o, src, err);
        c->sandwich_norms = glm4;
        cJSON_Delete(o);
        return rc ? rc : glm_config_validate(c, src, err);
    }
    /* ChatGLM2/3 and GLM-4 folders say model_type chatglm too, with the ChatGLM2 block's fields */
    static const char *const later[] = {"padded_vocab_size", "multi_query_attention", "ffn_hidden_size", "kv_channels", "rmsnorm"};
    for (size_t i = 0; i < sizeof later / sizeof later[0]; i++)
        if (cJSON_GetObjectItemCaseSensitive(o, later[i]) && !cJSON_GetObjectItemCaseSensitive(o, "inner_hidden_size")) {
            int rc = parse_glm2(c, o, src, err);
            cJSON_Delete(o);
            return rc ? rc : glm_config_validate(c, src, err);
        }
    glm_config d = glm_config_chatglm6b();
    int32_t vocab = 0, hidden = 0, layers = 0, heads = 0, inner = -1, maxseq = d.max_sequence_length;
    int32_t bos = d.bos_token_id, eos = d.eos_token_id, mask = d.mask_token_id, gmask = d.gmask_token_id, pad = d.pad_token_id;
    int rc = 0;
    rc |= get_int(o, "vocab_size", 1, &vocab, src, err);
    if (!rc) rc |= get_int(o, "hidden_size", 1, &hidden, src, err);
    if (!rc) rc |= get_int(o, "num_layers", 1, &layers, src, err);
    if (!rc) rc |= get_int(o, "num_attention_heads", 1, &heads, src, err);
    if (!rc) rc |= get_int(o, "inner_hidden_size", 0, &inner, src, err);
    if (!rc) rc |= get_int(o, "max_sequence_length", 0, &maxseq, src, err);
    if (!rc) rc |= get_int(o, "bos_token_id", 0, &bos, src, err);
    if (!rc) rc |= get_int(o, "eos_token_id", 0, &eos, src, err);
    if (!rc) rc |= get_int(o, "mask_token_id", 0, &mask, src, err);
    if (!rc) rc |= get_int(o, "gmask_token_id", 0, &gmask, src, err);
    if (!rc) rc |= get_int(o, "pad_token_id", 0, &pad, src, err);
    if (rc) { cJSON_Delete(o); return -1; }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(o, "model_type");
    if (mt && cJSON_IsString(mt) && strcmp(mt->valuestring, "chatglm") != 0) {
        glm_fail(err, "%s: model_type \"%s\" is not \"chatglm\"", src, mt->valuestring); /* before the delete frees it */
        cJSON_Delete(o);
        return -1;
    }
    float epsv = 1e-5f;
    int pe2d = 1, tie = 1;
    if (get_float(o, "layernorm_epsilon", &epsv, src, err) || get_bool(o, "position_encoding_2d", &pe2d, src, err) ||
        get_bool(o, "tie_word_embeddings", &tie, src, err)) {
        cJSON_Delete(o);
        return -1;
    }
    /* a THUDM pre-quantized folder (chatglm-6b-int4/int8): its linear weights are stored as
     * int8 `weight` + fp16 `weight_scale` */
    int quant;
    if (get_quant_bit(o, &quant, src, "chatglm-6b-int4 folders say 4, chatglm-6b-int8 say 8, fp16 ones 0 or nothing", err)) {
        cJSON_Delete(o);
        return -1;
    }
    const cJSON *qe = cJSON_GetObjectItemCaseSensitive(o, "quantization_embeddings");
    if (quant != GLM_Q_NONE && cJSON_IsTrue(qe)) { /* chatglm-6b-int4-qe: the embedding quantized too */
        cJSON_Delete(o);
        glm_fail(err, "%s: quantization_embeddings true (chatglm-6b-int4-qe): a quantized embedding is not supported", src);
        return glm_hint(err, "use chatglm-6b-int4 (embedding in float16), or the float16 chatglm-6b with --quantization_bit 4");
    }
    cJSON_Delete(o);
    *c = (glm_config){
        .vocab_size = vocab, .hidden_size = hidden, .num_layers = layers, .num_attention_heads = heads,
        /* 4H would overflow int for a huge hidden_size: -1 then fails validation */
        .inner_hidden_size = inner > 0 ? inner : hidden > 0 && hidden <= INT32_MAX / 4 ? 4 * hidden : -1,
        .max_sequence_length = maxseq,
        .layernorm_epsilon = epsv, .position_encoding_2d = pe2d, .tie_word_embeddings = tie,
        .bos_token_id = bos, .eos_token_id = eos, .mask_token_id = mask, .gmask_token_id = gmask,
        .pad_token_id = pad, .alpha = 7.483314773547883f, .quant = quant,
    };
    return glm_config_validate(c, src, err);
}

int glm_config_load(glm_config *c, const char *path, glm_err *err) {
    char file[4096];
    if (glm_is_dir(path)) glm_path_join(file, sizeof file, path, "config.json");
    else snprintf(file, sizeof file, "%s", path);
    char *text = glm_read_file(file, NULL, err);
    if (!text) return glm_hint(err, "--model_name_or_path must be a folder with config.json (a Hugging Face chatglm-6b folder)");
    int rc = glm_config_parse(c, text, file, err);
    free(text);
    return rc;
}

/* ChatGLM2-6B's config.json keys (what its modeling_chatglm.py reads). */
/* What both families' config.json open with: the architecture and the names of THUDM's code
 * files, as the original config.json has them (a folder made from this config loads with
 * trust_remote_code once those files are copied in); ChatGLM2's maps AutoModelForCausalLM too. */
static cJSON *config_object(int causal_lm) {
    cJSON *o = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("ChatGLMModel"));
    cJSON *am = cJSON_AddObjectToObject(o, "auto_map");
    cJSON_AddStringToObject(am, "AutoConfig", "configuration_chatglm.ChatGLMConfig");
    cJSON_AddStringToObject(am, "AutoModel", "modeling_chatglm.ChatGLMForConditionalGeneration");
    if (causal_lm) cJSON_AddStringToObject(am, "AutoModelForCausalLM", "modeling_chatglm.ChatGLMForConditionalGeneration");
    cJSON_AddStringToObject(am, "AutoModelForSeq2SeqLM", "modeling_chatglm.ChatGLMForConditionalGeneration");
    cJSON_AddStringToObject(o, "model_type", "chatglm");
    return o;
}

static char *glm2_config_json(const glm_config *c) {
    cJSON *o = config_object(1);
    cJSON_AddBoolToObject(o, "add_bias_linear", 0);
    cJSON_AddBoolToObject(o, "add_qkv_bias", c->qkv_bias);
    cJSON_AddBoolToObject(o, "apply_query_key_layer_scaling", 1);
    cJSON_AddBoolToObject(o, "apply_residual_connection_post_layernorm", 0);
    cJSON_AddNumberToObject(o, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(o, "attention_softmax_in_fp32", 1);
    cJSON_AddBoolToObject(o, "bias_dropout_fusion", 1);
    cJSON_AddNumberToObject(o, "ffn_hidden_size", c->inner_hidden_size);
    cJSON_AddBoolToObject(o, "fp32_residual_connection", 0);
    cJSON_AddNumberToObject(o, "hidden_dropout", 0.0);
    cJSON_AddNumberToObject(o, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(o, "kv_channels", glm_head_dim(c));
    char eps[32];
    glm_json_float(eps, sizeof eps, c->layernorm_epsilon);
    cJSON_AddRawToObject(o, "layernorm_epsilon", eps);
    cJSON_AddBoolToObject(o, "multi_query_attention", glm_kv_heads(c) != c->num_attention_heads);
    cJSON_AddNumberToObject(o, "multi_query_group_num", glm_kv_heads(c));
    cJSON_AddNumberToObject(o, "num_attention_heads", c->num_attention_heads);
    cJSON_AddNumberToObject(o, "num_layers", c->num_layers);
    cJSON_AddBoolToObject(o, "original_rope", 1);
    cJSON_AddNumberToObject(o, "padded_vocab_size", c->vocab_size);
    cJSON_AddBoolToObject(o, "post_layer_norm", 1);
    cJSON_AddBoolToObject(o, "rmsnorm", 1);
    if (c->rope_theta != 10000.0f) {
        char r[32];
        glm_json_float(r, sizeof r, c->rope_theta / 10000.0f);
        cJSON_AddRawToObject(o, "rope_ratio", r);
    }
    cJSON_AddNumberToObject(o, "seq_length", c->max_sequence_length);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", 0);
    cJSON_AddNumberToObject(o, "eos_token_id", c->eos_token_id);
    cJSON_AddNumberToObject(o, "pad_token_id", c->pad_token_id);
    cJSON_AddBoolToObject(o, "use_cache", 1);
    cJSON_AddStringToObject(o, "torch_dtype", "float32");
    cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

/* transformers' GlmConfig keys (model_type glm), as its save_pretrained writes them */
static char *glm_hf_config_json(const glm_config *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(c->sandwich_norms ? "Glm4ForCausalLM" : "GlmForCausalLM"));
    cJSON_AddBoolToObject(o, "attention_bias", c->qkv_bias);
    cJSON_AddNumberToObject(o, "attention_dropout", 0.0);
    cJSON_AddNumberToObject(o, "eos_token_id", c->eos_token_id);
    cJSON_AddNumberToObject(o, "head_dim", glm_head_dim(c));
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddNumberToObject(o, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(o, "initializer_range", 0.02);
    cJSON_AddNumberToObject(o, "intermediate_size", c->inner_hidden_size);
    cJSON_AddNumberToObject(o, "max_position_embeddings", c->max_sequence_length);
    cJSON_AddStringToObject(o, "model_type", c->sandwich_norms ? "glm4" : "glm");
    if (c->sandwich_norms) cJSON_AddNumberToObject(o, "partial_rotary_factor", 0.5);
    cJSON_AddNumberToObject(o, "num_attention_heads", c->num_attention_heads);
    cJSON_AddNumberToObject(o, "num_hidden_layers", c->num_layers);
    cJSON_AddNumberToObject(o, "num_key_value_heads", glm_kv_heads(c));
    cJSON_AddNumberToObject(o, "pad_token_id", c->pad_token_id);
    char r[32];
    glm_json_float(r, sizeof r, c->layernorm_epsilon);
    cJSON_AddRawToObject(o, "rms_norm_eps", r);
    glm_json_float(r, sizeof r, c->rope_theta);
    cJSON_AddRawToObject(o, "rope_theta", r);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", 0);
    cJSON_AddStringToObject(o, "torch_dtype", "float32");
    cJSON_AddBoolToObject(o, "use_cache", 1);
    cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

char *glm_config_to_json(const glm_config *c) {
    if (c->hf_layout) return glm_hf_config_json(c);
    if (c->family == GLM_FAMILY_GLM2) return glm2_config_json(c);
    cJSON *o = config_object(0);
    cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(o, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(o, "num_layers", c->num_layers);
    cJSON_AddNumberToObject(o, "num_attention_heads", c->num_attention_heads);
    cJSON_AddNumberToObject(o, "inner_hidden_size", c->inner_hidden_size);
    cJSON_AddNumberToObject(o, "max_sequence_length", c->max_sequence_length);
    char eps[32];
    glm_json_float(eps, sizeof eps, c->layernorm_epsilon); /* 1e-05, not 9.99999974737875e-06 */
    cJSON_AddRawToObject(o, "layernorm_epsilon", eps);
    cJSON_AddBoolToObject(o, "position_encoding_2d", c->position_encoding_2d);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddNumberToObject(o, "bos_token_id", c->bos_token_id);
    cJSON_AddNumberToObject(o, "eos_token_id", c->eos_token_id);
    cJSON_AddNumberToObject(o, "mask_token_id", c->mask_token_id);
    cJSON_AddNumberToObject(o, "gmask_token_id", c->gmask_token_id);
    cJSON_AddNumberToObject(o, "pad_token_id", c->pad_token_id);
    cJSON_AddBoolToObject(o, "use_cache", 1);
    cJSON_AddStringToObject(o, "torch_dtype", "float32");
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

float glm_lora_scaling(const glm_peft *p) {
    if (p->lora_rank <= 0) return 0;
    return p->use_rslora ? p->lora_alpha / sqrtf((float)p->lora_rank) : p->lora_alpha / (float)p->lora_rank;
}

static const char *const lora_names[4] = {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"};

const char *glm_lora_target_name(int bit) {
    for (int i = 0; i < 4; i++)
        if (bit == 1 << i) return lora_names[i];
    return "?";
}

const char *glm_lora_targets_str(int bits, char *buf, size_t n) {
    buf[0] = 0;
    for (int i = 0; i < 4; i++)
        if (bits >> i & 1) snprintf(buf + strlen(buf), n - strlen(buf), "%s%s", buf[0] ? "," : "", lora_names[i]);
    return buf;
}

int glm_lora_targets_parse_layout(const char *list, int hf_layout, int *bits, int *qkv_parts, glm_err *err) {
    *bits = 0;
    const char *p = list;
    int qkv = 0, whole = 0; /* transformers' q_proj, k_proj, v_proj seen (bits 1, 2, 4); query_key_value or all */
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        while (n && (*p == ' ')) { p++; n--; }
        while (n && p[n - 1] == ' ') n--;
        int bit = 0;
        if (n == 3 && strncmp(p, "all", 3) == 0) bit = GLM_LORA_ALL;
        for (int i = 0; i < 4 && !bit; i++)
            if (strlen(lora_names[i]) == n && strncmp(p, lora_names[i], n) == 0) bit = 1 << i;
        whole |= bit & GLM_LORA_QKV;
        char orig[64] = ""; /* transformers' GLM layout's names */
        if (!bit && n) glm_hf_module_orig(p, n, orig, sizeof orig);
        for (int i = 0; i < 4 && *orig && !bit; i++)
            if (!strcmp(orig, lora_names[i])) bit = 1 << i;
        if (bit && *orig) {
            if (hf_layout == 0) {
                glm_fail(err, "--lora_target: \"%.*s\" is a module of transformers' GLM layout (glm-4-9b-chat-hf), and "
                              "this model is in THUDM's", (int)n, p);
                return glm_hint(err, "name THUDM's modules: query_key_value, dense, dense_h_to_4h, dense_4h_to_h, or all");
            }
            if (n == 6 && p[1] == '_' && strchr("qkv", p[0])) qkv |= p[0] == 'q' ? 1 : p[0] == 'k' ? 2 : 4;
        }
        if (!bit && n) {
            glm_fail(err, "--lora_target: \"%.*s\" is not a linear module of %s", (int)n, p,
                     hf_layout == 1 ? "GLM-4 in transformers' layout" : "ChatGLM-6B");
            return glm_hint(err, "%s", hf_layout == 1 ? "use a comma list of q_proj, k_proj, v_proj, o_proj, gate_up_proj, "
                                                       "down_proj (or THUDM's names), or all"
                                                     : "use a comma list of query_key_value, dense, dense_h_to_4h, dense_4h_to_h, or all");
        }
        *bits |= bit;
        if (!e) break;
        p = e + 1;
    }
    if (qkv_parts) *qkv_parts = whole || qkv == 7 ? 0 : qkv;
    if (!*bits) return glm_fail(err, "--lora_target is empty"), glm_hint(err, "e.g. --lora_target query_key_value");
    return 0;
}

int glm_lora_targets_parse(const char *list, int *bits, glm_err *err) {
    return glm_lora_targets_parse_layout(list, -1, bits, NULL, err);
}

int glm_quant_parse(int bits, const char *type, int *q, glm_err *err) {
    int nf4 = type && strcmp(type, "nf4") == 0;
    if (type && !nf4 && strcmp(type, "int") != 0)
        return glm_fail(err, "--quantization_type %s: not a quantization type", type), glm_hint(err, "use int (THUDM's INT8/INT4) or nf4 (QLoRA)");
    if (bits != 0 && bits != 4 && bits != 8)
        return glm_fail(err, "--quantization_bit %d: only 4 and 8 are supported (THUDM's quantization_bit)", bits),
               glm_hint(err, "use --quantization_bit 4 (INT4) or 8 (INT8), or leave it out for the weights as stored");
    if (nf4 && bits == 8)
        return glm_fail(err, "--quantization_type nf4 is 4-bit: --quantization_bit 8 contradicts it"),
               glm_hint(err, "use --quantization_bit 4 (or leave it out) with nf4");
    *q = nf4 ? GLM_Q_NF4 : bits == 4 ? GLM_Q_INT4 : bits == 8 ? GLM_Q_INT8 : GLM_Q_NONE;
    return 0;
}

int glm_config_set_quant(glm_config *c, int bits, const char *type, const char *src, glm_err *err) {
    int want = GLM_Q_NONE;
    if (glm_quant_parse(bits, type, &want, err)) return -1;
    if (c->quant != GLM_Q_NONE && want != GLM_Q_NONE && want != c->quant) {
        glm_fail(err, "%s stores its weights as %s (config.json quantization_bit %d), but this run asks for %s", src,
                 glm_qtype_name((glm_qtype)c->quant), glm_qtype_bits((glm_qtype)c->quant), glm_qtype_name((glm_qtype)want));
        return glm_hint(err, "drop --quantization_bit/--quantization_type to use the folder's, or start from the float16 model");
    }
    if (want != GLM_Q_NONE) c->quant = want;
    return 0;
}
