/* Data layer, part 2: the tokenized cache (hit, stale, corrupt, atomic), glm_data_load (summary
 * counts, empty datasets, val_size split), packing rows, and the loader (dynamic padding,
 * shuffle, group_by_length, data-parallel shares, drop_last, exact resume). Fake encoder. */
#include <sys/stat.h>
#include "test_data_util.h"
#include "data/loader.h"

/* n alpaca records whose answers have varied lengths (1 + (i * 7) % 23 characters). */
static const char *make_data(const char *name, int n, int extra) {
    size_t cap = (size_t)n * 128 + 256, used = 0;
    char *buf = glm_malloc(cap);
    used += (size_t)snprintf(buf + used, cap - used, "[\n");
    for (int i = 0; i < n; i++) {
        char ans[64];
        int len = 1 + (i * 7) % 23;
        for (int k = 0; k < len; k++) ans[k] = (char)('a' + (i + k) % 26);
        ans[len] = 0;
        used += (size_t)snprintf(buf + used, cap - used, "{\"instruction\": \"q%d\", \"output\": \"%s%s\"}%s\n", i, ans,
                                 extra ? "!" : "", i + 1 < n ? "," : "");
    }
    snprintf(buf + used, cap - used, "]\n");
    const char *p = write_file(name, buf);
    free(buf);
    return p;
}

static int same_examples(const glm_examples *a, const glm_examples *b) {
    return a->n == b->n && a->n_tokens == b->n_tokens && !memcmp(a->off, b->off, 8 * (size_t)(a->n + 1)) &&
           !memcmp(a->ids, b->ids, 4 * (size_t)a->n_tokens) && !memcmp(a->sup, b->sup, (size_t)a->n_tokens);
}

static void corrupt_byte(const char *path, long off) {
    FILE *f = fopen(path, "r+b");
    fseek(f, off, off < 0 ? SEEK_END : SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, off < 0 ? SEEK_END : SEEK_SET);
    fputc(c ^ 0x5A, f);
    fclose(f);
}

static int count_tmp_files(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls %s/cache 2>/dev/null | grep -c '\\.tmp\\.'", test_dir);
    FILE *p = popen(cmd, "r");
    int n = 0;
    if (fscanf(p, "%d", &n) != 1) n = -1;
    pclose(p);
    return n;
}

static void test_cache(test_counts *tc) {
    const char *data = make_data("c.json", 50, 0);
    char cache[512];
    snprintf(cache, sizeof cache, "%s/cache", test_dir);
    glm_data_cfg cfg;
    glm_data_cfg_init(&cfg);
    cfg.cache_dir = cache;
    glm_encoder enc = fake_encoder();
    glm_err err = {0};
    glm_examples *mem = NULL, *a = NULL, *b = NULL;
    glm_data_cfg nocache = cfg;
    nocache.cache_dir = NULL;
    int rc = glm_examples_load(&mem, data, &nocache, &enc, &err);
    TEST_CHECK(tc, "cache_none_in_memory", rc == 0 && mem->n == 50 && mem->cache_path[0] == 0, "rc %d (%s)", rc, err.msg);
    rc = glm_examples_load(&a, data, &cfg, &enc, &err);
    TEST_CHECK(tc, "cache_built", rc == 0 && !strcmp(a->cache_note, "built") && same_examples(a, mem) && count_tmp_files() == 0,
               "rc %d note '%s' (%s)", rc, a ? a->cache_note : "", err.msg);
    rc = glm_examples_load(&b, data, &cfg, &enc, &err);
    TEST_CHECK(tc, "cache_hit", rc == 0 && !strcmp(b->cache_note, "hit") && same_examples(b, mem) &&
               b->summary.examples == 50 && b->gmask == FAKE_GMASK, "rc %d note '%s'", rc, b ? b->cache_note : "");
    char path[1024];
    snprintf(path, sizeof path, "%s", a->cache_path);
    glm_examples_free(a); glm_examples_free(b);

    corrupt_byte(path, -3); /* a supervision flag */
    rc = glm_examples_load(&b, data, &cfg, &enc, &err);
    TEST_CHECK(tc, "cache_corrupt_payload_rebuilt", rc == 0 && strstr(b->cache_note, "corrupt: payload hash") && same_examples(b, mem),
               "note '%s'", b ? b->cache_note : "");
    glm_examples_free(b);
    corrupt_byte(path, 0);
    rc = glm_examples_load(&b, data, &cfg, &enc, &err);
    TEST_CHECK(tc, "cache_bad_magic_rebuilt", rc == 0 && strstr(b->cache_note, "corrupt: bad magic") && same_examples(b, mem),
               "note '%s'", b ? b->cache_note : "");
    glm_examples_free(b);
    if (truncate(path, 2000) != 0) perror("truncate");
    rc = glm_examples_load(&b, data, &cfg, &enc, &err);
    TEST_CHECK(tc, "cache_truncated_rebuilt", rc == 0 && strstr(b->cache_note, "corrupt: sizes") && same_examples(b, mem),
               "note '%s'", b ? b->cache_note : "");
    glm_examples_free(b);
    if (truncate(path, 10) != 0) perror("truncate");
    rc = glm_examples_load(&b, data, &cfg, &enc, &err);
    TEST_CHECK(tc, "cache_short_rebuilt", rc == 0 && strstr(b->cache_note, "corrupt") && same_examples(b, mem),
               "note '%s'", b ? b->cache_note : "");
    glm_examples_free(b);

    make_data("c.json", 50, 1); /* same name, new content */
    rc = glm_examples_load(&b, data, &cfg, &enc, &err);
    TEST_CHECK(tc, "cache_stale_data_rebuilt", rc == 0 && strstr(b->cache_note, "stale") && b->n_tokens == mem->n_tokens + 50,
               "note '%s'", b ? b->cache_note : "");
    glm_examples_free(b);
    enc.fingerprint ^= 1; /* another tokenizer: a different cache file */
    rc = glm_examples_load(&b, data, &cfg, &enc, &err);
    TEST_CHECK(tc, "cache_key_tokenizer", rc == 0 && !strcmp(b->cache_note, "built") && strcmp(b->cache_path, path),
               "note '%s'", b ? b->cache_note : "");
    glm_examples_free(b);
    cfg.overwrite_cache = 1;
    rc = glm_examples_load(&b, data, &cfg, &enc, &err);
    TEST_CHECK(tc, "cache_overwrite", rc == 0 && strstr(b->cache_note, "overwrite"), "note '%s'", b ? b->cache_note : "");
    glm_examples_free(b);
    cfg.overwrite_cache = 0;
    cfg.num_threads = 1; /* single-threaded encoding gives the same bytes */
    glm_examples *one;
    rc = glm_examples_load(&one, data, &cfg, &enc, &err);
    rc |= glm_examples_load(&b, data, &nocache, &enc, &err);
    TEST_CHECK(tc, "cache_threads_identical", rc == 0 && !strcmp(one->cache_note, "hit") && same_examples(one, b), "rc %d", rc);
    glm_examples_free(one); glm_examples_free(b);
    glm_examples_free(mem);
    TEST_CHECK(tc, "cache_no_tmp_left", count_tmp_files() == 0, "%d tmp files", count_tmp_files());
    /* an unwritable cache dir is an error naming it */
    cfg.cache_dir = "/proc/glm_no_such_dir";
    rc = glm_examples_load(&b, data, &cfg, &enc, &err);
    TEST_CHECK(tc, "cache_unwritable", rc == -1 && strstr(err.msg, "/proc/glm_no_such_dir"), "rc %d (%s)", rc, err.msg);
}

static void test_data_load(test_counts *tc) {
    glm_data_cfg cfg;
    glm_data_cfg_init(&cfg);
    glm_encoder enc = fake_encoder();
    glm_err err = {0};
    glm_data d;
    cfg.read.skip_bad_samples = 1;
    cfg.example.max_source_length = 3;
    cfg.example.max_target_length = 5;
    cfg.train_file = write_file("mix.jsonl",
        "\xEF\xBB\xBF{\"instruction\": \"q\", \"output\": \"abc\"}\r\n"
        "{\"instruction\": \"long prompt\", \"output\": \"long answer\"}\r\n"
        "{\"instruction\": \"q\", \"output\": \"\"}\r\n"
        "{\"instruction\": \"q\", \"output\": null}\r\n"
        "{\"instruction\": \"q\", \"output\": \"   \"}\r\n"
        "{\"instruction\": \"q\", \"output\": 3}\r\n"
        "{\"instruction\": \"q\" \"output\": \"x\"}\r\n"
        "{\"instruction\": \"q\", \"output\": \"b\"}\r\n");
    int rc = glm_data_load(&d, &cfg, &enc, &err);
    const glm_data_summary *s = rc ? NULL : &d.train_ex->summary;
    TEST_CHECK(tc, "summary_counts", s && s->records == 8 && s->examples == 3 && s->bad_json == 1 && s->bad_record == 1 &&
               s->empty == 2 && s->no_answer_tokens == 1 && s->truncated_prompt == 1 && s->truncated_answer == 1 && s->bom &&
               s->longest == 2 + 2 + 3 + 1 && s->shortest == 1 + 2 + 1 + 1 && s->tokens == 7 + 8 + 5 &&
               s->supervised == 5 + 5 + 3 && strstr(s->first_bad, "mix.jsonl:6:1: field 'output' is a number"),
               "rc %d (%s) records %lld ex %lld json %lld rec %lld empty %lld none %lld trunc %lld/%lld long %lld short %lld tok %lld sup %lld",
               rc, err.msg, s ? (long long)s->records : 0, s ? (long long)s->examples : 0, s ? (long long)s->bad_json : 0,
               s ? (long long)s->bad_record : 0, s ? (long long)s->empty : 0, s ? (long long)s->no_answer_tokens : 0,
               s ? (long long)s->truncated_prompt : 0, s ? (long long)s->truncated_answer : 0, s ? (long long)s->longest : 0,
               s ? (long long)s->shortest : 0, s ? (long long)s->tokens : 0, s ? (long long)s->supervised : 0);
    char *txt = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&txt, &len);
    if (!rc) glm_data_print_summary(mf, &d, &cfg);
    fclose(mf);
    TEST_CHECK(tc, "summary_print", !rc && strstr(txt, "records 8, examples 3") && strstr(txt, "1 malformed JSON, 1 bad records, 2 empty") &&
               strstr(txt, "longest 8") && strstr(txt, "UTF-8 BOM") && strstr(txt, "no validation set"), "%s", txt);
    free(txt);
    if (!rc) glm_data_free(&d);

    cfg.read.skip_bad_samples = 0;
    rc = glm_data_load(&d, &cfg, &enc, &err);
    TEST_CHECK(tc, "data_bad_record_stops", rc == -1 && strstr(err.msg, "mix.jsonl:6:1: field 'output' is a number") &&
               strstr(err.hint, "skip_bad_samples"), "rc %d (%s)", rc, err.msg);
    glm_example_cfg_init(&cfg.example);
    cfg.train_file = write_file("empty.json", "[]");
    rc = glm_data_load(&d, &cfg, &enc, &err);
    TEST_CHECK(tc, "data_empty_array", rc == -1 && strstr(err.msg, "has no usable examples (0 records"), "rc %d (%s)", rc, err.msg);
    cfg.train_file = write_file("empty.jsonl", "");
    rc = glm_data_load(&d, &cfg, &enc, &err);
    TEST_CHECK(tc, "data_empty_file", rc == -1 && strstr(err.msg, "no usable examples") && strstr(err.hint, "no records"), "rc %d (%s)", rc, err.msg);
    cfg.train_file = write_file("allempty.jsonl", "{\"prompt\": \"a\", \"response\": \"\"}\n");
    rc = glm_data_load(&d, &cfg, &enc, &err);
    TEST_CHECK(tc, "data_all_skipped", rc == -1 && strstr(err.msg, "1 records; skipped: 0 malformed JSON, 0 bad records, 1 empty"), "rc %d (%s)", rc, err.msg);
    cfg.train_file = write_file("missing_dir/x.json", "");
    rc = glm_data_load(&d, &cfg, &enc, &err);
    TEST_CHECK(tc, "data_missing_file", rc == -1 && strstr(err.msg, "cannot open") && strstr(err.hint, "train_file"), "rc %d (%s)", rc, err.msg);

    /* validation file, and the val_size split */
    cfg.train_file = make_data("t.json", 40, 0);
    cfg.validation_file = make_data("v.json", 7, 0);
    rc = glm_data_load(&d, &cfg, &enc, &err);
    TEST_CHECK(tc, "data_validation_file", rc == 0 && d.train.n == 40 && d.val.n == 7 && d.val.ex == d.val_ex, "rc %d (%s)", rc, err.msg);
    if (!rc) glm_data_free(&d);
    cfg.validation_file = NULL;
    cfg.val_size = 0.1;
    rc = glm_data_load(&d, &cfg, &enc, &err);
    int ok = rc == 0 && d.train.n == 36 && d.val.n == 4;
    uint8_t seen[40] = {0};
    for (int64_t k = 0; ok && k < d.train.n; k++) seen[glm_dataset_index(&d.train, k)]++;
    for (int64_t k = 0; ok && k < d.val.n; k++) seen[glm_dataset_index(&d.val, k)]++;
    for (int i = 0; ok && i < 40; i++) ok = seen[i] == 1;
    int64_t first_val[4] = {0};
    for (int k = 0; ok && k < 4; k++) first_val[k] = glm_dataset_index(&d.val, k);
    TEST_CHECK(tc, "split_fraction_disjoint", ok, "rc %d train %lld val %lld", rc, (long long)d.train.n, (long long)d.val.n);
    if (!rc) glm_data_free(&d);
    rc = glm_data_load(&d, &cfg, &enc, &err);
    ok = rc == 0;
    for (int k = 0; ok && k < 4; k++) ok = glm_dataset_index(&d.val, k) == first_val[k];
    TEST_CHECK(tc, "split_deterministic", ok, "rc %d", rc);
    if (!rc) glm_data_free(&d);
    cfg.seed = 7;
    rc = glm_data_load(&d, &cfg, &enc, &err);
    ok = rc == 0;
    int differs = 0;
    for (int k = 0; ok && k < 4; k++) differs |= glm_dataset_index(&d.val, k) != first_val[k];
    TEST_CHECK(tc, "split_seed_changes_it", ok && differs, "rc %d", rc);
    if (!rc) glm_data_free(&d);
    cfg.val_size = 5;
    rc = glm_data_load(&d, &cfg, &enc, &err);
    TEST_CHECK(tc, "split_count", rc == 0 && d.val.n == 5 && d.train.n == 35, "rc %d", rc);
    if (!rc) glm_data_free(&d);
    cfg.val_size = 40;
    rc = glm_data_load(&d, &cfg, &enc, &err);
    TEST_CHECK(tc, "split_too_large", rc == -1 && strstr(err.msg, "leaving none"), "rc %d (%s)", rc, err.msg);
    cfg.val_size = 2.5;
    rc = glm_data_load(&d, &cfg, &enc, &err);
    TEST_CHECK(tc, "split_bad_value", rc == -1 && strstr(err.msg, "val_size"), "rc %d (%s)", rc, err.msg);
}

/* The batch row equals what glm_batch_set_row gives each example alone (checked segment-wise). */
static int row_matches_examples(const glm_batch *b, int r, const glm_examples *ex, const int64_t *exs, int n_ex) {
    int start = 0;
    glm_batch one;
    glm_batch_alloc(&one, 1, b->T);
    int32_t lab[4096];
    int ok = 1;
    for (int e = 0; e < n_ex && ok; e++) {
        int len = glm_examples_labels(ex, exs[e], lab);
        glm_batch_set_row(&one, 0, ex->ids + ex->off[exs[e]], lab, len, ex->pad, ex->gmask, ex->mask, ex->sop);
        for (int i = 0; i < len && ok; i++) {
            size_t k = (size_t)r * b->T + start + i;
            ok = b->ids[k] == one.ids[i] && b->pos[k] == one.pos[i] && b->block_pos[k] == one.block_pos[i] &&
                 b->kv_lo[k] == one.kv_lo[i] + start && b->kv_hi[k] == one.kv_hi[i] + start && b->targets[k] == one.targets[i];
        }
        start += len;
    }
    for (int i = start; i < b->T && ok; i++) {
        size_t k = (size_t)r * b->T + i;
        ok = b->ids[k] == ex->pad && b->targets[k] == -100 && b->kv_lo[k] == start && b->kv_hi[k] == i + 1;
    }
    glm_batch_free(&one);
    return ok;
}

/* Runs one epoch; appends the file indices seen (in order) to seen; returns steps run or -1.
 * Checks every batch: each row holds its examples back to back (check_rows: exactly as
 * glm_batch_set_row lays each out alone), T is the longest row. */
static int run_epoch(glm_loader *l, glm_batch *b, const glm_dataset *ds, int64_t *seen, int *n_seen, int check_rows) {
    int64_t steps = glm_loader_steps_per_epoch(l), exs[4096], fi[4096];
    int rows[4096];
    for (int64_t s = 0; s < steps; s++) {
        glm_err err;
        if (glm_loader_next(l, b, &err)) return -1;
        int n = glm_loader_last_examples(l, exs, rows, 4096), e = 0, maxlen = 0;
        for (int r = 0; r < b->B; r++) {
            int k = 0, len = 0;
            for (; e < n && rows[e] == r; e++, k++) {
                fi[k] = glm_dataset_index(ds, exs[e]);
                len += glm_examples_len(ds->ex, fi[k]);
            }
            if (k == 0 || (check_rows && !row_matches_examples(b, r, ds->ex, fi, k))) return -1;
            if (len > maxlen) maxlen = len;
        }
        int pm = 8;
        if (e != n || (b->T != maxlen && !(b->T % pm == 0 && b->T - maxlen < pm))) return -1;
        for (int q = 0; q < n; q++) seen[(*n_seen)++] = glm_dataset_index(ds, exs[q]);
    }
    return (int)steps;
}

static void test_loader(test_counts *tc) {
    glm_data_cfg cfg;
    glm_data_cfg_init(&cfg);
    glm_encoder enc = fake_encoder();
    glm_err err = {0};
    glm_examples *ex;
    const char *p = make_data("l.json", 103, 0);
    if (glm_examples_load(&ex, p, &cfg, &enc, &err)) { TEST_FAIL(tc, "loader_setup", "%s", err.msg); return; }
    glm_dataset ds = {ex, NULL, ex->n};
    glm_loader_cfg lc;
    glm_loader_cfg_init(&lc);
    lc.batch_size = 8;
    glm_loader *l;
    glm_batch b;
    int64_t seen[512];
    int n_seen = 0;
    int rc = glm_loader_open(&l, &ds, &lc, &err);
    glm_loader_batch_alloc(l, &b);
    int steps = run_epoch(l, &b, &ds, seen, &n_seen, 1);
    int perm_ok = n_seen == 103, in_order = 1;
    uint8_t cnt[103] = {0};
    for (int i = 0; i < n_seen; i++) { cnt[seen[i]]++; in_order &= seen[i] == i; }
    for (int i = 0; i < 103; i++) perm_ok &= cnt[i] == 1;
    glm_data_cursor cur = glm_loader_cursor(l);
    TEST_CHECK(tc, "loader_epoch_is_permutation", rc == 0 && steps == 13 && perm_ok && !in_order && cur.epoch == 1 && cur.step == 0,
               "rc %d steps %d seen %d", rc, steps, n_seen);
    TEST_CHECK(tc, "loader_last_partial_batch_kept", b.B == 103 - 12 * 8, "last B %d", b.B);
    /* the next epoch is another permutation; the same seed gives the same epochs */
    int64_t seen2[512];
    int n2 = 0;
    run_epoch(l, &b, &ds, seen2, &n2, 0);
    TEST_CHECK(tc, "loader_epochs_differ", n2 == 103 && memcmp(seen, seen2, 103 * sizeof *seen), "n %d", n2);
    glm_loader *l2;
    glm_loader_open(&l2, &ds, &lc, &err);
    int64_t seen3[512];
    int n3 = 0;
    run_epoch(l2, &b, &ds, seen3, &n3, 0);
    TEST_CHECK(tc, "loader_seeded_deterministic", n3 == 103 && !memcmp(seen, seen3, 103 * sizeof *seen), "n %d", n3);
    /* exact resume: seek to (1, 5) and compare the batches that follow */
    glm_loader_seek(l2, (glm_data_cursor){1, 5}, &err);
    glm_loader_seek(l, (glm_data_cursor){1, 0}, &err);
    glm_batch b2;
    glm_loader_batch_alloc(l2, &b2);
    int same = 1;
    for (int s = 0; s < 5; s++) glm_loader_next(l, &b, &err);
    for (int s = 0; s < 12 && same; s++) {
        glm_loader_next(l, &b, &err);
        glm_loader_next(l2, &b2, &err);
        same = b.B == b2.B && b.T == b2.T && !memcmp(b.ids, b2.ids, sizeof(int32_t) * b.B * b.T) &&
               !memcmp(b.targets, b2.targets, sizeof(int32_t) * b.B * b.T) && b.n_targets == b2.n_targets;
    }
    cur = glm_loader_cursor(l2);
    TEST_CHECK(tc, "loader_resume_exact", same && cur.epoch == 2 && cur.step == 4, "same %d cursor %lld/%lld", same,
               (long long)cur.epoch, (long long)cur.step);
    TEST_CHECK(tc, "loader_seek_out_of_range", glm_loader_seek(l2, (glm_data_cursor){0, 14}, &err) == -1, "accepted");
    glm_batch_free(&b2);
    glm_loader_free(l2);
    glm_loader_free(l);
    glm_batch_free(&b);

    /* no shuffle: file order; drop_last; pad_multiple */
    lc.shuffle = 0; lc.drop_last = 1; lc.pad_multiple = 8;
    rc = glm_loader_open(&l, &ds, &lc, &err);
    glm_loader_batch_alloc(l, &b);
    n_seen = 0;
    steps = run_epoch(l, &b, &ds, seen, &n_seen, 0);
    in_order = 1;
    for (int i = 0; i < n_seen; i++) in_order &= seen[i] == i;
    TEST_CHECK(tc, "loader_drop_last_file_order", rc == 0 && steps == 12 && n_seen == 96 && in_order, "steps %d seen %d", steps, n_seen);
    glm_loader_seek(l, (glm_data_cursor){0, 0}, &err);
    glm_loader_next(l, &b, &err);
    TEST_CHECK(tc, "loader_pad_multiple", b.T % 8 == 0, "T %d", b.T);
    glm_loader_free(l);
    glm_batch_free(&b);
    lc.drop_last = 0; lc.pad_multiple = 0; lc.shuffle = 1;

    /* dynamic padding detail: T is the longest row in the batch, pads masked */
    lc.batch_size = 4;
    glm_loader_open(&l, &ds, &lc, &err);
    glm_loader_batch_alloc(l, &b);
    n_seen = 0;
    steps = run_epoch(l, &b, &ds, seen, &n_seen, 1);
    TEST_CHECK(tc, "loader_dynamic_padding_rows", steps == 26 && n_seen == 103, "steps %d", steps);
    glm_loader_free(l);
    glm_batch_free(&b);

    /* data parallel: 3 ranks, disjoint shares (DistributedSampler pads 103 -> 105 by wrapping) */
    int64_t all[3][512];
    int na[3] = {0}, st[3];
    for (int r = 0; r < 3; r++) {
        lc.rank = r; lc.world = 3;
        glm_loader_open(&l, &ds, &lc, &err);
        glm_loader_batch_alloc(l, &b);
        st[r] = run_epoch(l, &b, &ds, all[r], &na[r], 0);
        glm_loader_free(l);
        glm_batch_free(&b);
    }
    int cover[103] = {0};
    for (int r = 0; r < 3; r++) for (int i = 0; i < na[r]; i++) cover[all[r][i]]++;
    int ones = 0, twos = 0;
    for (int i = 0; i < 103; i++) { ones += cover[i] == 1; twos += cover[i] == 2; }
    TEST_CHECK(tc, "loader_ranks_disjoint", st[0] == 9 && st[1] == 9 && st[2] == 9 && na[0] == 35 && na[1] == 35 && na[2] == 35 &&
               ones == 101 && twos == 2, "steps %d %d %d, rows %d %d %d, once %d twice %d", st[0], st[1], st[2], na[0], na[1], na[2], ones, twos);
    /* evaluation: the 2 rows repeated to pad 103 rows to 105 carry no targets, so the 3 ranks
     * together count every example's targets exactly once (without the flag, more) */
    long tg[3] = {0}; /* one rank; 3 ranks with no_loss_on_wrap; 3 ranks without */
    for (int pass = 0; pass < 3; pass++) {
        int W = pass == 0 ? 1 : 3;
        lc.no_loss_on_wrap = pass == 1;
        for (int r = 0; r < W; r++) {
            lc.rank = r; lc.world = W;
            glm_loader_open(&l, &ds, &lc, &err);
            glm_loader_batch_alloc(l, &b);
            for (int64_t k = 0; k < glm_loader_steps_per_epoch(l); k++) { glm_loader_next(l, &b, &err); tg[pass] += b.n_targets; }
            glm_loader_free(l);
            glm_batch_free(&b);
        }
    }
    lc.no_loss_on_wrap = 0;
    TEST_CHECK(tc, "loader_eval_wrapped_rows_counted_once", tg[0] > 0 && tg[1] == tg[0] && tg[2] > tg[0],
               "targets: 1 rank %ld, 3 ranks %ld with the flag, %ld without", tg[0], tg[1], tg[2]);
    lc.rank = 0; lc.world = 1;
    lc.rank = 3; lc.world = 3;
    TEST_CHECK(tc, "loader_bad_rank", glm_loader_open(&l, &ds, &lc, &err) == -1, "accepted");
    lc.rank = 0; lc.world = 1;

    /* group_by_length: megabatches of min(103/32, 50) * 8 = 24, sorted longest first; the
     * longest example of all leads the epoch */
    lc.batch_size = 8; lc.group_by_length = 1;
    glm_loader_open(&l, &ds, &lc, &err);
    glm_loader_batch_alloc(l, &b);
    n_seen = 0;
    run_epoch(l, &b, &ds, seen, &n_seen, 0);
    int sorted = 1;
    for (int i = 1; i < n_seen; i++) {
        if (i % 24 == 0 || i == 1) continue; /* megabatch starts; [0] was swapped in */
        sorted &= glm_examples_len(ex, seen[i]) <= glm_examples_len(ex, seen[i - 1]);
    }
    TEST_CHECK(tc, "loader_group_by_length", n_seen == 103 && sorted && glm_examples_len(ex, seen[0]) == ex->summary.longest,
               "sorted %d first %d longest %lld", sorted, glm_examples_len(ex, seen[0]), (long long)ex->summary.longest);
    glm_loader_free(l);
    glm_batch_free(&b);
    lc.group_by_length = 0;

    /* packing: several examples per row, each isolated; the rows are fixed so every epoch has
     * the same number of steps, and every example appears once per epoch */
    lc.packing = 1; lc.max_len = 64; lc.batch_size = 2;
    rc = glm_loader_open(&l, &ds, &lc, &err);
    glm_loader_batch_alloc(l, &b);
    n_seen = 0;
    int s1 = run_epoch(l, &b, &ds, seen, &n_seen, 1);
    int s2 = run_epoch(l, &b, &ds, seen2, &n2, 1);
    memset(cnt, 0, sizeof cnt);
    perm_ok = n_seen == 103;
    for (int i = 0; i < n_seen; i++) cnt[seen[i]]++;
    for (int i = 0; i < 103; i++) perm_ok &= cnt[i] == 1;
    int64_t tokens = 0;
    for (int i = 0; i < 103; i++) tokens += glm_examples_len(ex, i);
    TEST_CHECK(tc, "loader_packing", rc == 0 && s1 > 0 && s1 == s2 && perm_ok && s1 * 2 * 64 >= tokens && s1 < 103 / 2,
               "rc %d (%s) steps %d/%d tokens %lld", rc, err.msg, s1, s2, (long long)tokens);
    glm_loader_free(l);
    glm_batch_free(&b);
    /* rows fill up to max_len, not up to its rounding to pad_multiple */
    lc.max_len = 60; lc.pad_multiple = 16;
    rc = glm_loader_open(&l, &ds, &lc, &err);
    glm_loader_batch_alloc(l, &b);
    int fits = rc == 0, max_fill = 0;
    for (int64_t s = 0; fits && s < glm_loader_steps_per_epoch(l); s++) {
        int64_t exs[256];
        int rows[256], fill[2] = {0, 0};
        fits = glm_loader_next(l, &b, &err) == 0 && b.T % 16 == 0 && b.T <= 64;
        int n = glm_loader_last_examples(l, exs, rows, 256);
        for (int q = 0; q < n; q++) fill[rows[q]] += glm_examples_len(ex, exs[q]);
        for (int r = 0; r < b.B; r++) { fits &= fill[r] <= 60; if (fill[r] > max_fill) max_fill = fill[r]; }
    }
    TEST_CHECK(tc, "loader_packing_fill_limit", fits && max_fill > 48, "fits %d max fill %d", fits, max_fill);
    glm_loader_free(l);
    glm_batch_free(&b);
    lc.pad_multiple = 0;
    lc.max_len = 5;
    rc = glm_loader_open(&l, &ds, &lc, &err);
    TEST_CHECK(tc, "loader_max_len_too_small", rc == -1 && strstr(err.msg, "longest example"), "rc %d (%s)", rc, err.msg);
    glm_examples_free(ex);
}

static void test_packed_row(test_counts *tc) {
    /* two examples in one row: positions restart, kv ranges stay inside each, no cross targets */
    int32_t ids[] = {10, 11, FAKE_GMASK, FAKE_SOP, 12, FAKE_EOP, 20, FAKE_GMASK, FAKE_SOP, 21, FAKE_EOP};
    int32_t lab[] = {-100, -100, -100, FAKE_SOP, 12, FAKE_EOP, -100, -100, FAKE_SOP, 21, FAKE_EOP};
    int seg[] = {6, 5};
    glm_batch b;
    glm_batch_alloc(&b, 1, 13);
    int rc = glm_batch_set_row_packed(&b, 0, ids, lab, seg, 2, FAKE_PAD, FAKE_GMASK, FAKE_MASK, FAKE_SOP);
    glm_batch_count_targets(&b);
    int32_t pos[] = {0, 1, 2, 2, 2, 2, 0, 1, 1, 1, 1, 0, 0};
    int32_t blk[] = {0, 0, 0, 1, 2, 3, 0, 0, 1, 2, 3, 0, 0};
    int32_t lo[] = {0, 0, 0, 0, 0, 0, 6, 6, 6, 6, 6, 11, 11};
    int32_t hi[] = {3, 3, 3, 4, 5, 6, 8, 8, 9, 10, 11, 12, 13};
    int32_t tg[] = {-100, -100, FAKE_SOP, 12, FAKE_EOP, -100, -100, FAKE_SOP, 21, FAKE_EOP, -100, -100, -100};
    TEST_CHECK(tc, "batch_packed_row", rc == 0 && !memcmp(b.pos, pos, sizeof pos) && !memcmp(b.block_pos, blk, sizeof blk) &&
               !memcmp(b.kv_lo, lo, sizeof lo) && !memcmp(b.kv_hi, hi, sizeof hi) && !memcmp(b.targets, tg, sizeof tg) &&
               b.n_targets == 6 && b.ids[11] == FAKE_PAD, "rc %d", rc);
    int seg2[] = {6, 8};
    TEST_CHECK(tc, "batch_packed_too_long", glm_batch_set_row_packed(&b, 0, ids, lab, seg2, 2, 3, FAKE_GMASK, FAKE_MASK, FAKE_SOP) == -1, "accepted");
    glm_batch_free(&b);
}

/* Resumed on another rank count and batch size: the rows consumed say where to go on, and
 * the rest of the epoch is split over the new ranks: every example of the epoch exactly once. */
static void test_remap(test_counts *tc) {
    glm_data_cfg cfg;
    glm_data_cfg_init(&cfg);
    glm_encoder enc = fake_encoder();
    glm_err err = {0};
    glm_examples *ex;
    const char *p = make_data("r.json", 61, 0);
    if (glm_examples_load(&ex, p, &cfg, &enc, &err)) { TEST_FAIL(tc, "loader_remap_setup", "%s", err.msg); return; }
    glm_dataset ds = {ex, NULL, ex->n};
    int cnt[61] = {0}, ok = 1;
    int64_t got[64], consumed = -1;
    /* 3 ranks x 4 rows for 2 batches each (24 rows of the order) */
    for (int r = 0; r < 3; r++) {
        glm_loader_cfg lc;
        glm_loader_cfg_init(&lc);
        lc.batch_size = 4; lc.rank = r; lc.world = 3;
        glm_loader *l;
        glm_batch b;
        ok &= glm_loader_open(&l, &ds, &lc, &err) == 0;
        glm_loader_batch_alloc(l, &b);
        for (int s = 0; s < 2; s++) {
            ok &= glm_loader_next(l, &b, &err) == 0;
            int n = glm_loader_last_examples(l, got, NULL, 64);
            for (int i = 0; i < n; i++) cnt[got[i]]++;
        }
        if (r == 0) consumed = glm_loader_rows_consumed(l);
        glm_batch_free(&b);
        glm_loader_free(l);
    }
    /* ... the rest of epoch 0 on 2 ranks x 5 rows */
    int64_t steps_left[2] = {0, 0};
    for (int r = 0; r < 2; r++) {
        glm_loader_cfg lc;
        glm_loader_cfg_init(&lc);
        lc.batch_size = 5; lc.rank = r; lc.world = 2;
        glm_loader *l;
        glm_batch b;
        ok &= glm_loader_open(&l, &ds, &lc, &err) == 0 && glm_loader_seek_rows(l, 0, consumed, &err) == 0;
        glm_loader_batch_alloc(l, &b);
        steps_left[r] = glm_loader_steps_left(l);
        while (glm_loader_cursor(l).epoch == 0) {
            ok &= glm_loader_next(l, &b, &err) == 0;
            int n = glm_loader_last_examples(l, got, NULL, 64);
            /* the row that pads the last batch (37 rows over 2 ranks) repeats one: count it once */
            for (int i = 0; i < n; i++) cnt[got[i]] += !(r == 1 && glm_loader_cursor(l).epoch == 1 && i == n - 1 && 37 % 2);
        }
        glm_batch_free(&b);
        glm_loader_free(l);
    }
    int once = 1;
    for (int i = 0; i < 61; i++) once &= cnt[i] == 1;
    TEST_CHECK(tc, "loader_remap_rows_consumed", consumed == 24, "consumed %lld", (long long)consumed);
    TEST_CHECK(tc, "loader_remap_every_example_once", ok && once, "%s", err.msg);
    TEST_CHECK(tc, "loader_remap_shorter_epoch", steps_left[0] == 4 && steps_left[1] == 4, "steps left %lld %lld",
               (long long)steps_left[0], (long long)steps_left[1]);
    glm_examples_free(ex);
}

int main(void) {
    test_counts tc = {0};
    test_dir_make();
    test_cache(&tc);
    test_data_load(&tc);
    test_packed_row(&tc);
    test_loader(&tc);
    test_remap(&tc);
    test_dir_remove();
    TEST_EXIT(&tc);
}
