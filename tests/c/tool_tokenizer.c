/* `glmtrain tokenize` as a standalone binary (build/tests/tool_tokenizer) so the Python tests and
 * bench/bench_tokenizer.sh can drive the tokenizer even while the main CLI is being reworked.
 *
 * `tool_tokenizer --api PATH` instead answers one JSON request per stdin line through the library
 * calls themselves, for tests that need more than the CLI offers (any flags, batches, build_inputs,
 * piece lookups, specials, stop ids). Byte strings travel as hex so that text that is not UTF-8,
 * and decoded bytes, stay exact. Requests and answers (one line each):
 *   {"op":"info"}                               -> kind, vocab, spm_size, eos, specials, stop
 *   {"op":"encode","hex":H,"flags":F}           -> {"ids":[..]}   (errors: {"error":..,"hint":..})
 *   {"op":"batch","hex":[H..],"flags":F,"threads":T} -> {"ids":[[..]..]}
 *   {"op":"pieces","hex":H,"flags":F}           -> {"pieces":[H..]}
 *   {"op":"decode","ids":[..],"flags":F}        -> {"hex":H}
 *   {"op":"piece","ids":[..]}                   -> {"pieces":[H or null..]}
 *   {"op":"piece_id","hex":[H..]}               -> {"ids":[..]}
 *   {"op":"build","a":[..],"b":[..]}            -> {"ids":[..]}  ("b" optional) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "cli/cmd_tokenize.h"
#include "tokenizer/tokenizer.h"

static char *from_hex(const char *h, size_t *n) {
    size_t l = h ? strlen(h) / 2 : 0;
    char *s = malloc(l + 1);
    for (size_t i = 0; i < l; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        s[i] = (char)v;
    }
    s[l] = 0;
    *n = l;
    return s;
}

static cJSON *hex_item(const char *s, size_t n) {
    char *h = malloc(2 * n + 1);
    for (size_t i = 0; i < n; i++) sprintf(h + 2 * i, "%02x", (unsigned char)s[i]);
    h[2 * n] = 0;
    cJSON *j = cJSON_CreateString(h);
    free(h);
    return j;
}

static cJSON *ids_item(const int32_t *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static glm_ids ids_of(const cJSON *a) {
    glm_ids v = {0};
    const cJSON *x;
    cJSON_ArrayForEach(x, a) glm_ids_push(&v, (int32_t)x->valuedouble);
    return v;
}

static void add_error(cJSON *r, const glm_err *e) {
    cJSON_AddStringToObject(r, "error", e->msg);
    cJSON_AddStringToObject(r, "hint", e->hint);
}

static int num(const cJSON *q, const char *key) {
    const cJSON *v = cJSON_GetObjectItem(q, key);
    return cJSON_IsNumber(v) ? v->valueint : 0;
}

static cJSON *answer(const glm_tokenizer *t, const cJSON *q) {
    cJSON *r = cJSON_CreateObject();
    const char *op = cJSON_GetStringValue(cJSON_GetObjectItem(q, "op"));
    const cJSON *hex = cJSON_GetObjectItem(q, "hex");
    int flags = num(q, "flags");
    glm_err e = {{0}, {0}};
    if (!op) op = "";
    if (!strcmp(op, "info")) {
        glm_special_ids s = glm_tokenizer_specials(t);
        int32_t stop[4];
        int ns = glm_tokenizer_stop_ids(t, stop);
        cJSON_AddNumberToObject(r, "kind", glm_tokenizer_kind(t));
        cJSON_AddNumberToObject(r, "vocab", glm_tokenizer_vocab_size(t));
        cJSON_AddNumberToObject(r, "spm_size", glm_tokenizer_spm_size(t));
        cJSON_AddNumberToObject(r, "eos", glm_tokenizer_eos(t));
        const int32_t sv[] = {s.mask, s.gmask, s.sop, s.eop, s.pad, s.unk};
        const char *sn[] = {"mask", "gmask", "sop", "eop", "pad", "unk"};
        for (int i = 0; i < 6; i++) cJSON_AddNumberToObject(r, sn[i], sv[i]);
        cJSON_AddItemToObject(r, "stop", ids_item(stop, ns));
    } else if (!strcmp(op, "encode") || !strcmp(op, "pieces")) {
        size_t n;
        char *s = from_hex(cJSON_GetStringValue(hex), &n);
        if (!strcmp(op, "encode")) {
            glm_ids v = {0};
            if (glm_tokenizer_encode_ex(t, s, n, flags, &v, &e)) add_error(r, &e);
            else cJSON_AddItemToObject(r, "ids", ids_item(v.data, v.n));
            glm_ids_free(&v);
        } else {
            glm_pieces p;
            if (glm_tokenizer_encode_pieces(t, s, n, flags, &p, &e)) add_error(r, &e);
            else {
                cJSON *a = cJSON_AddArrayToObject(r, "pieces");
                for (int i = 0; i < p.n; i++) cJSON_AddItemToArray(a, hex_item(p.data + p.off[i], p.len[i]));
                glm_pieces_free(&p);
            }
        }
        free(s);
    } else if (!strcmp(op, "batch")) {
        int n = cJSON_GetArraySize(hex);
        char **texts = calloc((size_t)n + 1, sizeof *texts);
        size_t *lens = calloc((size_t)n + 1, sizeof *lens);
        glm_ids *outs = calloc((size_t)n + 1, sizeof *outs);
        for (int i = 0; i < n; i++) texts[i] = from_hex(cJSON_GetStringValue(cJSON_GetArrayItem(hex, i)), &lens[i]);
        if (glm_tokenizer_encode_batch_ex(t, (const char **)texts, lens, n, flags, outs, num(q, "threads"), &e))
            add_error(r, &e);
        else {
            cJSON *a = cJSON_AddArrayToObject(r, "ids");
            for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, ids_item(outs[i].data, outs[i].n));
        }
        for (int i = 0; i < n; i++) { free(texts[i]); glm_ids_free(&outs[i]); }
        free(texts); free(lens); free(outs);
    } else if (!strcmp(op, "decode")) {
        glm_ids v = ids_of(cJSON_GetObjectItem(q, "ids"));
        size_t n;
        char *s = glm_tokenizer_decode_ex(t, v.data, v.n, flags, &n);
        cJSON_AddItemToObject(r, "hex", hex_item(s, n));
        free(s);
        glm_ids_free(&v);
    } else if (!strcmp(op, "piece")) {
        glm_ids v = ids_of(cJSON_GetObjectItem(q, "ids"));
        cJSON *a = cJSON_AddArrayToObject(r, "pieces");
        for (int i = 0; i < v.n; i++) {
            const char *p = glm_tokenizer_piece(t, v.data[i]);
            cJSON_AddItemToArray(a, p ? hex_item(p, strlen(p)) : cJSON_CreateNull());
        }
        glm_ids_free(&v);
    } else if (!strcmp(op, "piece_id")) {
        cJSON *a = cJSON_AddArrayToObject(r, "ids");
        const cJSON *x;
        cJSON_ArrayForEach(x, hex) {
            size_t n;
            char *s = from_hex(cJSON_GetStringValue(x), &n);
            cJSON_AddItemToArray(a, cJSON_CreateNumber(glm_tokenizer_piece_id(t, s)));
            free(s);
        }
    } else if (!strcmp(op, "build")) {
        glm_ids a = ids_of(cJSON_GetObjectItem(q, "a")), out = {0};
        const cJSON *bj = cJSON_GetObjectItem(q, "b");
        glm_ids b = ids_of(bj);
        glm_tokenizer_build_inputs(t, a.data, a.n, bj ? b.data : NULL, b.n, &out);
        cJSON_AddItemToObject(r, "ids", ids_item(out.data, out.n));
        glm_ids_free(&a); glm_ids_free(&b); glm_ids_free(&out);
    } else {
        cJSON_AddStringToObject(r, "error", "unknown op");
    }
    return r;
}

static int run_api(const char *path) {
    glm_tokenizer *t = NULL;
    glm_err err = {{0}, {0}};
    if (glm_tokenizer_load(&t, path, &err)) { glm_err_print(&err); return 1; }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        cJSON *q = cJSON_ParseWithLength(line, (size_t)n);
        cJSON *r = q ? answer(t, q) : cJSON_CreateString("bad request");
        char *s = cJSON_PrintUnformatted(r);
        printf("%s\n", s);
        fflush(stdout);
        free(s);
        cJSON_Delete(r);
        cJSON_Delete(q);
    }
    free(line);
    glm_tokenizer_free(t);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--api")) return run_api(argv[2]);
    return glm_cmd_tokenize(argc - 1, argv + 1);
}
