/* `glmtrain tokenize --tokenizer PATH [--text T | --file F] [--pieces] [--decode "1 2 3"] [--json]
 * [--no_special_tokens] [--spm] [--decode_lines] [--threads N]`.
 * Input is --text (one input), --file F, or stdin, split at '\n' (a final newline does not start
 * an empty line; '\r' is kept, as spm_encode keeps it). Output: space-separated ids (default),
 * pieces (--pieces) or text (--decode / --decode_lines), one line per input; --json writes one JSON
 * object per line instead ({"ids":[..]}, {"pieces":[..]}, {"text":".."}), which is the safe form
 * when decoded text contains newlines. By default ids get ChatGLM's [gMASK] <sop> like the HF
 * tokenizer; --spm runs SentencePiece alone (no ChatGLM layer, no special tokens), the level
 * spm_encode works at. Lines are encoded in chunks with --threads threads (default all cores). */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cmd_tokenize.h"
#include "core/hub.h"
#include "core/args.h"
#include "core/fileutil.h"
#include "tokenizer/tokenizer.h"
#include <cjson/cJSON.h>

typedef struct tok_args {
    char *tokenizer, *text, *file, *decode;
    int pieces, json, json_input, no_special_tokens, spm, decode_lines, threads;
} tok_args;

#define F(name, type, def, help) {#name, type, offsetof(tok_args, name), def, help, NULL, NULL}
static const glm_flag tok_flags[] = {
    F(tokenizer, ARG_STR, NULL, "model folder (ice_text.model / tokenizer.model [+ tokenizer_config.json]) or a .model file"),
    F(text, ARG_STR, NULL, "text to encode (one input, newlines included)"),
    F(file, ARG_STR, NULL, "file to encode line by line (default: stdin)"),
    F(pieces, ARG_BOOL, "false", "print pieces instead of ids (with --decode: the piece of each id)"),
    F(decode, ARG_STR, NULL, "ids to decode, e.g. \"5 74874 130001 130004\""),
    F(decode_lines, ARG_BOOL, "false", "each input line is a list of ids to decode"),
    F(json, ARG_BOOL, "false", "one JSON object per line"),
    F(json_input, ARG_BOOL, "false", "each input line is a JSON string (so texts can hold newlines)"),
    F(no_special_tokens, ARG_BOOL, "false", "do not add [gMASK] <sop> (add_special_tokens=False)"),
    F(spm, ARG_BOOL, "false", "SentencePiece level only: no ChatGLM pre/post-processing, no special tokens"),
    F(threads, ARG_INT, "0", "encoding threads (0: all cores)"),
};
#undef F

/* ---- output ---- */
typedef struct obuf { char *s; size_t n, cap; FILE *f; } obuf;
static void ob_flush(obuf *o) { if (o->n) fwrite(o->s, 1, o->n, o->f); o->n = 0; }
static void ob_put(obuf *o, const char *s, size_t n) {
    if (o->n + n > o->cap) {
        ob_flush(o);
        if (n > o->cap) { fwrite(s, 1, n, o->f); return; }
    }
    memcpy(o->s + o->n, s, n);
    o->n += n;
}
static void ob_c(obuf *o, char c) { ob_put(o, &c, 1); }
static void ob_int(obuf *o, int32_t v) {
    char b[16];
    int i = 16;
    uint32_t u = v < 0 ? (uint32_t)(-(int64_t)v) : (uint32_t)v;
    do { b[--i] = (char)('0' + u % 10); u /= 10; } while (u);
    if (v < 0) b[--i] = '-';
    ob_put(o, b + i, (size_t)(16 - i));
}
/* JSON string: control characters escaped; bytes that are not valid UTF-8 become U+FFFD so the
 * line always parses. */
static void ob_json_str(obuf *o, const char *s, size_t n) {
    ob_c(o, '"');
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { ob_c(o, '\\'); ob_c(o, (char)c); i++; continue; }
        if (c < 0x20 || c == 0x7f) {
            char e[8];
            if (c == '\n') strcpy(e, "\\n"); else if (c == '\t') strcpy(e, "\\t"); else if (c == '\r') strcpy(e, "\\r");
            else snprintf(e, sizeof e, "\\u%04x", c);
            ob_put(o, e, strlen(e));
            i++;
            continue;
        }
        if (c < 0x80) { ob_c(o, (char)c); i++; continue; }
        int l = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        int ok = l > 0 && i + (size_t)l <= n;
        for (int k = 1; ok && k < l; k++) ok = ((unsigned char)s[i + (size_t)k] & 0xC0) == 0x80;
        if (ok) { ob_put(o, s + i, (size_t)l); i += (size_t)l; }
        else { ob_put(o, "\xEF\xBF\xBD", 3); i++; }
    }
    ob_c(o, '"');
}

/* ---- modes ---- */

static int parse_ids(const char *s, size_t n, glm_ids *ids, glm_err *err) {
    size_t i = 0;
    while (i < n) {
        while (i < n && (s[i] == ' ' || s[i] == ',' || s[i] == '\t' || s[i] == '[' || s[i] == ']' || s[i] == '\r')) i++;
        if (i >= n) break;
        char *end;
        char tmp[24];
        size_t k = 0;
        while (i + k < n && k < sizeof tmp - 1 && s[i + k] != ' ' && s[i + k] != ',' && s[i + k] != ']' && s[i + k] != '\t') {
            tmp[k] = s[i + k];
            k++;
        }
        tmp[k] = 0;
        errno = 0;
        long v = strtol(tmp, &end, 10);
        if (*end || k == 0 || errno || v < -2147483647L || v > 2147483647L)
            return glm_fail(err, "--decode: \"%s\" is not an id", tmp);
        glm_ids_push(ids, (int32_t)v);
        i += k;
    }
    return 0;
}

/* An id the vocabulary does not have is an error: decoding would drop it without a trace. */
static int check_id_range(const glm_tokenizer *t, const tok_args *a, const glm_ids *ids, glm_err *err) {
    int v = a->spm ? glm_tokenizer_spm_size(t) : glm_tokenizer_vocab_size(t);
    for (int i = 0; i < ids->n; i++)
        if (ids->data[i] < 0 || ids->data[i] >= v) {
            glm_fail(err, "--decode: id %d is out of range: the %svocabulary has %d ids (0 to %d)", (int)ids->data[i],
                     a->spm ? "SentencePiece (--spm) " : "", v, v - 1);
            return glm_hint(err, "the ids must come from this tokenizer (--tokenizer)");
        }
    return 0;
}

static int emit_decode(const glm_tokenizer *t, const tok_args *a, const char *s, size_t n, obuf *o, glm_err *err) {
    glm_ids ids = {0};
    if (parse_ids(s, n, &ids, err) || check_id_range(t, a, &ids, err)) { glm_ids_free(&ids); return -1; }
    if (a->pieces) { /* the piece of each id (ids below ChatGLM's offset, image tokens: an empty piece) */
        if (a->json) ob_put(o, "{\"pieces\":[", 11);
        for (int i = 0; i < ids.n; i++) {
            const char *p = glm_tokenizer_piece(t, ids.data[i]);
            if (i) ob_c(o, a->json ? ',' : ' ');
            if (a->json) ob_json_str(o, p ? p : "", p ? strlen(p) : 0);
            else if (p) ob_put(o, p, strlen(p));
        }
        if (a->json) ob_put(o, "]}", 2);
        ob_c(o, '\n');
        glm_ids_free(&ids);
        return 0;
    }
    size_t len;
    char *txt = glm_tokenizer_decode_ex(t, ids.data, ids.n, a->spm ? GLM_TOK_SPM_ONLY : 0, &len);
    if (a->json) { ob_put(o, "{\"text\":", 8); ob_json_str(o, txt, len); ob_c(o, '}'); }
    else ob_put(o, txt, len);
    ob_c(o, '\n');
    free(txt);
    glm_ids_free(&ids);
    return 0;
}

static void emit_ids(const tok_args *a, const glm_ids *ids, obuf *o) {
    if (a->json) ob_put(o, "{\"ids\":[", 8);
    for (int i = 0; i < ids->n; i++) {
        if (i) ob_c(o, a->json ? ',' : ' ');
        ob_int(o, ids->data[i]);
    }
    if (a->json) ob_put(o, "]}", 2);
    ob_c(o, '\n');
}

static int emit_pieces(const glm_tokenizer *t, const tok_args *a, int flags, const char *s, size_t n, obuf *o,
                       glm_err *err) {
    glm_pieces ps;
    if (glm_tokenizer_encode_pieces(t, s, n, flags, &ps, err)) return -1;
    if (a->json) ob_put(o, "{\"pieces\":[", 11);
    for (int i = 0; i < ps.n; i++) {
        if (i) ob_c(o, a->json ? ',' : ' ');
        if (a->json) ob_json_str(o, ps.data + ps.off[i], ps.len[i]);
        else ob_put(o, ps.data + ps.off[i], ps.len[i]);
    }
    if (a->json) ob_put(o, "]}", 2);
    ob_c(o, '\n');
    glm_pieces_free(&ps);
    return 0;
}

/* Encodes lines [0, n) in chunks so memory stays bounded on big files. */
static int run_lines(const glm_tokenizer *t, const tok_args *a, int flags, const char **lines, const size_t *lens,
                     int n, obuf *o, glm_err *err) {
    const int chunk = 16384;
    glm_ids *outs = glm_calloc((size_t)chunk, sizeof *outs);
    int rc = 0;
    for (int s = 0; s < n && !rc; s += chunk) {
        int m = n - s < chunk ? n - s : chunk;
        if (a->decode_lines) {
            for (int i = 0; i < m && !rc; i++) rc = emit_decode(t, a, lines[s + i], lens[s + i], o, err);
        } else if (a->pieces) {
            for (int i = 0; i < m && !rc; i++) rc = emit_pieces(t, a, flags, lines[s + i], lens[s + i], o, err);
        } else {
            rc = glm_tokenizer_encode_batch_ex(t, lines + s, lens + s, m, flags, outs, a->threads, err);
            if (rc) glm_wrap(err, "line %d: ", s + 1);
            for (int i = 0; i < m; i++) {
                if (!rc) emit_ids(a, &outs[i], o);
                glm_ids_free(&outs[i]);
                outs[i] = (glm_ids){0};
            }
        }
    }
    free(outs);
    return rc;
}

static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *b = glm_malloc(cap);
    size_t r;
    while ((r = fread(b + n, 1, cap - n, stdin)) > 0) {
        n += r;
        if (n == cap) { cap *= 2; b = glm_realloc(b, cap); }
    }
    *len = n;
    return b;
}

int glm_cmd_tokenize(int argc, char **argv) {
    tok_args a;
    int nf = sizeof tok_flags / sizeof tok_flags[0];
    glm_err err = {0};
    glm_args_defaults(tok_flags, nf, &a);
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { glm_args_usage(tok_flags, nf, "tokenize"); return 0; }
    int rc = glm_args_parse(tok_flags, nf, &a, argc, argv, &err);
    if (!rc) rc = glm_hub_resolve(&a.tokenizer, "tokenizer", NULL, &err);
    if (!rc && !a.tokenizer) rc = glm_fail(&err, "--tokenizer is required"), glm_hint(&err, "e.g. --tokenizer ../shared/tokenizers/chatglm-6b");
    if (!rc && a.text && a.file) rc = glm_fail(&err, "give --text or --file, not both");
    glm_tokenizer *t = NULL;
    if (!rc) rc = glm_tokenizer_load(&t, a.tokenizer, &err);
    obuf o = {glm_malloc(1 << 20), 0, 1 << 20, stdout};
    int flags = a.spm ? GLM_TOK_SPM_ONLY : (a.no_special_tokens ? 0 : GLM_TOK_ADD_SPECIAL);
    char *data = NULL;
    if (!rc && a.decode) {
        rc = emit_decode(t, &a, a.decode, strlen(a.decode), &o, &err);
    } else if (!rc && a.text) {
        const char *line = a.text;
        size_t len = strlen(a.text);
        rc = run_lines(t, &a, flags, &line, &len, 1, &o, &err);
    } else if (!rc) {
        size_t len;
        data = a.file && strcmp(a.file, "-") ? glm_read_file(a.file, &len, &err) : read_stdin(&len);
        if (!data) rc = -1;
        int n = 0, cap = 1024;
        const char **lines = glm_malloc((size_t)cap * sizeof *lines);
        size_t *lens = glm_malloc((size_t)cap * sizeof *lens);
        for (size_t i = 0; !rc && i < len;) {
            const char *nl = memchr(data + i, '\n', len - i);
            size_t e = nl ? (size_t)(nl - data) : len;
            if (n == cap) {
                cap *= 2;
                lines = glm_realloc(lines, (size_t)cap * sizeof *lines);
                lens = glm_realloc(lens, (size_t)cap * sizeof *lens);
            }
            lines[n] = data + i;
            lens[n++] = e - i;
            i = e + 1;
        }
        char **owned = NULL;
        if (!rc && a.json_input) { /* replace each line by the string it spells */
            owned = glm_calloc((size_t)n + 1, sizeof *owned);
            for (int i = 0; i < n && !rc; i++) {
                cJSON *j = cJSON_ParseWithLength(lines[i], lens[i]);
                if (!cJSON_IsString(j)) rc = glm_fail(&err, "--json_input: line %d is not a JSON string", i + 1);
                else {
                    owned[i] = glm_strdup(j->valuestring);
                    lines[i] = owned[i];
                    lens[i] = strlen(owned[i]);
                }
                cJSON_Delete(j);
            }
        }
        if (!rc) rc = run_lines(t, &a, flags, lines, lens, n, &o, &err);
        for (int i = 0; owned && i < n; i++) free(owned[i]);
        free(owned);
        free(lines);
        free(lens);
    }
    ob_flush(&o);
    fflush(stdout);
    free(o.s);
    free(data);
    glm_tokenizer_free(t);
    free(a.tokenizer); free(a.text); free(a.file); free(a.decode);
    if (rc) { glm_err_print(&err); return 1; }
    return 0;
}
