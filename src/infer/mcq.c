/* Multiple-choice benchmarks as LLaMA-Factory scores them (mcq.h): the task's files, each item's
 * conversation, and the letters' logits at the end of its chat prompt. */
#include "infer/mcq.h"
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/fileutil.h"
#include "core/log.h"
#include "core/strbuf.h"
#include "data/batch.h"
#include "data/reader.h"
#include "infer/chat.h"

const char *const glm_mcq_categories[GLM_MCQ_CATEGORIES] = {"Average", "STEM", "Social Sciences", "Humanities", "Other"};

/* ---------------------------------------------------------------- a cell as pandas reads it */

/* pandas' default na_values: such a cell is NaN, which the prompt shows as "nan" */
static int pandas_na(const char *s) {
    static const char *const na[] = {"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND",
                                     "1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"};
    for (size_t i = 0; i < sizeof na / sizeof na[0]; i++)
        if (!strcmp(s, na[i])) return 1;
    return 0;
}
static int is_int_text(const char *s) {
    if (*s == '+' || *s == '-') s++;
    if (!*s) return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return 0;
    return 1;
}
static int is_float_text(const char *s, double *v) {
    if (!*s || strchr(s, 'x') || strchr(s, 'X') || strchr(s, ' ') || strchr(s, '_')) return 0;
    char *end;
    *v = strtod(s, &end);
    if (*end) return 0;
    /* strtod also takes nan(...) and words pandas does not: the only words kept are infinities */
    int word = 0;
    for (const char *p = s; *p; p++) word |= ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')) && *p != 'e' && *p != 'E';
    return word ? isinf(*v) : 1;
}
static int is_bool_text(const char *s) {
    return !strcmp(s, "True") || !strcmp(s, "False") || !strcmp(s, "true") || !strcmp(s, "false") || !strcmp(s, "TRUE") ||
           !strcmp(s, "FALSE");
}
/* Python's repr of a float: the shortest digits that read back, fixed notation for exponents in
 * [-4, 16) with ".0" on whole numbers, else d.ddde+XX */
static void py_float_repr(double v, char *out, size_t n) {
    if (isnan(v)) { snprintf(out, n, "nan"); return; }
    if (isinf(v)) { snprintf(out, n, v < 0 ? "-inf" : "inf"); return; }
    char d[40];
    int p = 1;
    for (; p <= 17; p++) {
        snprintf(d, sizeof d, "%.*e", p - 1, v);
        if (strtod(d, NULL) == v) break;
    }
    char *e = strchr(d, 'e');
    int exp10 = atoi(e + 1);
    *e = 0;
    char digits[24]; /* the significant digits alone */
    size_t k = 0;
    for (const char *c = d; *c; c++)
        if (*c >= '0' && *c <= '9') digits[k++] = *c;
    digits[k] = 0;
    while (k > 1 && digits[k - 1] == '0') digits[--k] = 0;
    const char *sign = v < 0 ? "-" : "";
    if (exp10 >= -4 && exp10 < 16) {
        char buf[64];
        size_t u = 0;
        if (exp10 < 0) {
            u += (size_t)snprintf(buf + u, sizeof buf - u, "0.");
            for (int i = 0; i < -exp10 - 1; i++) buf[u++] = '0';
            u += (size_t)snprintf(buf + u, sizeof buf - u, "%s", digits);
        } else {
            for (int i = 0; i <= exp10; i++) buf[u++] = i < (int)k ? digits[i] : '0';
            buf[u++] = '.';
            if ((int)k > exp10 + 1) u += (size_t)snprintf(buf + u, sizeof buf - u, "%s", digits + exp10 + 1);
            else buf[u++] = '0';
        }
        buf[u] = 0;
        size_t w = strlen(sign);
        if (w + u + 1 <= n) { memcpy(out, sign, w); memcpy(out + w, buf, u + 1); }
        else if (n) out[0] = 0;
    } else {
        snprintf(out, n, "%s%c%s%se%c%02d", sign, digits[0], k > 1 ? "." : "", k > 1 ? digits + 1 : "",
                 exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
}

/* pandas.read_csv's column types, as str() of its values shows them: a column of integers (no
 * empty cell) stays as written less a '+'; a column of numbers (empty cells allowed) becomes
 * floats (Python's repr: "2.0"); a column of True/False words becomes booleans; otherwise the
 * text, with its NA words as "nan". cells [n] of one column are rewritten in place. */
static void pandas_column(char **cells, int n) {
    int ints = 1, floats = 1, bools = 1, any = 0;
    for (int i = 0; i < n; i++) {
        const char *s = cells[i];
        double v;
        if (pandas_na(s)) { ints = bools = 0; continue; }
        any = 1;
        if (!is_int_text(s)) ints = 0;
        if (!is_float_text(s, &v)) floats = 0;
        if (!is_bool_text(s)) bools = 0;
    }
    if (!any) ints = bools = floats = 0; /* all NaN: floats of nan either way */
    for (int i = 0; i < n; i++) {
        char buf[64];
        const char *s = cells[i];
        double v = NAN;
        if (ints) snprintf(buf, sizeof buf, "%lld", strtoll(s, NULL, 10));
        else if (bools) snprintf(buf, sizeof buf, "%s", s[0] == 'T' || s[0] == 't' ? "True" : "False");
        else if (floats || pandas_na(s)) {
            if (!pandas_na(s)) is_float_text(s, &v);
            py_float_repr(v, buf, sizeof buf);
        } else continue;
        free(cells[i]);
        cells[i] = glm_strdup(buf);
    }
}

/* ---------------------------------------------------------------- files */

static long line_of(const char *buf, size_t at) {
    long l = 1;
    for (size_t i = 0; i < at; i++) l += buf[i] == '\n';
    return l;
}

/* The items of one CSV file: header = 0 (MMLU's: six positional columns), 1 (named columns), or
 * 2 (named, behind CMMLU's index column). */
static int read_items(const char *path, int header, glm_mcq_item **out, int *n_out, glm_err *err) {
    size_t len;
    char *buf = glm_read_file(path, &len, err);
    if (!buf) return -1;
    size_t pos = len >= 3 && !memcmp(buf, "\xEF\xBB\xBF", 3) ? 3 : 0, bad;
    const char *why;
    glm_csv_fields f = {0};
    int col[6] = {0, 1, 2, 3, 4, 5}, ncols = 6, rc = 0; /* question, A, B, C, D, answer */
    if (header) {
        size_t at = pos;
        int got = glm_csv_row(buf, len, &pos, ',', &f, &bad, &why);
        if (got <= 0) {
            rc = got < 0 ? glm_fail(err, "%s:%ld: %s", path, line_of(buf, bad), why) : glm_fail(err, "%s: no header row", path);
            goto done;
        }
        static const char *const want[6][2] = {{"question", "Question"}, {"A", "A"}, {"B", "B"}, {"C", "C"},
                                               {"D", "D"}, {"answer", "Answer"}};
        ncols = f.n;
        for (int k = 0; k < 6; k++) {
            col[k] = -1;
            for (int j = header == 2 ? 1 : 0; j < f.n; j++)
                if (!strcmp(f.v[j], want[k][0]) || !strcmp(f.v[j], want[k][1])) col[k] = j;
            if (col[k] < 0 && k < 5) {
                rc = glm_fail(err, "%s:%ld: no column \"%s\" in the header", path, line_of(buf, at), want[k][0]);
                glm_hint(err, "a benchmark file's header names question, A, B, C, D and answer (as C-Eval's and CMMLU's)");
                goto done;
            }
        }
    }
    /* the rows, then each column as pandas types it */
    char ***rows = NULL;
    int n = 0, cap = 0;
    for (;;) {
        size_t at = pos;
        int got = glm_csv_row(buf, len, &pos, ',', &f, &bad, &why);
        if (got < 0) { rc = glm_fail(err, "%s:%ld: %s", path, line_of(buf, bad), why); break; }
        if (got == 0) break;
        if (f.n != ncols) {
            rc = glm_fail(err, "%s:%ld: %d fields where %s has %d", path, line_of(buf, at), f.n,
                          header ? "the header" : "an MMLU row (question, A, B, C, D, answer)", ncols);
            break;
        }
        if (n == cap) rows = glm_realloc(rows, sizeof *rows * (size_t)(cap = cap ? 2 * cap : 64));
        rows[n] = glm_malloc(sizeof(char *) * 6);
        for (int k = 0; k < 6; k++) rows[n][k] = glm_strdup(col[k] >= 0 ? f.v[col[k]] : "");
        n++;
    }
    if (rc == 0) {
        char **cells = glm_malloc(sizeof(char *) * (size_t)(n ? n : 1));
        for (int k = 0; k < 5; k++) { /* the text the prompt shows; the answer stays a letter */
            for (int i = 0; i < n; i++) cells[i] = rows[i][k];
            pandas_column(cells, n);
            for (int i = 0; i < n; i++) rows[i][k] = cells[i];
        }
        free(cells);
        *out = glm_calloc((size_t)(n ? n : 1), sizeof **out);
        for (int i = 0; i < n; i++) {
            glm_mcq_item *it = &(*out)[i];
            it->question = rows[i][0];
            for (int k = 0; k < 4; k++) it->choice[k] = rows[i][1 + k];
            it->answer = rows[i][5];
            free(rows[i]);
        }
        *n_out = n;
    } else {
        for (int i = 0; i < n; i++) {
            for (int k = 0; k < 6; k++) free(rows[i][k]);
            free(rows[i]);
        }
    }
    free(rows);
done:
    glm_csv_fields_free(&f);
    free(buf);
    return rc;
}

/* LLaMA-Factory's split names and the folders its loading scripts read */
static const char *split_folder(const char *split) {
    return !strcmp(split, "train") ? "dev" : !strcmp(split, "validation") ? "val" : !strcmp(split, "test") ? "test" : NULL;
}

static void csv_path(char *out, size_t n, const char *dir, const char *task, const char *folder, const char *subject) {
    if (!strcmp(task, "mmlu")) snprintf(out, n, "%s/data/%s/%s_%s.csv", dir, folder, subject, folder);
    else if (!strcmp(task, "cmmlu")) snprintf(out, n, "%s/%s/%s.csv", dir, folder, subject);
    else snprintf(out, n, "%s/%s/%s_%s.csv", dir, folder, subject, folder);
}

static int load_split(const char *dir, const char *task, const char *folder, const char *subject, glm_mcq_item **items,
                      int *n, glm_err *err) {
    char path[4096], zip[4200];
    csv_path(path, sizeof path, dir, task, folder, subject);
    if (!glm_is_file(path)) {
        snprintf(zip, sizeof zip, "%s/%s.zip", dir, task);
        glm_fail(err, "%s: no such file (subject %s of %s)", path, subject, task);
        if (glm_is_file(zip)) return glm_hint(err, "the task's files are still in %s: unzip it there (cd %s && unzip %s.zip)", zip, dir, task);
        if (!strcmp(task, "cmmlu") && !strcmp(folder, "val"))
            return glm_hint(err, "CMMLU has no validation split: use --task cmmlu_test");
        return glm_hint(err, "--task_dir is LLaMA-Factory's evaluation/ folder (each task's mapping.json and its unzipped files)");
    }
    return read_items(path, !strcmp(task, "mmlu") ? 0 : !strcmp(task, "cmmlu") ? 2 : 1, items, n, err);
}

int glm_mcq_task_load(glm_mcq_task *t, const char *task_dir, const char *task, glm_err *err) {
    *t = (glm_mcq_task){0};
    const char *us = strchr(task, '_');
    if (!us || us == task || strlen(us + 1) >= sizeof t->split || (size_t)(us - task) >= sizeof t->name)
        return glm_fail(err, "--task %s: a task is NAME_SPLIT", task), glm_hint(err, "e.g. mmlu_test, ceval_validation, cmmlu_test");
    snprintf(t->name, sizeof t->name, "%.*s", (int)(us - task), task);
    snprintf(t->split, sizeof t->split, "%s", us + 1);
    const char *folder = split_folder(t->split);
    if (!folder)
        return glm_fail(err, "--task %s: the split \"%s\" is not one of train, validation, test", task, t->split);
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/%s", task_dir, t->name);
    snprintf(path, sizeof path, "%s/mapping.json", dir);
    size_t len;
    glm_err e2;
    char *text = glm_read_file(path, &len, &e2);
    if (!text)
        return glm_fail(err, "--task %s: %s cannot be read (%s)", task, path, e2.msg),
               glm_hint(err, "--task_dir is LLaMA-Factory's evaluation/ folder, which holds mmlu/, ceval/ and cmmlu/ with their mapping.json");
    cJSON *map = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(map);
        return glm_fail(err, "%s: not a JSON object of subjects", path);
    }
    int n = cJSON_GetArraySize(map), rc = 0;
    t->s = glm_calloc((size_t)(n ? n : 1), sizeof *t->s);
    const cJSON *e;
    cJSON_ArrayForEach(e, map) {
        glm_mcq_subject *s = &t->s[t->n];
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name"), *cat = cJSON_GetObjectItemCaseSensitive(e, "category");
        if (!cJSON_IsString(name) || !cJSON_IsString(cat)) {
            rc = glm_fail(err, "%s: subject \"%s\" lacks its \"name\" or \"category\"", path, e->string);
            break;
        }
        int known = 0;
        for (int k = 1; k < GLM_MCQ_CATEGORIES; k++) known |= !strcmp(cat->valuestring, glm_mcq_categories[k]);
        if (!known) {
            rc = glm_fail(err, "%s: subject \"%s\" has category \"%s\"", path, e->string, cat->valuestring);
            glm_hint(err, "LLaMA-Factory's categories: STEM, Social Sciences, Humanities, Other");
            break;
        }
        snprintf(s->key, sizeof s->key, "%s", e->string);
        snprintf(s->name, sizeof s->name, "%s", name->valuestring);
        snprintf(s->category, sizeof s->category, "%s", cat->valuestring);
        t->n++;
        if ((rc = load_split(dir, t->name, "dev", s->key, &s->dev, &s->n_dev, err)) ||
            (rc = load_split(dir, t->name, folder, s->key, &s->items, &s->n_items, err)))
            break;
    }
    cJSON_Delete(map);
    if (rc == 0 && t->n == 0) rc = glm_fail(err, "%s lists no subject", path);
    if (rc) glm_mcq_task_free(t);
    return rc;
}

static void free_items(glm_mcq_item *it, int n) {
    for (int i = 0; i < n; i++) {
        free(it[i].question);
        for (int k = 0; k < 4; k++) free(it[i].choice[k]);
        free(it[i].answer);
    }
    free(it);
}

void glm_mcq_task_free(glm_mcq_task *t) {
    for (int i = 0; i < t->n; i++) {
        free_items(t->s[i].dev, t->s[i].n_dev);
        free_items(t->s[i].items, t->s[i].n_items);
    }
    free(t->s);
    *t = (glm_mcq_task){0};
}

/* ---------------------------------------------------------------- prompts */

/* LLaMA-Factory's EvalTemplate._parse_example: the question, each choice, the answer cue */
static char *item_prompt(const glm_mcq_item *it, const char *lang, const char *system) {
    glm_strbuf b = {0};
    glm_strbuf_str(&b, system);
    glm_strbuf_str(&b, it->question);
    for (int k = 0; k < 4; k++) {
        char head[8];
        snprintf(head, sizeof head, "\n%c. ", 'A' + k);
        glm_strbuf_str(&b, head);
        glm_strbuf_str(&b, it->choice[k]);
    }
    glm_strbuf_str(&b, strcmp(lang, "zh") ? "\nAnswer:" : "\n答案：");
    return b.s;
}

char *glm_mcq_conversation(const glm_mcq_subject *s, int i, const char *lang, int n_shot, char ***hist, int *n_hist) {
    char system[512];
    if (strcmp(lang, "zh")) snprintf(system, sizeof system, "The following are multiple choice questions (with answers) about %s.\n\n", s->name);
    else snprintf(system, sizeof system, "以下是中国关于%s考试的单项选择题，请选出其中的正确答案。\n\n", s->name);
    int k = n_shot < s->n_dev ? n_shot : s->n_dev;
    *hist = glm_malloc(sizeof(char *) * 2 * (size_t)(k ? k : 1));
    for (int j = 0; j < k; j++) {
        (*hist)[2 * j] = item_prompt(&s->dev[j], lang, j == 0 ? system : "");
        (*hist)[2 * j + 1] = glm_strdup(s->dev[j].answer);
    }
    *n_hist = k;
    return item_prompt(&s->items[i], lang, k == 0 ? system : "");
}

/* ---------------------------------------------------------------- scoring */

int glm_mcq_run(glm_model *m, const glm_tokenizer *tok, const glm_mcq_task *t, const char *lang, int n_shot, int batch,
                int progress, glm_mcq_result *r, glm_err *err) {
    *r = (glm_mcq_result){0};
    int32_t letters[4];
    for (int k = 0; k < 4; k++) { /* tokenizer.encode(letter, add_special_tokens=False)[-1] */
        char s[2] = {(char)('A' + k), 0};
        glm_ids ids = {0};
        if (glm_tokenizer_encode(tok, s, 1, &ids, err) || ids.n == 0) {
            glm_ids_free(&ids);
            return ids.n ? -1 : glm_fail(err, "the tokenizer encodes \"%s\" to no token", s);
        }
        letters[k] = ids.data[ids.n - 1];
        glm_ids_free(&ids);
    }
    long total = 0;
    for (int i = 0; i < t->n; i++) total += t->s[i].n_items;
    r->preds = glm_calloc((size_t)total + 1, 1);
    glm_special_ids sp = glm_tokenizer_specials(tok);
    const glm_config *c = &m->cfg;
    long at = 0;
    int rc = 0;
    glm_ids *p = glm_calloc((size_t)batch, sizeof *p);
    float *logits = glm_malloc(sizeof(float) * 4 * (size_t)batch);
    for (int si = 0; si < t->n && rc == 0; si++) {
        const glm_mcq_subject *s = &t->s[si];
        for (int i0 = 0; i0 < s->n_items && rc == 0; i0 += batch) {
            int B = s->n_items - i0 < batch ? s->n_items - i0 : batch, T = 0;
            for (int b = 0; b < B && rc == 0; b++) {
                char **hist;
                int n_hist, dropped = 0;
                char *q = glm_mcq_conversation(s, i0 + b, lang, n_shot, &hist, &n_hist);
                p[b].n = 0;
                rc = glm_chat_inputs_sys(tok, c, NULL, q, (const char *const *)hist, n_hist, 1 << 30, &p[b], &dropped, NULL, err);
                for (int j = 0; j < 2 * n_hist; j++) free(hist[j]);
                free(hist);
                free(q);
                if (p[b].n + 1 > T) T = p[b].n + 1;
            }
            if (rc) break;
            if (T > c->max_sequence_length) {
                rc = glm_fail(err, "%s, item %d: the prompt is %d tokens, more than the model's %d", s->key, i0, T - 1,
                              c->max_sequence_length);
                glm_hint(err, "use fewer examples before each question (--n_shot)");
                break;
            }
            glm_batch bt;
            glm_batch_alloc(&bt, B, T);
            for (int b = 0; b < B; b++) { /* the prompt and one more token: its label marks the prompt's last position */
                int n = p[b].n;
                int32_t *ids = glm_malloc(sizeof(int32_t) * (size_t)(n + 1)), *lab = glm_malloc(sizeof(int32_t) * (size_t)(n + 1));
                memcpy(ids, p[b].data, sizeof(int32_t) * (size_t)n);
                for (int j = 0; j < n; j++) lab[j] = -100;
                ids[n] = lab[n] = letters[0];
                glm_batch_set_row(&bt, b, ids, lab, n + 1, sp.pad, sp.gmask, sp.mask, sp.sop);
                free(ids);
                free(lab);
            }
            glm_batch_count_targets(&bt);
            glm_forward_logits_at(m, &bt, letters, 4, logits);
            glm_batch_free(&bt);
            for (int b = 0; b < B; b++) {
                int best = 0;
                for (int k = 1; k < 4; k++)
                    if (logits[4 * b + k] > logits[4 * b + best]) best = k; /* the first of equals, as torch.argmax */
                char pred = (char)('A' + best);
                r->preds[at + i0 + b] = pred;
                int right = s->items[i0 + b].answer[0] == pred && !s->items[i0 + b].answer[1];
                for (int k = 1; k < GLM_MCQ_CATEGORIES; k++)
                    if (!strcmp(s->category, glm_mcq_categories[k])) { r->right[k] += right; r->total[k]++; }
                r->right[0] += right;
                r->total[0]++;
            }
        }
        at += s->n_items;
        if (progress && rc == 0) glm_info("%s (%d/%d): %d items", s->name, si + 1, t->n, s->n_items);
    }
    for (int b = 0; b < batch; b++) glm_ids_free(&p[b]);
    free(p);
    free(logits);
    return rc;
}

void glm_mcq_result_free(glm_mcq_result *r) {
    free(r->preds);
    *r = (glm_mcq_result){0};
}
