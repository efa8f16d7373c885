/* --deepspeed FILE: the DeepSpeed config THUDM's ds_train_finetune.sh, LLaMA-Factory's
 * examples/deepspeed/ds_z*_config.json and the finetune_demo configs pass to Hugging Face's
 * Trainer, read as transformers reads it (integrations/deepspeed.py, HfTrainerDeepSpeedConfig):
 * "auto" takes the training flag's value, a value given must equal it, and every difference is
 * listed in one error. What the file decides beyond the flags goes to glm_ds_settings. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/args.h"
#include "core/fileutil.h"
#include "core/json_text.h"
#include "core/log.h"
#include "optim/schedule.h"
#include "train/train_args.h"

typedef struct ds_ctx {
    const char *path;
    char mismatch[900]; /* "- ds KEY=V vs hf FLAG=V" lines, transformers' wording */
    char ignored[600];  /* keys only DeepSpeed's own engine reads */
    glm_err *err;
} ds_ctx;

static void add_line(char *buf, size_t cap, const char *sep, const char *text) {
    size_t n = strlen(buf);
    if (n + strlen(sep) + strlen(text) + 4 >= cap) {
        if (n + 5 < cap && !strstr(buf, "...")) strcat(buf, sep), strcat(buf, "...");
        return;
    }
    if (n) strcat(buf, sep);
    strcat(buf, text);
}

static int is_auto(const cJSON *v) { return cJSON_IsString(v) && !strcmp(v->valuestring, "auto"); }

static int bad_type(ds_ctx *c, const char *key, const char *want) {
    glm_fail(c->err, "%s: %s must be %s", c->path, key, want);
    return glm_hint(c->err, "or \"auto\" where the training flags should decide (as the Trainer fills it)");
}

/* transformers' fill_match for a number: "auto" or absent keeps the flag's value */
static int match_num(ds_ctx *c, const cJSON *node, const char *name, const char *key, double flag, const char *flag_name) {
    const cJSON *v = node ? cJSON_GetObjectItemCaseSensitive(node, name) : NULL;
    if (!v || cJSON_IsNull(v) || is_auto(v)) return 0;
    if (!cJSON_IsNumber(v)) return bad_type(c, key, "a number");
    if (v->valuedouble != flag) {
        char line[256];
        snprintf(line, sizeof line, "- ds %s=%.10g vs hf %s=%.10g", key, v->valuedouble, flag_name, flag);
        add_line(c->mismatch, sizeof c->mismatch, "\n", line);
    }
    return 0;
}

static int match_bool(ds_ctx *c, const cJSON *node, const char *key, int flag, const char *flag_name) {
    const cJSON *v = node ? cJSON_GetObjectItemCaseSensitive(node, "enabled") : NULL;
    if (!v || cJSON_IsNull(v) || is_auto(v)) return 0;
    if (!cJSON_IsBool(v)) return bad_type(c, key, "true or false");
    if (cJSON_IsTrue(v) != !!flag) {
        char line[256];
        snprintf(line, sizeof line, "- ds %s=%s vs hf %s=%s", key, cJSON_IsTrue(v) ? "True" : "False", flag_name,
                 flag ? "True" : "False");
        add_line(c->mismatch, sizeof c->mismatch, "\n", line);
    }
    return 0;
}

/* a number the file may give, -1 for "auto" or absent */
static int opt_long(ds_ctx *c, const cJSON *node, const char *name, const char *key, long *out) {
    const cJSON *v = node ? cJSON_GetObjectItemCaseSensitive(node, name) : NULL;
    *out = -1;
    if (!v || cJSON_IsNull(v) || is_auto(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
        return bad_type(c, key, "a whole number");
    if (v->valuedouble > 2147483647.0) return bad_type(c, key, "a whole number below 2^31");
    *out = (long)v->valuedouble;
    return 0;
}

/* a number of DeepSpeed's own (no flag fills it), with its default */
static int own_num(ds_ctx *c, const cJSON *node, const char *name, const char *key, double def, double *out) {
    const cJSON *v = node ? cJSON_GetObjectItemCaseSensitive(node, name) : NULL;
    *out = def;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v)) {
        glm_fail(c->err, "%s: %s must be a number", c->path, key);
        return glm_hint(c->err, "the Trainer does not fill it (\"auto\" is not taken here); DeepSpeed's default is %g", def);
    }
    *out = v->valuedouble;
    return 0;
}

static int device_of(ds_ctx *c, const cJSON *node, const char *key, const char **out) {
    const cJSON *d = node ? cJSON_GetObjectItemCaseSensitive(node, "device") : NULL;
    *out = "none";
    if (!node || cJSON_IsNull(node)) return 0;
    if (!cJSON_IsObject(node)) return bad_type(c, key, "an object with a device");
    if (!d) return 0;
    if (!cJSON_IsString(d)) return bad_type(c, key, "\"cpu\", \"nvme\" or \"none\"");
    *out = d->valuestring;
    return 0;
}

/* top-level sections only DeepSpeed's engine reads (speed, logging, its own checkpoints) */
static int engine_only(const char *k) {
    static const char *keys[] = {
        "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
        "gradient_predivide_factor", "prescale_gradients", "communication_data_type", "fp32_allreduce", "dump_state",
        "activation_checkpointing", "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comms_logger", "aio",
        "checkpoint", "data_types", "memory_breakdown", "sparse_gradients", "autotuning", "nebula", "dataloader_drop_last",
        "disable_allgather", "graph_harvesting", "timers", "compile", "pipeline"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (!strcmp(k, keys[i])) return 1;
    return 0;
}

/* DeepSpeed features that change what trains: refused when enabled, so a run never differs silently */
static const char *const changes_training[] = {"curriculum_learning", "data_efficiency", "progressive_layer_drop",
                                               "compression_training", "elasticity", "quantize_training",
                                               "eigenvalue", "hybrid_engine", "sequence_parallel_size", NULL};

static void note_ignored(ds_ctx *c, const cJSON *node, const char *prefix, const char *const *used) {
    for (const cJSON *e = node ? node->child : NULL; e; e = e->next) {
        int taken = 0;
        for (int i = 0; used[i]; i++) taken |= !strcmp(e->string, used[i]);
        if (taken) continue;
        char k[160];
        snprintf(k, sizeof k, "%s%s", prefix, e->string);
        add_line(c->ignored, sizeof c->ignored, ", ", k);
    }
}

static int zero_section(ds_ctx *c, glm_train_args *a, const cJSON *z) {
    if (!z || cJSON_IsNull(z)) return 0;
    if (!cJSON_IsObject(z)) return bad_type(c, "zero_optimization", "an object");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(z, "stage");
    if (st) {
        if (!cJSON_IsNumber(st) || st->valuedouble < 0 || st->valuedouble > 3 || st->valuedouble != floor(st->valuedouble))
            return bad_type(c, "zero_optimization.stage", "0, 1, 2 or 3");
        int stage = (int)st->valuedouble;
        if (a->zero_stage != 1 && a->zero_stage != stage) /* 1 is the flag's default */
            return glm_fail(c->err, "%s says zero_optimization.stage %d, the flags --zero_stage %d", c->path, stage, a->zero_stage),
                   glm_hint(c->err, "give the stage in one place");
        a->zero_stage = stage;
    }
    const char *dev;
    if (device_of(c, cJSON_GetObjectItemCaseSensitive(z, "offload_optimizer"), "zero_optimization.offload_optimizer", &dev))
        return -1;
    const cJSON *legacy = cJSON_GetObjectItemCaseSensitive(z, "cpu_offload"); /* DeepSpeed's older name */
    if (cJSON_IsTrue(legacy)) dev = "cpu";
    if (!strcmp(dev, "nvme"))
        return glm_fail(c->err, "%s: zero_optimization.offload_optimizer.device nvme: glmtrain offloads the optimizer to "
                                "host memory only", c->path),
               glm_hint(c->err, "set the device to \"cpu\" (--offload_optimizer cpu), or use --optim adamw_8bit for a "
                                "quarter of the optimizer's memory");
    if (!strcmp(dev, "cpu")) {
        free(a->offload_optimizer);
        a->offload_optimizer = glm_strdup("cpu");
    } else if (strcmp(dev, "none"))
        return bad_type(c, "zero_optimization.offload_optimizer.device", "\"cpu\", \"nvme\" or \"none\"");
    if (device_of(c, cJSON_GetObjectItemCaseSensitive(z, "offload_param"), "zero_optimization.offload_param", &dev)) return -1;
    if (strcmp(dev, "none"))
        glm_warn("%s: zero_optimization.offload_param.device %s: glmtrain keeps the weights on the GPUs (ZeRO-3 shards "
                 "them); the memory plan below says whether the run fits", c->path, dev);
    static const char *used[] = {"stage", "offload_optimizer", "offload_param", "cpu_offload", NULL};
    note_ignored(c, z, "zero_optimization.", used);
    return 0;
}

static int optimizer_section(ds_ctx *c, glm_train_args *a, const cJSON *o) {
    if (!o || cJSON_IsNull(o)) return 0;
    if (!cJSON_IsObject(o)) return bad_type(c, "optimizer", "an object");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type"), *p = cJSON_GetObjectItemCaseSensitive(o, "params");
    if (!cJSON_IsString(ty)) return bad_type(c, "optimizer.type", "a name (\"AdamW\")");
    char lower[64];
    snprintf(lower, sizeof lower, "%s", ty->valuestring);
    for (char *q = lower; *q; q++) *q = (char)(*q >= 'A' && *q <= 'Z' ? *q + 32 : *q);
    if (strcmp(lower, "adamw") && strcmp(lower, "adam"))
        return glm_fail(c->err, "%s: optimizer.type %s: glmtrain trains with AdamW", c->path, ty->valuestring),
               glm_hint(c->err, "set the type to \"AdamW\", or remove the optimizer section (the Trainer then builds "
                                "AdamW from the flags; --optim adamw_8bit for 8-bit moments)");
    const cJSON *wmode = p ? cJSON_GetObjectItemCaseSensitive(p, "adam_w_mode") : NULL;
    const cJSON *bc = p ? cJSON_GetObjectItemCaseSensitive(p, "bias_correction") : NULL;
    if (cJSON_IsFalse(wmode))
        return glm_fail(c->err, "%s: optimizer.params.adam_w_mode false is Adam with L2 regularisation; glmtrain's "
                                "AdamW decays the weights decoupled", c->path),
               glm_hint(c->err, "remove adam_w_mode (DeepSpeed's default is true)");
    if (cJSON_IsFalse(bc))
        return glm_fail(c->err, "%s: optimizer.params.bias_correction false: glmtrain's AdamW always corrects the moments' "
                                "bias", c->path),
               glm_hint(c->err, "remove bias_correction (DeepSpeed's default is true)");
    if (strcmp(a->optim, "adamw_torch"))
        return glm_fail(c->err, "%s has an optimizer section, which replaces --optim %s", c->path, a->optim),
               glm_hint(c->err, "remove the optimizer section to keep --optim %s, or drop --optim", a->optim);
    if (p && !cJSON_IsObject(p)) return bad_type(c, "optimizer.params", "an object");
    if (match_num(c, p, "lr", "optimizer.params.lr", a->learning_rate, "learning_rate") ||
        match_num(c, p, "eps", "optimizer.params.eps", a->adam_epsilon, "adam_epsilon") ||
        match_num(c, p, "weight_decay", "optimizer.params.weight_decay", a->weight_decay, "weight_decay"))
        return -1;
    const cJSON *betas = p ? cJSON_GetObjectItemCaseSensitive(p, "betas") : NULL;
    if (betas && !is_auto(betas)) {
        if (!cJSON_IsArray(betas) || cJSON_GetArraySize(betas) != 2 || !cJSON_IsNumber(cJSON_GetArrayItem(betas, 0)) ||
            !cJSON_IsNumber(cJSON_GetArrayItem(betas, 1)))
            return bad_type(c, "optimizer.params.betas", "two numbers");
        double b1 = cJSON_GetArrayItem(betas, 0)->valuedouble, b2 = cJSON_GetArrayItem(betas, 1)->valuedouble;
        if (b1 != a->adam_beta1 || b2 != a->adam_beta2) {
            char line[256];
            snprintf(line, sizeof line, "- ds optimizer.params.betas=[%.10g, %.10g] vs hf adam_beta1+adam_beta2=[%.10g, %.10g]",
                     b1, b2, a->adam_beta1, a->adam_beta2);
            add_line(c->mismatch, sizeof c->mismatch, "\n", line);
        }
    }
    /* the Trainer hands DeepSpeed its parameters as one group: no exemption for biases and norms */
    a->ds.decay_all = 1;
    return 0;
}

static int scheduler_section(ds_ctx *c, glm_train_args *a, const cJSON *s) {
    if (!s || cJSON_IsNull(s)) return 0;
    if (!cJSON_IsObject(s)) return bad_type(c, "scheduler", "an object");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type"), *p = cJSON_GetObjectItemCaseSensitive(s, "params");
    glm_lr_kind k;
    if (!cJSON_IsString(ty) || glm_lr_ds_kind_parse(ty->valuestring, &k))
        return glm_fail(c->err, "%s: scheduler.type %s: glmtrain has DeepSpeed's WarmupLR, WarmupDecayLR and "
                                "WarmupCosineLR", c->path, cJSON_IsString(ty) ? ty->valuestring : "(not a name)"),
               glm_hint(c->err, "or remove the scheduler section and choose --lr_scheduler_type (linear, cosine, ...)");
    if (p && !cJSON_IsObject(p)) return bad_type(c, "scheduler.params", "an object");
    a->ds.sched = (int)k;
    const cJSON *wt = p ? cJSON_GetObjectItemCaseSensitive(p, "warmup_type") : NULL;
    a->ds.log_warmup = 1; /* DeepSpeed's default */
    if (wt) {
        if (!cJSON_IsString(wt) || (strcmp(wt->valuestring, "log") && strcmp(wt->valuestring, "linear")))
            return bad_type(c, "scheduler.params.warmup_type", "\"log\" or \"linear\"");
        a->ds.log_warmup = !strcmp(wt->valuestring, "log");
    }
    const cJSON *mn = p ? cJSON_GetObjectItemCaseSensitive(p, "warmup_min_lr") : NULL;
    a->ds.min_lr = 0; /* "auto": the Trainer fills 0 */
    if (mn && !is_auto(mn)) {
        if (!cJSON_IsNumber(mn)) return bad_type(c, "scheduler.params.warmup_min_lr", "a number");
        a->ds.min_lr = mn->valuedouble;
    }
    if (match_num(c, p, "warmup_max_lr", "scheduler.params.warmup_max_lr", a->learning_rate, "learning_rate") ||
        opt_long(c, p, "warmup_num_steps", "scheduler.params.warmup_num_steps", &a->ds.warmup_num_steps) ||
        opt_long(c, p, "total_num_steps", "scheduler.params.total_num_steps", &a->ds.total_num_steps))
        return -1;
    if (k == LR_DS_WARMUP_COSINE &&
        (own_num(c, p, "warmup_min_ratio", "scheduler.params.warmup_min_ratio", 0.0, &a->ds.warmup_min_ratio) ||
         own_num(c, p, "cos_min_ratio", "scheduler.params.cos_min_ratio", 1e-4, &a->ds.cos_min_ratio)))
        return -1;
    if (strcmp(a->lr_scheduler_type, "linear")) /* the flag's default */
        glm_info("%s: the learning rate follows its scheduler %s; --lr_scheduler_type %s is not used (as in the Trainer)",
                 c->path, ty->valuestring, a->lr_scheduler_type);
    return 0;
}

static int precision_sections(ds_ctx *c, glm_train_args *a, const cJSON *root) {
    const cJSON *f16 = cJSON_GetObjectItemCaseSensitive(root, "fp16"), *b16 = cJSON_GetObjectItemCaseSensitive(root, "bf16");
    if (!b16) b16 = cJSON_GetObjectItemCaseSensitive(root, "bfloat16"); /* DeepSpeed's older name */
    const cJSON *amp = cJSON_GetObjectItemCaseSensitive(root, "amp");
    if (cJSON_IsTrue(amp ? cJSON_GetObjectItemCaseSensitive(amp, "enabled") : NULL))
        return glm_fail(c->err, "%s: amp.enabled true is NVIDIA apex's mixed precision", c->path),
               glm_hint(c->err, "use an fp16 section (DeepSpeed's own, with loss scaling) or bf16, with --fp16 / --bf16");
    if ((f16 && !cJSON_IsObject(f16)) || (b16 && !cJSON_IsObject(b16)))
        return bad_type(c, f16 && !cJSON_IsObject(f16) ? "fp16" : "bf16", "an object with \"enabled\"");
    if (match_bool(c, f16, "fp16.enabled", a->fp16, "fp16|fp16_full_eval+fp16_backend(amp)") ||
        match_bool(c, b16, "bf16.enabled", a->bf16, "bf16|bf16_full_eval"))
        return -1;
    /* a precision flag the file has no section for: DeepSpeed would then train in fp32 */
    if (a->fp16 && !f16)
        return glm_fail(c->err, "--fp16, but %s has no fp16 section: DeepSpeed would then train in fp32", c->path),
               glm_hint(c->err, "add \"fp16\": {\"enabled\": \"auto\"} to the file, or drop --fp16");
    if (a->bf16 && !b16)
        return glm_fail(c->err, "--bf16, but %s has no bf16 section: DeepSpeed would then train in fp32", c->path),
               glm_hint(c->err, "add \"bf16\": {\"enabled\": \"auto\"} to the file, or drop --bf16");
    if (!a->fp16) return 0;
    double ls, power, window, hyst, min_scale;
    if (own_num(c, f16, "loss_scale", "fp16.loss_scale", 0, &ls) ||
        own_num(c, f16, "initial_scale_power", "fp16.initial_scale_power", 16, &power) ||
        own_num(c, f16, "loss_scale_window", "fp16.loss_scale_window", 1000, &window) ||
        own_num(c, f16, "hysteresis", "fp16.hysteresis", 2, &hyst) ||
        own_num(c, f16, "min_loss_scale", "fp16.min_loss_scale", 1, &min_scale))
        return -1;
    if (ls != 0)
        return glm_fail(c->err, "%s: fp16.loss_scale %g is a fixed loss scale; glmtrain scales fp16 losses dynamically",
                        c->path, ls),
               glm_hint(c->err, "set loss_scale to 0 (dynamic: initial_scale_power says where it starts)");
    if (window < 1 || hyst < 1 || !(min_scale > 0) || power < 0 || power > 64)
        return glm_fail(c->err, "%s: fp16 needs loss_scale_window >= 1, hysteresis >= 1, min_loss_scale > 0 and "
                                "initial_scale_power in [0, 64] (has %g, %g, %g, %g)", c->path, window, hyst, min_scale, power);
    double init = ldexp(1.0, (int)power);
    if (a->fp16_initial_scale != 65536 && a->fp16_initial_scale != init) /* 65536: the flag's default */
        return glm_fail(c->err, "%s says fp16.initial_scale_power %g (a scale of %g), the flags --fp16_initial_scale %g",
                        c->path, power, init, a->fp16_initial_scale),
               glm_hint(c->err, "give the starting scale in one place");
    a->fp16_initial_scale = init;
    a->ds.fp16_rule = 1;
    a->ds.scale_window = (long)window;
    a->ds.hysteresis = (int)hyst;
    a->ds.min_scale = min_scale;
    a->ds.consecutive_hysteresis = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f16, "consecutive_hysteresis"));
    return 0;
}

int glm_ds_apply(glm_train_args *a, glm_err *err) {
    memset(&a->ds, 0, sizeof a->ds);
    a->ds.warmup_num_steps = a->ds.total_num_steps = a->ds.train_batch_size = -1;
    if (!a->deepspeed || !a->deepspeed[0]) return 0;
    ds_ctx c = {.path = a->deepspeed, .err = err};
    size_t len;
    char *text = glm_read_file(a->deepspeed, &len, err);
    if (!text)
        return glm_wrap(err, "--deepspeed: "),
               glm_hint(err, "give the path of a DeepSpeed JSON config (relative to where glmtrain runs)");
    cJSON *root = glm_json_parse_doc(text, len, a->deepspeed, "a DeepSpeed config (JSON)", err);
    if (!root) { free(text); return -1; }
    int rc = -1;
    if (!cJSON_IsObject(root)) { glm_fail(err, "%s: a DeepSpeed config is a JSON object", a->deepspeed); goto out; }
    a->ds.on = 1;
    if (match_num(&c, root, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu",
                  a->per_device_train_batch_size, "per_device_train_batch_size") ||
        match_num(&c, root, "gradient_accumulation_steps", "gradient_accumulation_steps", a->gradient_accumulation_steps,
                  "gradient_accumulation_steps") ||
        opt_long(&c, root, "train_batch_size", "train_batch_size", &a->ds.train_batch_size) ||
        match_num(&c, root, "gradient_clipping", "gradient_clipping", a->max_grad_norm, "max_grad_norm") ||
        optimizer_section(&c, a, cJSON_GetObjectItemCaseSensitive(root, "optimizer")) ||
        scheduler_section(&c, a, cJSON_GetObjectItemCaseSensitive(root, "scheduler")) ||
        precision_sections(&c, a, root) || zero_section(&c, a, cJSON_GetObjectItemCaseSensitive(root, "zero_optimization")))
        goto out;
    if (c.mismatch[0]) {
        glm_fail(err, "%s: values that differ from the training flags (transformers refuses these too):\n%s", a->deepspeed,
                 c.mismatch);
        glm_hint(err, "set them to \"auto\" in the file (the flags then decide), or pass the flags with the file's values");
        goto out;
    }
    static const char *used[] = {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
                                 "gradient_clipping", "optimizer", "scheduler", "fp16", "bf16", "bfloat16", "amp",
                                 "zero_optimization", NULL};
    for (const cJSON *e = root->child; e; e = e->next) {
        int taken = 0;
        for (int i = 0; used[i]; i++) taken |= !strcmp(e->string, used[i]);
        if (taken) continue;
        int feature = 0;
        for (int i = 0; changes_training[i]; i++) feature |= !strcmp(e->string, changes_training[i]);
        if (feature && (cJSON_IsTrue(cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "enabled") : NULL) ||
                        (cJSON_IsNumber(e) && e->valuedouble > 1))) {
            glm_fail(err, "%s: %s changes what DeepSpeed trains, and glmtrain has no such feature", a->deepspeed, e->string);
            glm_hint(err, "disable it (\"enabled\": false) or remove it from the file");
            goto out;
        }
        if (!feature && !engine_only(e->string)) {
            glm_fail(err, "%s: %s is not a DeepSpeed setting glmtrain knows", a->deepspeed, e->string);
            glm_hint(err, "check its spelling against DeepSpeed's config documentation, or remove it");
            goto out;
        }
        add_line(c.ignored, sizeof c.ignored, ", ", e->string);
    }
    if (c.ignored[0]) glm_info("%s: only DeepSpeed's own engine reads %s; left alone", a->deepspeed, c.ignored);
    rc = 0;
out:
    cJSON_Delete(root);
    free(text);
    return rc;
}

int glm_ds_check_plan(const glm_train_args *a, int world, long total_steps, long warmup_steps, glm_err *err) {
    if (!a->ds.on) return 0;
    char mismatch[600] = "", line[200];
    long tbs = (long)world * a->per_device_train_batch_size * a->gradient_accumulation_steps;
    if (a->ds.train_batch_size >= 0 && a->ds.train_batch_size != tbs) {
        snprintf(line, sizeof line, "- ds train_batch_size=%ld vs hf train_batch_size (calculated)=%ld", a->ds.train_batch_size, tbs);
        add_line(mismatch, sizeof mismatch, "\n", line);
    }
    if (a->ds.sched && a->ds.total_num_steps >= 0 && a->ds.total_num_steps != total_steps) {
        snprintf(line, sizeof line, "- ds scheduler.params.total_num_steps=%ld vs hf num_training_steps (calculated)=%ld",
                 a->ds.total_num_steps, total_steps);
        add_line(mismatch, sizeof mismatch, "\n", line);
    }
    if (a->ds.sched && a->ds.warmup_num_steps >= 0 && a->ds.warmup_num_steps != warmup_steps) {
        snprintf(line, sizeof line, "- ds scheduler.params.warmup_num_steps=%ld vs hf warmup_steps=%ld", a->ds.warmup_num_steps,
                 warmup_steps);
        add_line(mismatch, sizeof mismatch, "\n", line);
    }
    if (mismatch[0])
        return glm_fail(err, "%s: values that differ from the training flags (transformers refuses these too):\n%s",
                        a->deepspeed, mismatch),
               glm_hint(err, "set them to \"auto\" in the file (the flags then decide), or pass the flags with the file's "
                             "values (%d ranks x --per_device_train_batch_size %d x --gradient_accumulation_steps %d; "
                             "%ld steps, %ld of warmup)", world, a->per_device_train_batch_size,
                        a->gradient_accumulation_steps, total_steps, warmup_steps);
    long W = warmup_steps > 2 ? warmup_steps : 2;
    if (a->ds.sched == LR_DS_WARMUP_COSINE && total_steps <= W)
        return glm_fail(err, "%s: WarmupCosineLR needs more steps than its warmup (%ld steps, warmup %ld)", a->deepspeed,
                        total_steps, W),
               glm_hint(err, "DeepSpeed divides by their difference; train longer or warm up less");
    return 0;
}
