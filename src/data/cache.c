/* Building tokenized examples (in parallel) and the cache file that keeps them. See data.h.
 *
 * File layout (little-endian, the host's): a 1024-byte header, then off u64[n+1], ids i32[n_tokens],
 * sup u8[n_tokens]. The payload hash chains XXH64 over those three arrays. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "data/data.h"
#include "data/hash.h"
#ifdef _OPENMP
#include <omp.h>
static int omp_threads_default(void) { return omp_get_max_threads(); }
#else
static int omp_threads_default(void) { return 1; }
#endif

#define CACHE_MAGIC "GLMTOKC\x01"
#define CACHE_VERSION 4 /* 2: sup code 2 (label eos), the layout and its ids in the key; 3: GLM-4's tools block, metadata;
                         * 4: --mask_history's eos marks, a cut example's first label */
#define HEADER_BYTES 1024
#define CHUNK 4096 /* records encoded per parallel batch */

typedef struct cache_header {
    char magic[8];
    uint32_t version, header_bytes;
    uint64_t key, n, n_tokens, payload_hash, file_bytes;
    int32_t pad, gmask, mask, sop, eop, eos;
    glm_data_summary summary;
} cache_header;
_Static_assert(sizeof(cache_header) <= HEADER_BYTES, "cache header grew past its reserved size");

/* Growable arrays while building. */
typedef struct { uint64_t *off; int32_t *ids; uint8_t *sup; int64_t n, n_tokens, cap_n, cap_t; } builder;

/* sup: 0 no label, 1 label = id, 2 label = eos (ChatGLM3's EOS convention; checked in build),
 * plus GLM_SUP_PAIR_SPLIT on a preference pair's rejected example's first token (split > 0). */
static void builder_add(builder *b, const int32_t *ids, const int32_t *labels, int len, int split, int desirable) {
    if (b->n + 2 > b->cap_n) { b->cap_n = b->cap_n ? 2 * b->cap_n : 1024; b->off = glm_realloc(b->off, (size_t)b->cap_n * 8); }
    if (b->n_tokens + len > b->cap_t) {
        while (b->n_tokens + len > b->cap_t) b->cap_t = b->cap_t ? 2 * b->cap_t : 65536;
        b->ids = glm_realloc(b->ids, (size_t)b->cap_t * 4);
        b->sup = glm_realloc(b->sup, (size_t)b->cap_t);
    }
    if (b->n == 0) b->off[0] = 0;
    for (int i = 0; i < len; i++) {
        b->ids[b->n_tokens + i] = ids[i];
        b->sup[b->n_tokens + i] = labels[i] == -100 ? 0 : labels[i] == ids[i] ? 1 : 2;
    }
    if (split > 0) b->sup[b->n_tokens + split] |= GLM_SUP_PAIR_SPLIT;
    if (desirable && len > 0) b->sup[b->n_tokens] |= GLM_SUP_KTO_DESIRABLE;
    b->n_tokens += len;
    b->off[++b->n] = (uint64_t)b->n_tokens;
}

static uint64_t hash_str(uint64_t h, const char *s) {
    int64_t len = s ? (int64_t)strlen(s) : -1; /* NULL and "" differ */
    h = glm_xxh64(&len, sizeof len, h);
    return s ? glm_xxh64(s, (size_t)len, h) : h;
}

/* Every setting that changes the examples, chained. */
static uint64_t settings_hash(const glm_data_cfg *c, const glm_encoder *e) {
    const glm_read_cfg *r = &c->read;
    const glm_example_cfg *x = &c->example;
    int64_t nums[] = {CACHE_VERSION, r->schema, r->container, r->skip_bad_samples, x->max_source_length,
                      x->max_target_length, x->rounds, x->train_on_prompt, e->gmask, e->sop, e->eop, e->pad, e->mask,
                      e->layout, e->eos, e->role[0], e->role[1], e->role[2], e->role[3], x->conv_labels, r->max_records, x->cutoff_len, x->mask_history,
                      x->reasoning, x->disable_thinking, r->pairs, r->texts, x->pt_block, x->pt_group, r->kto, x->kto};
    uint64_t h = glm_xxh64(nums, sizeof nums, (uint64_t)e->fingerprint);
    const char *strs[] = {r->columns.prompt, r->columns.response, r->columns.history, r->columns.input,
                          r->columns.system, x->source_prefix, x->prompt_template, x->history_template, x->default_system,
                          r->columns.kto_tag};
    for (size_t i = 0; i < sizeof strs / sizeof *strs; i++) h = hash_str(h, strs[i]);
    return h;
}

static uint64_t payload_hash(const uint64_t *off, const int32_t *ids, const uint8_t *sup, int64_t n, int64_t nt) {
    uint64_t h = glm_xxh64(off, (size_t)(n + 1) * 8, 0);
    h = glm_xxh64(ids, (size_t)nt * 4, h);
    return glm_xxh64(sup, (size_t)nt, h);
}

/* --stage pt's groups: the texts of pt_group records joined, then cut into pt_block-token examples
 * (the remainder dropped) when the group is full or the file ends. */
typedef struct { glm_ids ids; int records; } text_group;

static void group_flush(builder *b, text_group *g, int block, glm_data_summary *s) {
    for (int at = 0; at + block <= g->ids.n; at += block) {
        builder_add(b, g->ids.data + at, g->ids.data + at, block, 0, 0);
        s->supervised += block;
        if (block > s->longest) s->longest = block;
        if (block < s->shortest) s->shortest = block;
    }
    s->truncated_answer += g->ids.n % block != 0; /* a group whose last tokens made no whole block */
    g->ids.n = 0;
    g->records = 0;
}

/* Reads and encodes the whole file into b, counting into s. */
static int build(builder *b, glm_data_summary *s, const char *path, const glm_data_cfg *cfg,
                 const glm_encoder *enc, glm_err *err) {
    glm_reader *rd;
    glm_read_cfg rcfg = cfg->read;
    rcfg.conversations = glm_layout_turns(enc->layout); /* ChatGLM3 and GLM-4 train on whole conversations */
    rcfg.glm4 = enc->layout == GLM_LAYOUT_GLM4;
    if (glm_reader_open(&rd, path, &rcfg, err)) return -1;
    int ret = 0, nt = cfg->num_threads, block = cfg->example.pt_block, group = cfg->example.pt_group;
    /* --stage kto reads a group of records at a time: each one's KL example takes its neighbour's answer */
    int kto = rcfg.kto, take = kto ? group : CHUNK, cap = take > CHUNK ? take : CHUNK;
    glm_record *recs = glm_calloc((size_t)cap, sizeof *recs);
    glm_ids *ids = glm_calloc((size_t)cap, sizeof *ids), *labels = glm_calloc((size_t)cap, sizeof *labels);
    glm_example_info *info = glm_calloc((size_t)cap, sizeof *info);
    int *rc = glm_calloc((size_t)cap, sizeof *rc);
    text_group tg = {0};
    s->shortest = INT32_MAX;
    for (int done = 0; !done && !ret;) {
        int n = 0, r = 0;
        while (n < take && (r = glm_reader_next(rd, &recs[n], err)) == 1) n++;
        if (r < 0) ret = -1;
        done = r <= 0;
        int m = ret ? 0 : n; /* after a read error only free what was read */
        if (kto) /* LLaMA-Factory's feedback processor: the KL example pairs each prompt with the previous record's
                  * answer in its group (the first with the last's) */
            for (int i = 0; i < m; i++) {
                const glm_record *prev = &recs[(i + n - 1) % n];
                recs[i].rejected = glm_strdup(prev->msgs && prev->n_msgs ? prev->msgs[prev->n_msgs - 1].content : prev->answer);
            }
        #pragma omp parallel for schedule(dynamic, 16) num_threads(nt > 0 ? nt : omp_threads_default())
        for (int i = 0; i < m; i++) {
            glm_err local; /* per thread: the first failure is re-run below for its message */
            rc[i] = glm_example_build(&cfg->example, enc, &recs[i], &ids[i], &labels[i], &info[i], &local);
        }
        for (int i = 0; i < m && !ret; i++) {
            if (rc[i]) { ret = glm_example_build(&cfg->example, enc, &recs[i], &ids[i], &labels[i], &info[i], err); if (!ret) ret = -1; break; }
            s->empty += info[i].status == GLM_EX_EMPTY;
            s->no_answer_tokens += info[i].status == GLM_EX_NO_ANSWER_TOKENS;
            if (info[i].status != GLM_EX_OK) continue;
            for (int k = 0; k < ids[i].n && !ret; k++)
                if (labels[i].data[k] != -100 && labels[i].data[k] != ids[i].data[k] && labels[i].data[k] != enc->eos)
                    ret = glm_fail(err, "record %lld: label %d at token %d is neither the token nor eos (cannot be cached)",
                                   (long long)recs[i].index, labels[i].data[k], k);
            if (ret) break;
            if (block > 0) { /* a text into its group; the group's blocks are the examples */
                glm_ids_append(&tg.ids, ids[i].data, ids[i].n);
                if (++tg.records == group) group_flush(b, &tg, block, s);
                continue;
            }
            s->truncated_prompt += info[i].truncated_prompt;
            s->truncated_answer += info[i].truncated_answer;
            builder_add(b, ids[i].data, labels[i].data, ids[i].n, info[i].pair_split, kto && recs[i].kto_tag == 1);
            for (int k = 0; k < ids[i].n; k++) s->supervised += labels[i].data[k] != -100;
            if (ids[i].n > s->longest) s->longest = ids[i].n;
            if (ids[i].n < s->shortest) s->shortest = ids[i].n;
        }
        for (int i = 0; i < n; i++) glm_record_free(&recs[i]);
    }
    if (block > 0 && !ret && tg.records) group_flush(b, &tg, block, s);
    glm_ids_free(&tg.ids);
    const glm_read_stats *st = glm_reader_stats(rd);
    s->records = st->records; s->bad_json = st->bad_json; s->bad_record = st->bad_record; s->bom = st->bom;
    s->schema = glm_reader_schema(rd);
    memcpy(s->first_bad, st->first_bad, sizeof s->first_bad);
    s->examples = b->n; s->tokens = b->n_tokens;
    if (b->n == 0) s->shortest = 0;
    for (int i = 0; i < cap; i++) { glm_ids_free(&ids[i]); glm_ids_free(&labels[i]); }
    free(recs); free(ids); free(labels); free(info); free(rc);
    glm_reader_close(rd);
    return ret;
}

static int write_cache(const char *path, const cache_header *h0, const builder *b, glm_err *err) {
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()); /* per process: ranks may race */
    FILE *f = fopen(tmp, "wb");
    if (!f) return glm_fail(err, "cannot create the data cache %s: %s", tmp, strerror(errno));
    char hdr[HEADER_BYTES] = {0};
    memcpy(hdr, h0, sizeof *h0);
    int ok = fwrite(hdr, 1, sizeof hdr, f) == sizeof hdr;
    /* no tokens (every record bad or empty): ids and sup are NULL, which fwrite must not get */
    ok &= fwrite(b->off, 8, (size_t)b->n + 1, f) == (size_t)b->n + 1;
    if (b->n_tokens > 0) {
        ok &= fwrite(b->ids, 4, (size_t)b->n_tokens, f) == (size_t)b->n_tokens;
        ok &= fwrite(b->sup, 1, (size_t)b->n_tokens, f) == (size_t)b->n_tokens;
    }
    ok &= fflush(f) == 0;
    ok &= fsync(fileno(f)) == 0;
    ok &= fclose(f) == 0;
    if (!ok) {
        unlink(tmp);
        glm_fail(err, "cannot write the data cache %s (disk full?)", tmp);
        return glm_hint(err, "free disk space or point --cache_dir elsewhere");
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return glm_fail(err, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    }
    return 0;
}

/* Maps a cache file and checks it. Returns 0, or -1 with the reason in why ("stale: ..." when
 * the key differs, "corrupt: ..." otherwise); errno-style failures also land in why. */
static int open_cache(glm_examples *ex, const char *path, uint64_t key, int verify, char *why, size_t n) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { snprintf(why, n, "%s", errno == ENOENT ? "absent" : strerror(errno)); return -1; }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < HEADER_BYTES) {
        close(fd);
        snprintf(why, n, "corrupt: %lld bytes, shorter than the header", (long long)st.st_size);
        return -1;
    }
    size_t len = (size_t)st.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) { snprintf(why, n, "mmap failed: %s", strerror(errno)); return -1; }
    cache_header h;
    memcpy(&h, map, sizeof h);
    const char *bad = NULL;
    if (memcmp(h.magic, CACHE_MAGIC, 8)) bad = "corrupt: bad magic";
    else if (h.version != CACHE_VERSION || h.header_bytes != HEADER_BYTES) bad = "stale: older cache version";
    else if (h.key != key) bad = "stale: the data, tokenizer or settings changed";
    else if (h.n > (1ULL << 40) || h.n_tokens > (1ULL << 44) || h.file_bytes != len ||
             HEADER_BYTES + 8 * (h.n + 1) + 5 * h.n_tokens != len) bad = "corrupt: sizes do not match";
    const uint64_t *off = (const uint64_t *)((char *)map + HEADER_BYTES);
    const int32_t *ids = (const int32_t *)(off + h.n + 1);
    const uint8_t *sup = (const uint8_t *)(ids + h.n_tokens);
    if (!bad) {
        for (uint64_t i = 0; i < h.n && !bad; i++) if (off[i] > off[i + 1]) bad = "corrupt: offsets out of order";
        if (!bad && (off[0] != 0 || off[h.n] != h.n_tokens)) bad = "corrupt: offsets do not cover the tokens";
    }
    if (!bad && verify && payload_hash(off, ids, sup, (int64_t)h.n, (int64_t)h.n_tokens) != h.payload_hash)
        bad = "corrupt: payload hash mismatch";
    if (bad) { munmap(map, len); snprintf(why, n, "%s", bad); return -1; }
    ex->n = (int64_t)h.n; ex->n_tokens = (int64_t)h.n_tokens;
    ex->off = off; ex->ids = ids; ex->sup = sup;
    ex->pad = h.pad; ex->gmask = h.gmask; ex->mask = h.mask; ex->sop = h.sop; ex->eop = h.eop; ex->eos = h.eos;
    ex->summary = h.summary;
    ex->map_ = map; ex->map_len_ = len;
    return 0;
}

static void cache_file_name(char *dst, size_t n, const char *dir, const char *path, uint64_t settings) {
    char real[4096];
    const char *id = realpath(path, real) ? real : path;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char name[512];
    snprintf(name, sizeof name, "%.200s-%016llx.glmcache", base,
             (unsigned long long)glm_xxh64(id, strlen(id), settings));
    glm_path_join(dst, n, dir, name);
}

int glm_examples_load(glm_examples **out, const char *path, const glm_data_cfg *cfg, const glm_encoder *enc,
                      glm_err *err) {
    if (glm_example_cfg_check_layout(&cfg->example, enc->layout, err)) return -1;
    glm_examples *ex = glm_calloc(1, sizeof *ex);
    snprintf(ex->path, sizeof ex->path, "%s", path);
    uint64_t settings = settings_hash(cfg, enc), key = 0;
    if (cfg->cache_dir) {
        if (glm_hash_file(path, settings, &key, err)) { free(ex); return glm_hint(err, "check --train_file / --validation_file"); }
        cache_file_name(ex->cache_path, sizeof ex->cache_path, cfg->cache_dir, path, settings);
        char why[200];
        if (cfg->overwrite_cache) snprintf(ex->cache_note, sizeof ex->cache_note, "rebuilt: --overwrite_cache");
        else if (open_cache(ex, ex->cache_path, key, 1, why, sizeof why) == 0) {
            snprintf(ex->cache_note, sizeof ex->cache_note, "hit");
            *out = ex;
            return 0;
        } else snprintf(ex->cache_note, sizeof ex->cache_note, strcmp(why, "absent") ? "rebuilt: %s" : "built", why);
    }
    builder b = {0};
    glm_data_summary s = {0};
    if (build(&b, &s, path, cfg, enc, err)) {
        free(b.off); free(b.ids); free(b.sup); free(ex);
        return -1;
    }
    if (!b.off) { b.off = glm_calloc(1, 8); }
    cache_header h = {.version = CACHE_VERSION, .header_bytes = HEADER_BYTES, .key = key, .n = (uint64_t)b.n,
                      .n_tokens = (uint64_t)b.n_tokens, .pad = enc->pad, .gmask = enc->gmask, .mask = enc->mask,
                      .sop = enc->sop, .eop = enc->eop, .eos = enc->eos, .summary = s};
    memcpy(h.magic, CACHE_MAGIC, 8);
    h.payload_hash = payload_hash(b.off, b.ids, b.sup, b.n, b.n_tokens);
    h.file_bytes = HEADER_BYTES + 8 * (h.n + 1) + 5 * h.n_tokens;
    if (cfg->cache_dir) {
        char why[200];
        int rc = glm_mkdirs(cfg->cache_dir, err);
        if (!rc) rc = write_cache(ex->cache_path, &h, &b, err);
        if (!rc && open_cache(ex, ex->cache_path, key, 0, why, sizeof why))
            rc = glm_fail(err, "data cache %s unreadable right after writing it: %s", ex->cache_path, why);
        free(b.off); free(b.ids); free(b.sup);
        if (rc) { free(ex); return -1; }
        *out = ex;
        return 0;
    }
    /* no cache: keep the arrays */
    ex->n = b.n; ex->n_tokens = b.n_tokens;
    ex->off = b.off; ex->ids = b.ids; ex->sup = b.sup;
    ex->heap_[0] = b.off; ex->heap_[1] = b.ids; ex->heap_[2] = b.sup;
    ex->pad = enc->pad; ex->gmask = enc->gmask; ex->mask = enc->mask; ex->sop = enc->sop; ex->eop = enc->eop;
    ex->eos = enc->eos;
    ex->summary = s;
    *out = ex;
    return 0;
}

glm_examples *glm_examples_concat(glm_examples *const *parts, int n, const char *path) {
    glm_examples *ex = glm_calloc(1, sizeof *ex);
    int64_t N = 0, T = 0;
    for (int i = 0; i < n; i++) { N += parts[i]->n; T += parts[i]->n_tokens; }
    uint64_t *off = glm_malloc(sizeof *off * (size_t)(N + 1));
    int32_t *ids = glm_malloc(sizeof *ids * (size_t)(T > 0 ? T : 1));
    uint8_t *sup = glm_malloc((size_t)(T > 0 ? T : 1));
    int64_t e = 0, t = 0;
    glm_data_summary *s = &ex->summary;
    for (int i = 0; i < n; i++) {
        const glm_examples *p = parts[i];
        for (int64_t k = 0; k < p->n; k++) off[e + k] = (uint64_t)t + p->off[k];
        if (p->n_tokens) {
            memcpy(ids + t, p->ids, sizeof *ids * (size_t)p->n_tokens);
            memcpy(sup + t, p->sup, (size_t)p->n_tokens);
        }
        e += p->n;
        t += p->n_tokens;
        const glm_data_summary *q = &p->summary;
        s->records += q->records; s->examples += q->examples; s->bad_json += q->bad_json; s->bad_record += q->bad_record;
        s->empty += q->empty; s->no_answer_tokens += q->no_answer_tokens; s->truncated_prompt += q->truncated_prompt;
        s->truncated_answer += q->truncated_answer; s->tokens += q->tokens; s->supervised += q->supervised;
        if (q->longest > s->longest) s->longest = q->longest;
        if (i == 0 || q->shortest < s->shortest) s->shortest = q->shortest;
        s->bom |= q->bom;
        if (!s->first_bad[0]) memcpy(s->first_bad, q->first_bad, sizeof s->first_bad);
    }
    off[N] = (uint64_t)T;
    s->schema = n ? parts[0]->summary.schema : 0;
    ex->n = N; ex->n_tokens = T;
    ex->off = off; ex->ids = ids; ex->sup = sup;
    ex->heap_[0] = off; ex->heap_[1] = ids; ex->heap_[2] = sup;
    if (n) {
        const glm_examples *p = parts[0];
        ex->pad = p->pad; ex->gmask = p->gmask; ex->mask = p->mask; ex->sop = p->sop; ex->eop = p->eop; ex->eos = p->eos;
    }
    snprintf(ex->path, sizeof ex->path, "%s", path);
    return ex;
}

void glm_examples_free(glm_examples *ex) {
    if (!ex) return;
    if (ex->map_) munmap(ex->map_, ex->map_len_);
    for (int i = 0; i < 3; i++) free(ex->heap_[i]);
    free(ex);
}

int glm_examples_labels(const glm_examples *ex, int64_t i, int32_t *labels) {
    int len = glm_examples_len(ex, i);
    const int32_t *ids = ex->ids + ex->off[i];
    const uint8_t *sup = ex->sup + ex->off[i];
    for (int k = 0; k < len; k++) {
        int s = sup[k] & GLM_SUP_LABEL;
        labels[k] = s == 0 ? -100 : s == 1 ? ids[k] : ex->eos;
    }
    return len;
}
