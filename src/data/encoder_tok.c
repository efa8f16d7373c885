/* glm_encoder over the real ChatGLM tokenizer. Kept apart from examples.c so the data layer's
 * tests link without the tokenizer. */
#include <stdio.h>
#include <string.h>
#include "core/fileutil.h"
#include "data/examples.h"
#include "data/hash.h"
#include "tokenizer/tokenizer.h"

static int tok_encode(void *ctx, const char *text, size_t len, glm_ids *out, glm_err *err) {
    return glm_tokenizer_encode((const glm_tokenizer *)ctx, text, len, out, err);
}

static int tok_encode_special(void *ctx, const char *text, size_t len, glm_ids *out, glm_err *err) {
    return glm_tokenizer_encode_ex((const glm_tokenizer *)ctx, text, len, GLM_TOK_ENCODE_SPECIAL, out, err);
}

static int tok_encode_sp(void *ctx, const char *text, size_t len, glm_ids *out, glm_err *err) {
    return glm_tokenizer_encode_ex((const glm_tokenizer *)ctx, text, len, GLM_TOK_SPM_ONLY, out, err);
}

glm_layout glm_layout_of(const glm_tokenizer *t) {
    if (glm_tokenizer_kind(t) == GLM_TOK_GLM4) return GLM_LAYOUT_GLM4;
    if (glm_tokenizer_kind(t) != GLM_TOK_CHATGLM2) return GLM_LAYOUT_GLM;
    return glm_tokenizer_roles(t).user >= 0 ? GLM_LAYOUT_GLM3 : GLM_LAYOUT_GLM2;
}

int glm_tokenizer_fingerprint(const char *path, uint64_t *out, glm_err *err) {
    uint64_t h = 0x676c6d746f6b656eULL; /* "glmtoken" */
    if (!glm_is_dir(path)) return glm_hash_file(path, h, out, err);
    static const char *const files[] = {"ice_text.model", "tokenizer.model", "tokenizer.json", "tokenizer_config.json"};
    int found = 0;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char p[4096];
        glm_path_join(p, sizeof p, path, files[i]);
        if (!glm_is_file(p)) continue;
        if (glm_hash_file(p, h, &h, err)) return -1;
        found++;
    }
    if (!found) return glm_fail(err, "no ice_text.model, tokenizer.model or tokenizer.json in %s", path);
    *out = h;
    return 0;
}

int glm_encoder_from_tokenizer(glm_encoder *e, const glm_tokenizer *t, const char *tokenizer_path, glm_err *err) {
    glm_special_ids s = glm_tokenizer_specials(t);
    *e = (glm_encoder){.encode = tok_encode, .ctx = (void *)t, .gmask = s.gmask, .sop = s.sop, .eop = s.eop,
                       .pad = s.pad, .mask = s.mask};
    if (s.gmask < 0 || s.sop < 0 || s.eop < 0 || s.pad < 0) {
        glm_fail(err, "tokenizer %s lacks a special token ([gMASK] %d, <sop> %d, <eop> %d, <pad> %d)",
                 tokenizer_path ? tokenizer_path : "", s.gmask, s.sop, s.eop, s.pad);
        return glm_hint(err, "a ChatGLM-6B tokenizer needs the control pieces [gMASK], <sop>, <eop> and <pad>");
    }
    e->layout = glm_layout_of(t);
    e->eos = glm_tokenizer_eos(t);
    e->text_eos = e->eos;
    glm_role_ids r = glm_tokenizer_roles(t);
    int32_t roles[4] = {r.system, r.user, r.assistant, r.observation};
    memcpy(e->role, roles, sizeof roles);
    e->encode_sp = e->layout == GLM_LAYOUT_GLM4 ? tok_encode : tok_encode_sp; /* GLM-4 has no SentencePiece layer */
    if (e->layout == GLM_LAYOUT_GLM4) e->encode_special = tok_encode_special;
    /* GLM-4's finetune.py closes a conversation with <|user|> (151336, "EOS for chat"), what chat
     * stops on, not <|endoftext|> */
    if (e->layout == GLM_LAYOUT_GLM4) e->eos = r.user;
    if (e->layout != GLM_LAYOUT_GLM && e->eos < 0)
        return glm_fail(err, "tokenizer %s: a %s tokenizer without </s>", tokenizer_path ? tokenizer_path : "", glm_layout_name(e->layout));
    if (tokenizer_path && glm_tokenizer_fingerprint(tokenizer_path, &e->fingerprint, err)) return -1;
    return 0;
}
