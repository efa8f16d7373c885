/* SentencePiece normalisation: longest-match rewriting through the precompiled charsmap (nmt_nfkc,
 * nfkc, *_cf, identity, or a user TSV compiled into the model), user-defined symbols passed through
 * untouched, malformed UTF-8 bytes replaced one by one with U+FFFD, and the whitespace rules:
 * leading/trailing/repeated spaces dropped (remove_extra_whitespaces), spaces escaped to U+2581
 * (escape_whitespaces) and a dummy U+2581 prefix (or suffix with treat_whitespace_as_suffix).
 * The order of these steps matters for exact equality with SentencePiece: spaces are judged on the
 * *normalised* form of each prefix (so U+3000 counts as a space under NFKC). */
#include "tokenizer/spm.h"
#include <string.h>

static const char kSpace[] = "\xe2\x96\x81"; /* U+2581, SentencePiece's escaped space */

/* One normalisation step: how many input bytes the next unit consumes and what it becomes. */
static size_t norm_prefix(const spm_normalizer *nz, const char *s, size_t len, const char **out, size_t *out_len) {
    if (nz->user && nz->user_first[(uint8_t)s[0]]) {
        int32_t v;
        size_t n = spm_da_longest(nz->user, s, len, &v);
        if (n) { *out = s; *out_len = n; return n; }
    }
    size_t n = spm_charsmap_match(&nz->cm, s, len, out, out_len);
    if (n) return n;
    int cl = spm_utf8_valid_len((const uint8_t *)s, len);
    if (cl == 0) { *out = "\xEF\xBF\xBD"; *out_len = 3; return 1; }
    *out = s;
    *out_len = (size_t)cl;
    return (size_t)cl;
}

static inline void put_ws(const spm_normspec *sp, spm_buf *o) {
    if (sp->escape_whitespaces) spm_buf_put(o, kSpace, 3);
    else spm_buf_put(o, " ", 1);
}

void spm_normalize(const spm_normalizer *nz, const char *in, size_t len, spm_buf *o) {
    const spm_normspec *sp = nz->spec;
    o->n = 0;
    if (len == 0) return;
    const char *r;
    size_t rl;
    if (sp->remove_extra_whitespaces) { /* skip leading units that normalise to exactly " " */
        while (len > 0) {
            size_t n = norm_prefix(nz, in, len, &r, &rl);
            if (!(rl == 1 && r[0] == ' ')) break;
            in += n;
            len -= n;
        }
    }
    if (len == 0) return;
    spm_buf_reserve(o, len * 3 + 8);
    if (!nz->treat_ws_as_suffix && sp->add_dummy_prefix) put_ws(sp, o);
    int prev_space = sp->remove_extra_whitespaces;
    while (len > 0) {
        size_t n = norm_prefix(nz, in, len, &r, &rl);
        if (prev_space)
            while (rl > 0 && r[0] == ' ') { r++; rl--; }
        if (rl > 0) {
            if (sp->escape_whitespaces) {
                /* Fast path: copy runs without spaces in one go. */
                size_t i = 0;
                while (i < rl) {
                    size_t j = i;
                    while (j < rl && r[j] != ' ') j++;
                    spm_buf_put(o, r + i, j - i);
                    if (j < rl) { spm_buf_put(o, kSpace, 3); j++; }
                    i = j;
                }
            } else {
                spm_buf_put(o, r, rl);
            }
            prev_space = r[rl - 1] == ' ';
        }
        in += n;
        len -= n;
        if (!sp->remove_extra_whitespaces) prev_space = 0;
    }
    if (sp->remove_extra_whitespaces) { /* drop trailing (escaped) spaces */
        const char *ws = sp->escape_whitespaces ? kSpace : " ";
        size_t wl = sp->escape_whitespaces ? 3 : 1;
        while (o->n >= wl && memcmp(o->s + o->n - wl, ws, wl) == 0) o->n -= wl;
    }
    if (nz->treat_ws_as_suffix && sp->add_dummy_prefix) put_ws(sp, o);
}
