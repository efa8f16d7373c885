/* Unigram encoding: the best-scoring segmentation of the normalised text, found left to right
 * over UTF-8 byte positions (SentencePiece's "optimized" encoder, the default since 0.1.9x).
 * For every character start we walk the piece trie byte by byte; each piece that ends at position
 * e offers best[start] + score to best[e]. A character no piece covers alone gets an <unk> node
 * with score min_score - 10.
 *
 * Exactness notes (ids must equal SentencePiece's, ties included):
 *  - a piece's contribution is computed in double (SentencePiece mixes the float score with the
 *    double 0.1 of the user-defined bonus, which promotes the whole expression), compared against
 *    the stored float best, then stored as float;
 *  - the <unk> candidate is pure float arithmetic;
 *  - ties keep the first candidate: earlier starts win, i.e. the longer piece. */
#include "tokenizer/spm.h"

typedef struct node { float score; int32_t start; int32_t id; } node;

void spm_unigram_encode(const spm_model *m, spm_scratch *sc) {
    const uint8_t *s = (const uint8_t *)sc->norm.s;
    const int32_t n = (int32_t)sc->norm.n;
    if (n == 0) return;
    node *best = spm_scratch_work(&sc->work, &sc->work_cap, (size_t)(n + 1) * sizeof(node));
    for (int32_t i = 0; i <= n; i++) best[i].start = -1;
    best[0].score = 0;
    const float unk_score = m->min_score - 10.0f;
    const spm_da_unit *u = m->trie.u;
    const uint32_t nu = (uint32_t)m->trie.n;
    const double *vs = m->vscore;
    for (int32_t start = 0; start < n;) {
        const float here = best[start].score;
        int mblen = spm_one_char_len(s[start]);
        if (mblen > n - start) mblen = n - start;
        int single = 0;
        int32_t node_id = 0;
        for (int32_t k = start; k < n; k++) {
            int32_t t = u[node_id].base + s[k];
            if ((uint32_t)t >= nu || u[t].check != node_id) break;
            node_id = t;
            int32_t id = u[t].val;
            if (id < 0) continue;
            node *tg = &best[k + 1];
            double cand = vs[id] + (double)here;
            if (tg->start == -1 || cand > (double)tg->score) {
                tg->score = (float)cand;
                tg->start = start;
                tg->id = id;
            }
            if (k + 1 - start == mblen) single = 1;
        }
        if (!single) {
            node *tg = &best[start + mblen];
            float cand = unk_score + here;
            if (tg->start == -1 || cand > tg->score) {
                tg->score = cand;
                tg->start = start;
                tg->id = m->unk_id;
            }
        }
        start += mblen;
    }
    /* Backtrack, then reverse in place. */
    int first = sc->ntok;
    for (int32_t e = n; e > 0;) {
        const node *b = &best[e];
        spm_tok_push(sc, b->id, (uint32_t)b->start, (uint32_t)(e - b->start));
        e = b->start;
    }
    for (int i = first, j = sc->ntok - 1; i < j; i++, j--) {
        spm_tok t = sc->tok[i];
        sc->tok[i] = sc->tok[j];
        sc->tok[j] = t;
    }
}
