/* `glmtrain eval`: a model's (and adapter's) accuracy on MMLU, C-Eval or CMMLU, as LLaMA-Factory's
 * `llamafactory-cli eval` measures it (infer/mcq.h): the score of each category printed as it
 * prints them, and with --save_dir its results.json (each subject's predicted letters) and
 * results.log (those lines). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/commands.h"
#include "cli/gen_common.h"
#include "core/fileutil.h"
#include "core/log.h"
#include "core/strbuf.h"
#include "infer/mcq.h"

static const glm_flag eval_flags[] = {
    GEN_COMMON_FLAGS,
    GEN_F(task, ARG_STR, NULL, "LLaMA-Factory's: NAME_SPLIT, e.g. mmlu_test, ceval_validation, cmmlu_test"),
    GEN_F(task_dir, ARG_STR, "evaluation", "LLaMA-Factory's evaluation/ folder: NAME/mapping.json and NAME's unzipped CSV files"),
    {"lang", ARG_STR, offsetof(gen_args, lang), "en", "the prompt's language (LLaMA-Factory's eval templates)", "en|zh", NULL},
    GEN_F(n_shot, ARG_INT, "5", "examples before each question (the first of the subject's dev split)"),
    GEN_F(batch_size, ARG_INT, "4", "questions in one forward pass"),
    GEN_F(save_dir, ARG_STR, NULL, "write results.json (every prediction) and results.log (the scores) into this new folder"),
};
static const int n_eval_flags = sizeof eval_flags / sizeof eval_flags[0];

/* LLaMA-Factory's score lines: "{:>15}: {:.2f}" of each category that has items */
static char *score_lines(const glm_mcq_result *r) {
    glm_strbuf b = {0};
    for (int k = 0; k < GLM_MCQ_CATEGORIES; k++) {
        if (!r->total[k]) continue;
        char line[96];
        snprintf(line, sizeof line, "%s%15s: %.2f", b.n ? "\n" : "", glm_mcq_categories[k], 100.0 * r->right[k] / r->total[k]);
        glm_strbuf_str(&b, line);
    }
    return b.s ? b.s : glm_strdup("");
}

/* results.json as json.dump(results, indent=2) writes it: {subject: {"0": "A", ...}} */
static char *results_json(const glm_mcq_task *t, const glm_mcq_result *r) {
    glm_strbuf b = {0};
    glm_strbuf_str(&b, "{");
    long at = 0;
    for (int i = 0; i < t->n; i++) {
        const glm_mcq_subject *s = &t->s[i];
        char line[256];
        snprintf(line, sizeof line, "%s\n  \"%s\": {", i ? "," : "", s->key);
        glm_strbuf_str(&b, line);
        for (int j = 0; j < s->n_items; j++) {
            snprintf(line, sizeof line, "%s\n    \"%d\": \"%c\"", j ? "," : "", j, r->preds[at + j]);
            glm_strbuf_str(&b, line);
        }
        glm_strbuf_str(&b, s->n_items ? "\n  }" : "}");
        at += s->n_items;
    }
    glm_strbuf_str(&b, t->n ? "\n}" : "}");
    return b.s;
}

static int check(const gen_args *a, glm_err *err) {
    if (!a->task) return glm_fail(err, "--task is required"), glm_hint(err, "e.g. --task mmlu_test (or ceval_validation, cmmlu_test)");
    if (a->n_shot < 0) return glm_fail(err, "--n_shot %d: must be 0 or more", a->n_shot);
    if (a->batch_size < 1) return glm_fail(err, "--batch_size %d: must be at least 1", a->batch_size);
    if (a->device_map)
        return glm_fail(err, "--device_map with eval: the benchmark runs on one device"),
               glm_hint(err, "drop --device_map (a quantized base, --quantization_bit 4, fits small cards)");
    if (a->save_dir && (glm_is_dir(a->save_dir) || glm_is_file(a->save_dir)))
        return glm_fail(err, "--save_dir %s exists", a->save_dir), glm_hint(err, "give a new folder (LLaMA-Factory refuses an existing one too)");
    return 0;
}

int glm_cmd_eval(int argc, char **argv) {
    gen_args a;
    glm_err err = {0};
    gen_session s = {0};
    glm_mcq_task task = {0};
    glm_mcq_result r = {0};
    int rc = gen_parse(eval_flags, n_eval_flags, &a, argc, argv, "eval", &err);
    if (rc == 1) { gen_args_free(eval_flags, n_eval_flags, &a); return 0; }
    /* the task's files first: a wrong path fails before the weights are read */
    if (!rc) rc = check(&a, &err) || glm_mcq_task_load(&task, a.task_dir, a.task, &err) ? -1 : 0;
    if (!rc) rc = gen_open(&s, &a, &err);
    if (!rc) {
        long n = 0, unanswered = 0;
        for (int i = 0; i < task.n; i++)
            for (int j = 0; j < task.s[i].n_items; j++, n++) unanswered += !task.s[i].items[j].answer[0];
        glm_info("%s: %d subjects, %ld questions (%s split), %d-shot, lang %s", task.name, task.n, n, task.split, a.n_shot, a.lang);
        if (unanswered)
            glm_warn("%ld questions of %s have no answer in the files (C-Eval's test split keeps them secret): they count as wrong",
                     unanswered, a.task);
        rc = glm_mcq_run(&s.m, s.tok, &task, a.lang, a.n_shot, a.batch_size, 1, &r, &err);
    }
    if (!rc) {
        char *lines = score_lines(&r);
        printf("%s\n", lines);
        if (a.save_dir) {
            char path[4096];
            char *json = results_json(&task, &r);
            glm_path_join(path, sizeof path, a.save_dir, "results.json");
            rc = glm_mkdirs(a.save_dir, &err) || glm_write_file_atomic(path, json, strlen(json), &err) ? -1 : 0;
            glm_path_join(path, sizeof path, a.save_dir, "results.log");
            if (!rc) rc = glm_write_file_atomic(path, lines, strlen(lines), &err);
            free(json);
        }
        free(lines);
    }
    if (rc) glm_err_print(&err);
    glm_mcq_result_free(&r);
    glm_mcq_task_free(&task);
    gen_close(&s);
    gen_args_free(eval_flags, n_eval_flags, &a);
    return rc ? 1 : 0;
}
