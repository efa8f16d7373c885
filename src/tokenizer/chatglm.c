/* The public tokenizer (tokenizer.h): loads a SentencePiece model from a folder or file, decides
 * whether it is ChatGLM-6B (ice_text.model: the <n>/<|tab|>/<|blank_N|> layer and [gMASK] <sop>
 * suffix), ChatGLM2/3 (a tokenizer_config.json naming ChatGLMTokenizer next to a model without
 * [gMASK]: specials appended after the pieces, [gMASK] sop prefix) or a plain SentencePiece model, resolves special ids (tokenizer_config.json may rename them) and
 * wraps encoding/decoding with the matching pre/post-processing. A tokenizer.model that is a text
 * rank file instead of a protobuf is GLM-4's byte-level BPE: every call for it goes to glm4.c. */
#include "tokenizer/bpe_bytes.h"
#include "tokenizer/spm.h"
#include "tokenizer/chatglm2.h"
#include "core/fileutil.h"
#include "core/json_text.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct glm_config {
    char bos[64], eos[64], mask[64], gmask[64], pad[64], unk[64];
    int num_image_tokens;     /* -1: not given */
    int remove_space, do_lower_case;
    int is_chatglm;           /* tokenizer_class == ChatGLMTokenizer */
    int version;              /* 2 or 3 as name_or_path / chat_template tell, 0: they do not */
    int encode_special;       /* encode_special_tokens (a ChatGLM3 tokenizer argument) */
} glm_config;

/* A token entry is a string or an AddedToken object {"content": ...}. */
static void cfg_token(const cJSON *root, const char *key, char *dst, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (cJSON_IsString(v) && v->valuestring && strlen(v->valuestring) < cap) strcpy(dst, v->valuestring);
}

static int read_config(const char *path, glm_config *c, glm_err *err) {
    size_t len;
    char *txt = glm_read_file(path, &len, err);
    if (!txt) return -1;
    cJSON *root = glm_json_parse_doc(txt, len, path, "tokenizer_config.json", err);
    free(txt);
    if (!root) return -1;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return glm_fail(err, "%s: not a valid JSON object", path);
    }
    cfg_token(root, "bos_token", c->bos, sizeof c->bos);
    cfg_token(root, "eos_token", c->eos, sizeof c->eos);
    cfg_token(root, "mask_token", c->mask, sizeof c->mask);
    cfg_token(root, "gmask_token", c->gmask, sizeof c->gmask);
    cfg_token(root, "pad_token", c->pad, sizeof c->pad);
    cfg_token(root, "unk_token", c->unk, sizeof c->unk);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "num_image_tokens");
    if (cJSON_IsNumber(v)) c->num_image_tokens = v->valueint;
    c->remove_space = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "remove_space"));
    c->do_lower_case = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "do_lower_case"));
    v = cJSON_GetObjectItemCaseSensitive(root, "tokenizer_class");
    c->is_chatglm = cJSON_IsString(v) && strcmp(v->valuestring, "ChatGLMTokenizer") == 0;
    v = cJSON_GetObjectItemCaseSensitive(root, "name_or_path");
    if (cJSON_IsString(v) && (strstr(v->valuestring, "chatglm2") || strstr(v->valuestring, "codegeex2"))) c->version = 2;
    if (cJSON_IsString(v) && strstr(v->valuestring, "chatglm3")) c->version = 3;
    v = cJSON_GetObjectItemCaseSensitive(root, "chat_template"); /* ChatGLM3's writes <|{{ message['role'] }}|> */
    if (!c->version && cJSON_IsString(v) && strstr(v->valuestring, "<|")) c->version = 3;
    c->encode_special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "encode_special_tokens"));
    cJSON_Delete(root);
    return 0;
}

static int32_t sp_id(const glm_tokenizer *t, const char *piece) {
    return spm_piece_to_id(&t->sp, piece, strlen(piece));
}

static int setup_chatglm1(glm_tokenizer *t, const glm_config *c, int have_cfg, const char *what, glm_err *err) {
    t->kind = GLM_TOK_CHATGLM1;
    /* Without a config the file is the current ("slim") release: no image tokens. A config that
     * omits the key gets the class default 20000 (the pre-slim layout), as HF would. */
    t->offset = !have_cfg ? 0 : c->num_image_tokens >= 0 ? c->num_image_tokens : 20000;
    if (t->offset < 0 || t->offset > (1 << 24)) return glm_fail(err, "%s: num_image_tokens %d is out of range", what, t->offset);
    t->remove_space = c->remove_space;
    struct { const char *name; int32_t *dst; int required; } sp[] = {
        {c->gmask, &t->ids.gmask, 1}, {c->bos, &t->ids.sop, 1}, {c->eos, &t->ids.eop, 1},
        {c->mask, &t->ids.mask, 0},   {c->pad, &t->ids.pad, 0}, {c->unk, &t->ids.unk, 0},
    };
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
        int32_t id = sp_id(t, sp[i].name);
        if (id < 0 && sp[i].required) {
            glm_fail(err, "%s: ChatGLM special token %s is missing from the model", what, sp[i].name);
            return glm_hint(err, "the file may be truncated, or it is not ChatGLM-6B's ice_text.model");
        }
        *sp[i].dst = id < 0 ? -1 : id + t->offset;
    }
    t->eos = t->ids.eop;
    return 0;
}

/* ChatGLM2 (2) or ChatGLM3 (3). Both share tokenizer.model and hold the same tokenizer_config.json
 * keys (name_or_path, remove_space, do_lower_case, tokenizer_class, auto_map; later ChatGLM3
 * revisions add a chat_template); what differs is THUDM's tokenization_chatglm.py: ChatGLM2 appends
 * 5 specials (vocab 64794), ChatGLM3 9, its role tokens included (64798). So that file decides when
 * the folder has it (ChatGLM3's lists "<|observation|>"); else name_or_path ("THUDM/chatglm2-6b",
 * "THUDM/chatglm3-6b"; CodeGeeX2 uses ChatGLM2's) or a ChatGLM3 chat_template; with neither,
 * ChatGLM3, whose ids include all of ChatGLM2's. */
static int chatglm_version(const char *folder, const glm_config *c) {
    if (folder) {
        char py[4096];
        glm_path_join(py, sizeof py, folder, "tokenization_chatglm.py");
        size_t len;
        glm_err ignore;
        char *src = glm_is_file(py) ? glm_read_file(py, &len, &ignore) : NULL;
        if (src) {
            int v3 = strstr(src, "<|observation|>") != NULL;
            free(src);
            return v3 ? 3 : 2;
        }
    }
    return c->version ? c->version : 3;
}

static void setup_chatglm2(glm_tokenizer *t, const glm_config *c, int version) {
    static const char *names[GLM_TOK_MAX_EXTRA] = {"[MASK]", "[gMASK]", "[sMASK]", "sop", "eop",
                                                   "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"};
    t->kind = GLM_TOK_CHATGLM2;
    t->n_extra = version == 2 ? 5 : GLM_TOK_MAX_EXTRA; /* ChatGLM2 has no role tokens */
    for (int i = 0; i < t->n_extra; i++) strcpy(t->extra[i], names[i]);
    t->encode_special = version == 3 && c->encode_special;
    int32_t n = t->sp.p.n;
    t->ids = (glm_special_ids){n + 0, n + 1, n + 3, n + 4, t->sp.unk_id, t->sp.unk_id};
    const spm_proto *p = &t->sp.p; /* SPTokenizer's eos_id(): trainer_spec's */
    int32_t eos = p->eos_id >= 0 && p->eos_id < p->n ? p->eos_id : sp_id(t, "</s>");
    t->eos = eos >= 0 ? eos : 2;
}

int glm_tokenizer_load(glm_tokenizer **out, const char *path, glm_err *err) {
    *out = NULL;
    char model[4096], cfg[4096];
    cfg[0] = 0;
    char dir[4096];
    const char *folder = NULL; /* where tokenization_chatglm.py may be */
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (glm_is_dir(path)) {
        glm_path_join(model, sizeof model, path, "ice_text.model");
        if (!glm_is_file(model)) glm_path_join(model, sizeof model, path, "tokenizer.model");
        if (!glm_is_file(model)) glm_path_join(model, sizeof model, path, "tokenizer.json"); /* GLM-4 -hf */
        if (!glm_is_file(model)) {
            glm_fail(err, "tokenizer folder %s has neither ice_text.model nor tokenizer.model (nor GLM-4's tokenizer.json)", path);
            return glm_hint(err, "pass the model folder (with ice_text.model) or the .model file itself");
        }
        glm_path_join(cfg, sizeof cfg, path, "tokenizer_config.json");
        base = strrchr(model, '/') + 1;
        folder = path;
    } else if (glm_is_file(path)) {
        snprintf(model, sizeof model, "%s", path);
        /* Only the official file names pick up the config next to them. */
        if (strcmp(base, "ice_text.model") == 0 || strcmp(base, "tokenizer.model") == 0 || strcmp(base, "tokenizer.json") == 0) {
            snprintf(cfg, sizeof cfg, "%.*s", (int)(base - path), path);
            size_t l = strlen(cfg);
            snprintf(cfg + l, sizeof cfg - l, "tokenizer_config.json");
            snprintf(dir, sizeof dir, "%.*s", base > path ? (int)(base - path) : 1, base > path ? path : ".");
            folder = dir;
        }
    } else {
        return glm_fail(err, "tokenizer %s does not exist", path);
    }
    glm_config c;
    memset(&c, 0, sizeof c);
    strcpy(c.bos, "<sop>"); strcpy(c.eos, "<eop>"); strcpy(c.mask, "[MASK]");
    strcpy(c.gmask, "[gMASK]"); strcpy(c.pad, "<pad>"); strcpy(c.unk, "<unk>");
    c.num_image_tokens = -1;
    int have_cfg = cfg[0] && glm_is_file(cfg);
    if (have_cfg && read_config(cfg, &c, err)) return -1;
    if (c.do_lower_case) return glm_fail(err, "%s: do_lower_case=true is not supported", cfg);
    size_t len;
    char *buf = glm_read_file(model, &len, err);
    if (!buf) return -1;
    glm_tokenizer *t = glm_calloc(1, sizeof *t);
    size_t ml = strlen(model);
    if (ml >= 5 && strcmp(model + ml - 5, ".json") == 0) { /* transformers' tokenizer.json: GLM-4's alone */
        int rc = glm4_setup_json(t, buf, len, model, err);
        free(buf);
        if (rc) { glm_tokenizer_free(t); return -1; }
        *out = t;
        return 0;
    }
    if (bpe_looks_like_ranks(buf, len)) { /* by content: a SentencePiece protobuf starts with 0x0a */
        int rc = glm4_setup(t, buf, len, model, err);
        free(buf);
        if (rc) { glm_tokenizer_free(t); return -1; }
        *out = t;
        return 0;
    }
    if (spm_model_load(&t->sp, (uint8_t *)buf, len, model, err)) { free(t); return -1; }
    t->ids = (glm_special_ids){-1, -1, -1, -1, -1, t->sp.unk_id};
    t->eos = -1;
    int rc = 0;
    if (strcmp(base, "ice_text.model") == 0 || (sp_id(t, "[gMASK]") >= 0 && sp_id(t, "<sop>") >= 0))
        rc = setup_chatglm1(t, &c, have_cfg, model, err);
    else if (c.is_chatglm) /* a tokenizer.model alone may be any SentencePiece model (LLaMA...) */
        setup_chatglm2(t, &c, chatglm_version(folder, &c));
    else { /* plain SentencePiece: pad and eos from trainer_spec when they name control pieces */
        t->kind = GLM_TOK_SPM;
        const spm_proto *p = &t->sp.p;
        if (p->pad_id >= 0 && p->pad_id < p->n && p->type[p->pad_id] == SPM_CONTROL) t->ids.pad = p->pad_id;
        if (p->eos_id >= 0 && p->eos_id < p->n && p->type[p->eos_id] == SPM_CONTROL) t->eos = p->eos_id;
    }
    if (rc) { glm_tokenizer_free(t); return -1; }
    *out = t;
    return 0;
}

void glm_tokenizer_free(glm_tokenizer *t) {
    if (!t) return;
    if (t->bpe) { bpe_free(t->bpe); free(t->bpe); }
    spm_model_free(&t->sp);
    free(t);
}

glm_tok_kind glm_tokenizer_kind(const glm_tokenizer *t) { return t->kind; }
int32_t glm_tokenizer_eos(const glm_tokenizer *t) { return t->eos; }
int glm_tokenizer_vocab_size(const glm_tokenizer *t) {
    return t->bpe ? t->bpe->n + t->bpe->n_special : t->offset + t->sp.p.n + t->n_extra;
}
int glm_tokenizer_spm_size(const glm_tokenizer *t) { return t->bpe ? t->bpe->n : t->sp.p.n; }
glm_special_ids glm_tokenizer_specials(const glm_tokenizer *t) { return t->ids; }

const char *glm_tokenizer_piece(const glm_tokenizer *t, int32_t id) {
    if (t->bpe) return glm4_piece(t, id);
    id -= t->offset; /* image-token ids (pre-slim) have no piece */
    if (id < 0) return NULL;
    if (id < t->sp.p.n) return t->sp.p.piece[id];
    if (id - t->sp.p.n < t->n_extra) return t->extra[id - t->sp.p.n];
    return NULL;
}

char *glm_tokenizer_token_bytes(const glm_tokenizer *t, int32_t id, size_t *len) {
    spm_buf o = {0};
    size_t n = 0;
    const char *p = t->bpe ? bpe_token(t->bpe, id, &n) : glm_tokenizer_piece(t, id);
    if (p && !t->bpe) n = strlen(p);
    int32_t sid = id - t->offset;
    if (!p) {
        /* out of range: no bytes */
    } else if (t->bpe || sid < 0 || sid >= t->sp.p.n) { /* a rank's bytes, or an appended special's name */
        spm_buf_put(&o, p, n);
    } else if (t->sp.p.type[sid] == SPM_BYTE) { /* <0xNN> */
        unsigned v;
        if (sscanf(p, "<0x%2X>", &v) == 1) { char c = (char)v; spm_buf_put(&o, &c, 1); }
    } else if (t->sp.p.type[sid] == SPM_CONTROL) { /* [gMASK], <sop>, </s>: by name */
        spm_buf_put(&o, p, n);
    } else { /* U+2581 is a space; ChatGLM-6B's <n>, <|tab|>, <|blank_N|> */
        spm_buf w = {0};
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && !memcmp(p + i, "\xe2\x96\x81", 3)) { spm_buf_put(&w, " ", 1); i += 3; }
            else spm_buf_put(&w, p + i++, 1);
        }
        if (t->kind == GLM_TOK_CHATGLM1) {
            glm_tok_postprocess(w.s ? w.s : "", w.n, &o);
            free(w.s);
        } else {
            o = w;
        }
    }
    if (len) *len = o.n;
    spm_buf_put(&o, "", 1);
    return o.s;
}

int32_t glm_tokenizer_piece_id(const glm_tokenizer *t, const char *piece) {
    if (t->bpe) return glm4_piece_id(t, piece);
    for (int i = 0; i < t->n_extra; i++)
        if (strcmp(piece, t->extra[i]) == 0) return t->sp.p.n + i;
    int32_t id = sp_id(t, piece);
    return id < 0 ? -1 : id + t->offset;
}

void glm_tokenizer_build_inputs(const glm_tokenizer *t, const int32_t *a, int na, const int32_t *b, int nb,
                                glm_ids *out) {
    if (t->kind == GLM_TOK_CHATGLM2 || t->kind == GLM_TOK_GLM4) {
        glm_ids_push(out, t->ids.gmask);
        glm_ids_push(out, t->ids.sop);
    }
    glm_ids_append(out, a, na);
    if (t->kind == GLM_TOK_CHATGLM1) {
        glm_ids_push(out, t->ids.gmask);
        glm_ids_push(out, t->ids.sop);
    }
    if (b) {
        glm_ids_append(out, b, nb);
        if (t->kind != GLM_TOK_SPM) glm_ids_push(out, t->eos);
    }
}

/* Runs the SentencePiece encode on the (ChatGLM-preprocessed) text; tokens in sc->tok. */
static int encode_tokens(const glm_tokenizer *t, const char *text, size_t len, int flags, spm_scratch *sc,
                         glm_err *err) {
    if (len > SPM_MAX_TEXT)
        return glm_fail(err, "text of %zu bytes is too long to tokenize (limit %zu bytes)", len, SPM_MAX_TEXT);
    if (t->kind == GLM_TOK_CHATGLM1 && !(flags & GLM_TOK_SPM_ONLY)) {
        glm_tok_preprocess(text, len, t->remove_space, &sc->pre);
        return spm_encode(&t->sp, sc->pre.s, sc->pre.n, sc, err);
    }
    return spm_encode(&t->sp, text, len, sc, err);
}

/* A kind that cannot map special-token text to ids refuses GLM_TOK_ENCODE_SPECIAL rather than
 * silently encoding the text as text. */
static int refuse_encode_special(int flags, glm_err *err) {
    if (!(flags & GLM_TOK_ENCODE_SPECIAL)) return 0;
    glm_fail(err, "GLM_TOK_ENCODE_SPECIAL (special-token text as special ids) is not supported by this kind of tokenizer");
    return glm_hint(err, "add special tokens as ids (glm_tokenizer_piece_id, glm_tokenizer_build_inputs)");
}

int glm_tok_encode_sc(const glm_tokenizer *t, const char *text, size_t len, int flags, spm_scratch *sc,
                      glm_ids *out, glm_err *err) {
    if (t->bpe) return glm4_encode_sc(t, text, len, flags, sc, out, err);
    if (t->kind == GLM_TOK_CHATGLM2) return glm2_encode_sc(t, text, len, flags, sc, out, err);
    if (refuse_encode_special(flags, err)) return -1;
    if (encode_tokens(t, text, len, flags, sc, err)) return -1;
    int32_t off = (flags & GLM_TOK_SPM_ONLY) ? 0 : t->offset;
    int prefix = (flags & GLM_TOK_ADD_SPECIAL) && t->kind == GLM_TOK_CHATGLM2;
    int suffix = (flags & GLM_TOK_ADD_SPECIAL) && t->kind == GLM_TOK_CHATGLM1;
    if (prefix) { glm_ids_push(out, t->ids.gmask); glm_ids_push(out, t->ids.sop); }
    if (out->n + sc->ntok + 2 > out->cap) {
        out->cap = out->n + sc->ntok + 2;
        out->data = glm_realloc(out->data, (size_t)out->cap * sizeof *out->data);
    }
    for (int i = 0; i < sc->ntok; i++) out->data[out->n++] = sc->tok[i].id + off;
    if (suffix) { glm_ids_push(out, t->ids.gmask); glm_ids_push(out, t->ids.sop); }
    return 0;
}

int glm_tokenizer_encode_ex(const glm_tokenizer *t, const char *text, size_t len, int flags, glm_ids *out,
                            glm_err *err) {
    spm_scratch sc = {0};
    int rc = glm_tok_encode_sc(t, text, len, flags, &sc, out, err);
    spm_scratch_free(&sc);
    return rc;
}

int glm_tokenizer_encode(const glm_tokenizer *t, const char *text, size_t len, glm_ids *out, glm_err *err) {
    return glm_tokenizer_encode_ex(t, text, len, 0, out, err);
}

void glm_pieces_add(glm_pieces *o, spm_buf *b, int *cap, const char *s, size_t n) {
    if (o->n == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        o->off = glm_realloc(o->off, (size_t)*cap * sizeof *o->off);
        o->len = glm_realloc(o->len, (size_t)*cap * sizeof *o->len);
    }
    o->off[o->n] = b->n;
    o->len[o->n++] = n;
    spm_buf_put(b, s, n);
    spm_buf_put(b, "", 1);
}

int glm_tokenizer_encode_pieces(const glm_tokenizer *t, const char *text, size_t len, int flags, glm_pieces *out,
                                glm_err *err) {
    if (t->bpe) return glm4_encode_pieces(t, text, len, flags, out, err);
    if (t->kind == GLM_TOK_CHATGLM2) return glm2_encode_pieces(t, text, len, flags, out, err);
    spm_scratch sc = {0};
    memset(out, 0, sizeof *out);
    if (refuse_encode_special(flags, err)) return -1;
    if (encode_tokens(t, text, len, flags, &sc, err)) { spm_scratch_free(&sc); return -1; }
    spm_buf b = {0};
    int cap = 0;
    const char *sp[2] = {NULL, NULL};
    if (flags & GLM_TOK_ADD_SPECIAL && t->kind != GLM_TOK_SPM) {
        sp[0] = glm_tokenizer_piece(t, t->ids.gmask);
        sp[1] = glm_tokenizer_piece(t, t->ids.sop);
    }
    if (t->kind == GLM_TOK_CHATGLM2)
        for (int k = 0; k < 2; k++) if (sp[k]) glm_pieces_add(out, &b, &cap, sp[k], strlen(sp[k]));
    const spm_proto *p = &t->sp.p;
    for (int i = 0; i < sc.ntok; i++) {
        const spm_tok *k = &sc.tok[i];
        if (p->type[k->id] == SPM_UNKNOWN) glm_pieces_add(out, &b, &cap, sc.norm.s + k->off, k->len); /* its surface */
        else glm_pieces_add(out, &b, &cap, p->piece[k->id], (size_t)p->piece_len[k->id]);
    }
    if (t->kind == GLM_TOK_CHATGLM1)
        for (int k = 0; k < 2; k++) if (sp[k]) glm_pieces_add(out, &b, &cap, sp[k], strlen(sp[k]));
    spm_scratch_free(&sc);
    if (!b.s) spm_buf_put(&b, "", 1);
    out->data = b.s;
    return 0;
}

void glm_pieces_free(glm_pieces *p) {
    free(p->data);
    free(p->off);
    free(p->len);
    memset(p, 0, sizeof *p);
}

char *glm_tokenizer_decode_ex(const glm_tokenizer *t, const int32_t *ids, int n, int flags, size_t *len) {
    if (t->bpe) return glm4_decode(t, ids, n, flags, len);
    if (t->kind == GLM_TOK_CHATGLM2 && !(flags & GLM_TOK_SPM_ONLY)) return glm2_decode(t, ids, n, len);
    spm_buf o = {0};
    if (flags & GLM_TOK_SPM_ONLY || t->kind == GLM_TOK_SPM) {
        spm_decode(&t->sp, ids, n, &o);
    } else {
        /* Drop pad (and ChatGLM2's appended specials), undo the image-token offset. */
        int32_t *keep = glm_malloc((size_t)(n > 0 ? n : 1) * sizeof *keep);
        int nk = 0;
        for (int i = 0; i < n; i++) {
            int32_t id = ids[i];
            if (id == t->ids.pad) continue;
            id -= t->offset;
            if (id < 0 || id >= t->sp.p.n) continue;
            keep[nk++] = id;
        }
        spm_buf raw = {0};
        spm_decode(&t->sp, keep, nk, &raw);
        free(keep);
        if (t->kind == GLM_TOK_CHATGLM1) {
            glm_tok_postprocess(raw.s ? raw.s : "", raw.n, &o);
            free(raw.s);
        } else {
            o = raw;
        }
    }
    if (len) *len = o.n;
    spm_buf_put(&o, "", 1);
    return o.s;
}

char *glm_tokenizer_decode(const glm_tokenizer *t, const int32_t *ids, int n) {
    return glm_tokenizer_decode_ex(t, ids, n, 0, NULL);
}

int glm_tokenizer_stop_ids(const glm_tokenizer *t, int32_t ids[4]) {
    if (t->bpe) return glm4_stop_ids(t, ids);
    int n = 0;
    if (t->eos >= 0) ids[n++] = t->eos;
    if (t->kind == GLM_TOK_CHATGLM2 && t->n_extra == GLM_TOK_MAX_EXTRA) { /* ChatGLM3's role tokens */
        ids[n++] = glm_tokenizer_piece_id(t, "<|user|>");
        ids[n++] = glm_tokenizer_piece_id(t, "<|observation|>");
    }
    return n;
}
