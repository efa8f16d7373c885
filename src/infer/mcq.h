/* Multiple-choice benchmarks (MMLU, C-Eval, CMMLU) as LLaMA-Factory's `llamafactory-cli eval`
 * scores them (its eval/evaluator.py and eval/template.py), on the files of its evaluation/ folder:
 *
 *  task "NAME_SPLIT" (mmlu_test, ceval_validation, cmmlu_test): TASK_DIR/NAME/mapping.json lists
 *  the subjects ({"subject": {"name": ..., "category": "STEM" | "Social Sciences" | "Humanities" |
 *  "Other"}}, in order) and each subject's CSV files, extracted from NAME.zip:
 *    mmlu   data/{dev,val,test}/SUBJECT_{dev,val,test}.csv, no header: question, A, B, C, D, answer
 *    cmmlu  {dev,test}/SUBJECT.csv, a header (an index column, Question, A, B, C, D, Answer)
 *    other  {dev,val,test}/SUBJECT_{dev,val,test}.csv with a header naming question, A, B, C, D and
 *           answer (C-Eval's layout; its test split has no answers)
 *  (splits: train = dev, validation = val, test = test).
 *
 *  An item's prompt: question + "\nA. ..." for each choice + "\nAnswer:" (lang en) or "\n答案："
 *  (zh); the first n_shot items of the subject's dev split come first as earlier rounds of the
 *  conversation (user: prompt, assistant: the answer letter), the first round (or the item itself
 *  with n_shot 0) behind the system line "The following are multiple choice questions (with
 *  answers) about SUBJECT.\n\n" (zh: "以下是中国关于SUBJECT考试的单项选择题，请选出其中的正确答案。\n\n").
 *  The model's own chat prompt of that conversation (infer/chat.h) is scored: the prediction is the
 *  letter whose token (the last of encode(letter)) has the highest logit at the prompt's end.
 *  LLaMA-Factory draws the n_shot examples at random for each item; the first n_shot of the dev
 *  split are the MMLU and C-Eval papers' own choice, and the same on every run. */
#ifndef GLM_INFER_MCQ_H
#define GLM_INFER_MCQ_H
#include "core/err.h"
#include "model/glm.h"
#include "tokenizer/tokenizer.h"

typedef struct glm_mcq_item {
    char *question, *choice[4], *answer; /* answer: "A".."D", or "" where the split has none */
} glm_mcq_item;

typedef struct glm_mcq_subject {
    char key[160], name[256], category[64];
    glm_mcq_item *dev, *items; /* the few-shot pool (dev split) and the scored split */
    int n_dev, n_items;
} glm_mcq_subject;

typedef struct glm_mcq_task {
    char name[64], split[32];
    glm_mcq_subject *s;
    int n;
} glm_mcq_task;

/* Reads task ("mmlu_test") from task_dir (LLaMA-Factory's evaluation/ folder); errors name the
 * file and line, and say to unzip NAME.zip where only that is there. */
int glm_mcq_task_load(glm_mcq_task *t, const char *task_dir, const char *task, glm_err *err);
void glm_mcq_task_free(glm_mcq_task *t);

/* Item i of subject s as the conversation LLaMA-Factory's EvalTemplate makes (lang "en" or "zh"):
 * 2 * *n_hist strings (question, answer of each shot) into *hist and the query; all malloc'd. */
char *glm_mcq_conversation(const glm_mcq_subject *s, int i, const char *lang, int n_shot, char ***hist, int *n_hist);

/* The categories LLaMA-Factory reports, in its order (SUBJECTS): Average, STEM, Social Sciences,
 * Humanities, Other. */
#define GLM_MCQ_CATEGORIES 5
extern const char *const glm_mcq_categories[GLM_MCQ_CATEGORIES];

/* Scores every item: preds [sum of n_items] ('A'..'D', subject after subject) and the counts of
 * right answers and of items of each category (glm_mcq_categories order). batch: prompts a
 * forward pass; progress: a line per subject on stderr when set. */
typedef struct glm_mcq_result {
    char *preds;
    long right[GLM_MCQ_CATEGORIES], total[GLM_MCQ_CATEGORIES];
} glm_mcq_result;
int glm_mcq_run(glm_model *m, const glm_tokenizer *tok, const glm_mcq_task *t, const char *lang, int n_shot, int batch,
                int progress, glm_mcq_result *r, glm_err *err);
void glm_mcq_result_free(glm_mcq_result *r);

#endif
