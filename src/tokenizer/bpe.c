/* BPE encoding as SentencePiece does it: start from characters (user-defined symbols are single
 * frozen symbols), repeatedly merge the adjacent pair whose concatenation is the highest-scoring
 * piece (ties: leftmost), using a binary heap of candidate pairs with lazy invalidation. Merges
 * that produce an UNUSED piece are undone at the end (resegmented into the two halves they came
 * from). Symbols left that are not pieces become <unk>. */
#include "tokenizer/spm.h"
#include <stdlib.h>
#include <string.h>

typedef struct sym { int32_t prev, next; uint32_t off, len; int frozen; } sym;
typedef struct pair { float score; int32_t left, right; uint32_t size; } pair;
/* Records how an UNUSED piece was formed (last formation wins, like SentencePiece's map). */
typedef struct revm { int32_t id; uint32_t left_len; } revm;

typedef struct bpe {
    const spm_model *m;
    const char *s;
    sym *sy;
    pair *heap; int nh, caph;
    revm *rev; int nrev, caprev;
} bpe;

/* Heap order: higher score first, then smaller left index. */
static inline int pair_before(const pair *a, const pair *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(bpe *B, pair p) {
    if (B->nh == B->caph) {
        B->caph = B->caph ? B->caph * 2 : 256;
        B->heap = glm_realloc(B->heap, (size_t)B->caph * sizeof *B->heap);
    }
    int i = B->nh++;
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (!pair_before(&p, &B->heap[parent])) break;
        B->heap[i] = B->heap[parent];
        i = parent;
    }
    B->heap[i] = p;
}

static pair heap_pop(bpe *B) {
    pair top = B->heap[0], last = B->heap[--B->nh];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= B->nh) break;
        if (c + 1 < B->nh && pair_before(&B->heap[c + 1], &B->heap[c])) c++;
        if (!pair_before(&B->heap[c], &last)) break;
        B->heap[i] = B->heap[c];
        i = c;
    }
    if (B->nh > 0) B->heap[i] = last;
    return top;
}

static void maybe_add(bpe *B, int32_t l, int32_t r) {
    if (l < 0 || r < 0 || B->sy[l].frozen || B->sy[r].frozen) return;
    uint32_t size = B->sy[l].len + B->sy[r].len;
    int32_t id = spm_map_get(&B->m->normal, &B->m->p, B->s + B->sy[l].off, size);
    if (id < 0) return;
    heap_push(B, (pair){B->m->p.score[id], l, r, size});
    if (B->m->p.type[id] == SPM_UNUSED) {
        int k = 0;
        while (k < B->nrev && B->rev[k].id != id) k++;
        if (k == B->nrev) {
            if (B->nrev == B->caprev) {
                B->caprev = B->caprev ? B->caprev * 2 : 16;
                B->rev = glm_realloc(B->rev, (size_t)B->caprev * sizeof *B->rev);
            }
            B->nrev++;
        }
        B->rev[k] = (revm){id, B->sy[l].len};
    }
}

/* Emits a final symbol, undoing merges into UNUSED pieces. */
static void resegment(bpe *B, spm_scratch *sc, uint32_t off, uint32_t len, int depth) {
    int32_t id = spm_piece_to_id(B->m, B->s + off, len);
    if (id < 0) id = B->m->unk_id;
    if (B->m->p.type[id] == SPM_UNUSED && depth < 4096) {
        for (int k = 0; k < B->nrev; k++)
            if (B->rev[k].id == id) {
                uint32_t ll = B->rev[k].left_len;
                resegment(B, sc, off, ll, depth + 1);
                resegment(B, sc, off + ll, len - ll, depth + 1);
                return;
            }
    }
    spm_tok_push(sc, id, off, len);
}

void spm_bpe_encode(const spm_model *m, spm_scratch *sc) {
    const char *s = sc->norm.s;
    size_t n = sc->norm.n;
    if (n == 0) return;
    bpe B = {0};
    B.m = m;
    B.s = s;
    B.sy = spm_scratch_work(&sc->work, &sc->work_cap, n * sizeof(sym));
    int32_t ns = 0;
    for (size_t off = 0; off < n;) {
        size_t len = 0;
        int frozen = 0;
        if (m->has_user && m->user_first[(uint8_t)s[off]]) {
            int32_t v;
            len = spm_da_longest(&m->user, s + off, n - off, &v);
            frozen = len > 0;
        }
        if (!len) {
            len = (size_t)spm_one_char_len((uint8_t)s[off]);
            if (len > n - off) len = n - off;
        }
        B.sy[ns] = (sym){ns - 1, -1, (uint32_t)off, (uint32_t)len, frozen};
        if (ns > 0) B.sy[ns - 1].next = ns;
        ns++;
        off += len;
    }
    for (int32_t i = 1; i < ns; i++) maybe_add(&B, i - 1, i);
    while (B.nh > 0) {
        pair top = heap_pop(&B);
        sym *L = &B.sy[top.left], *R = &B.sy[top.right];
        if (L->len == 0 || R->len == 0 || L->len + R->len != top.size) continue; /* stale */
        L->len += R->len;
        L->next = R->next;
        if (R->next >= 0) B.sy[R->next].prev = top.left;
        R->len = 0;
        maybe_add(&B, L->prev, top.left);
        maybe_add(&B, top.left, L->next);
    }
    for (int32_t i = 0; i != -1; i = B.sy[i].next) resegment(&B, sc, B.sy[i].off, B.sy[i].len, 0);
    free(B.heap);
    free(B.rev);
}
