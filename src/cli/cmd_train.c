/* `glmtrain train`: parses the Hugging Face-named flags and runs the training loop; with
 * --do_predict (THUDM ptuning's evaluate.sh) it then answers --test_file through `glmtrain
 * generate`, as main.py's trainer.predict does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/commands.h"
#include "core/fileutil.h"
#include "core/log.h"
#include "model/config.h"
#include "parallel/comm/dist.h"
#include "parallel/launch.h"
#include "train/train.h"

/* Whether this process is the job's first rank (or the only one): the one that predicts. */
static int first_rank(glm_err *err) {
    glm_dist d;
    return glm_dist_from_env(&d, err) ? -1 : d.rank == 0;
}

typedef struct { char *v[64]; int n; } argv_list;
static void put(argv_list *l, const char *flag, const char *value) {
    if (!value) return;
    GLM_ASSERT(l->n + 2 <= 64);
    l->v[l->n++] = (char *)flag;
    l->v[l->n++] = (char *)value;
}

/* --do_predict: `glmtrain generate` over --test_file with main.py's trainer.predict settings
 * (do_sample, top_p 0.7, temperature 0.95; max_length 512 for ChatGLM-6B, max_source_length +
 * max_target_length + 1 for the ChatGLM2 family, as each ptuning/main.py), on the model just
 * trained (the final model, or the base with the adapter it wrote) or, predicting alone, on
 * --model_name_or_path with --ptuning_checkpoint / --adapter_name_or_path. Writes
 * generated_predictions.txt ({"labels", "predict"} and the prompt, a line each) and
 * predict_results.json (predict_bleu-4, predict_rouge-1/2/l) into --output_dir. */
static int predict(const glm_train_args *a, glm_err *err) {
    glm_config c;
    if (glm_config_load(&c, a->model_name_or_path ? a->model_name_or_path : a->init_from_config, err)) return -1;
    const char *base = a->model_name_or_path, *adapter = a->ptuning_checkpoint ? a->ptuning_checkpoint : a->adapter_name_or_path;
    if (a->do_train) { /* what trained, by the rule training used: an adapter's output folder holds the adapter alone */
        glm_peft p;
        if (glm_train_peft(a, &c, &p, err)) return -1;
        int adapted = p.kind == GLM_FT_LORA || p.kind == GLM_FT_PTUNING;
        base = adapted ? a->model_name_or_path : a->output_dir;
        adapter = adapted ? a->output_dir : NULL;
    }
    char max_length[32], seed[32], bs[32], src_len[32], samples[32], out[4096], metrics[4096];
    snprintf(max_length, sizeof max_length, "%d", c.family == GLM_FAMILY_GLM2 ? a->max_source_length + a->max_target_length + 1 : 512);
    snprintf(seed, sizeof seed, "%d", a->seed);
    snprintf(bs, sizeof bs, "%d", a->per_device_eval_batch_size);
    snprintf(src_len, sizeof src_len, "%d", a->max_source_length);
    snprintf(samples, sizeof samples, "%d", a->max_predict_samples);
    if (glm_mkdirs(a->output_dir, err)) return -1;
    glm_path_join(out, sizeof out, a->output_dir, "generated_predictions.txt");
    glm_path_join(metrics, sizeof metrics, a->output_dir, "predict_results.json");
    argv_list l = {0};
    put(&l, "--model_name_or_path", base);
    put(&l, "--adapter", adapter);
    put(&l, "--tokenizer_name", a->tokenizer_name);
    put(&l, "--input_file", a->test_file);
    put(&l, "--output_file", out);
    put(&l, "--metrics_file", metrics);
    put(&l, "--do_sample", "true");
    put(&l, "--top_p", "0.7");
    put(&l, "--temperature", "0.95");
    put(&l, "--max_length", max_length);
    put(&l, "--seed", seed);
    put(&l, "--per_device_eval_batch_size", bs);
    put(&l, "--max_source_length", src_len);
    if (a->max_predict_samples > 0) put(&l, "--max_predict_samples", samples);
    put(&l, "--data_format", a->data_format);
    put(&l, "--prompt_column", a->prompt_column);
    put(&l, "--response_column", a->response_column);
    put(&l, "--history_column", a->history_column);
    put(&l, "--prompt_template", a->prompt_template);
    put(&l, "--history_template", a->history_template);
    put(&l, "--source_prefix", a->source_prefix);
    put(&l, "--device", a->device);
    put(&l, "--dtype", a->fp32 ? "float32" : a->fp16 ? "float16" : a->bf16 ? "bfloat16" : NULL);
    char qb[16];
    snprintf(qb, sizeof qb, "%d", a->quantization_bit);
    if (a->quantization_bit) put(&l, "--quantization_bit", qb);
    if (a->quantization_bit) put(&l, "--quantization_type", a->quantization_type);
    glm_info("--do_predict: answering %s with %s%s%s (sampling as ptuning/main.py: top_p 0.7, temperature 0.95, max_length %s)",
             a->test_file, base, adapter ? " + " : "", adapter ? adapter : "", max_length);
    return glm_cmd_generate(l.n, l.v) ? glm_fail(err, "--do_predict: answering %s failed (above)", a->test_file) : 0;
}

int glm_cmd_train(int argc, char **argv) {
    glm_train_args a = {0};
    glm_err err = {0};
    glm_args_defaults(glm_train_flags, glm_train_nflags, &a);
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            glm_args_usage(glm_train_flags, glm_train_nflags, "train");
            glm_train_args_free(&a);
            return 0;
        }
    int rc = glm_args_parse_ex(glm_train_flags, glm_train_nflags, &a, argc, argv, glm_train_config_key, &err) ||
             glm_train_resolve_args(&a, &err);
    glm_par_opts po = glm_train_par_opts(&a);
    int rm_predict = !rc && glm_train_is_rm(&a) && a.do_predict; /* scored by the trainer itself (train/pref_train.c) */
    int train = a.do_train || a.do_eval || rm_predict;
    int launcher = rc || !train ? 0 : glm_launch_wanted(&po, &err);
    if (launcher < 0) rc = -1;
    if (launcher > 0) {
        /* this process only starts and watches the data-parallel workers (parallel/launch.h);
         * the first worker predicts */
        rc = glm_train_preflight(&a, &err);
        if (!rc) rc = glm_launch(&po, argc, argv, &err);
        if (rc < 0) glm_err_print(&err);
        glm_train_args_free(&a);
        return rc < 0 ? 1 : rc;
    }
    if (!rc) rc = train ? glm_train_run(&a, &err) : glm_train_check_args(&a, &err);
    int first = rc || !a.do_predict || rm_predict ? 0 : first_rank(&err);
    if (first < 0) rc = -1;
    if (first > 0) rc = predict(&a, &err);
    if (rc) glm_err_print(&err);
    glm_train_args_free(&a);
    return rc ? 1 : 0;
}
