#include "optim/schedule.h"
#include <cJSON.h>
#include <math.h>
#include <string.h>

static const char *names[] = {"linear", "cosine", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial",
                              "inverse_sqrt", "cosine_with_min_lr", "reduce_lr_on_plateau"};

int glm_lr_kind_parse(const char *s, glm_lr_kind *out) {
    for (int i = 0; i < (int)(sizeof names / sizeof *names); i++)
        if (strcmp(s, names[i]) == 0) { *out = (glm_lr_kind)i; return 0; }
    return -1;
}

const char *glm_lr_kind_name(glm_lr_kind k) { return names[k]; }

/* get_scheduler's defaults for the kind's settings */
static void default_settings(glm_lr_sched *s) {
    s->num_cycles = s->kind == LR_COSINE_WITH_RESTARTS ? 1.0 : 0.5;
    s->min_lr_rate = 0.0;
    s->lr_end = GLM_LR_POLYNOMIAL_END;
    s->power = 1.0;
    s->timescale = (double)s->warmup;
    if (s->kind == LR_REDUCE_ON_PLATEAU) { /* torch.optim.lr_scheduler.ReduceLROnPlateau's */
        s->factor = 0.1;
        s->patience = 10;
        s->threshold = 1e-4;
        s->cooldown = 0;
        s->min_lr = 0;
        s->eps = 1e-8;
        s->plateau_max = s->plateau_abs = 0;
        s->plateau = (glm_lr_plateau){.lr = s->base_lr, .best = INFINITY};
    }
}

/* transformers' lambdas (optimization.py) times base_lr: a warmup factor step / max(1, warmup)
 * while step < warmup, then the kind's decay over progress = (step - warmup) / max(1, total - warmup) */
static float hf_rate(const glm_lr_sched *s, long step) {
    const glm_lr_kind k = s->kind;
    const float base_lr = s->base_lr;
    const long warmup = s->warmup, total = s->total;
    if (k == LR_CONSTANT) return base_lr;
    if (step < warmup) return base_lr * (float)step / (float)(warmup > 1 ? warmup : 1);
    if (k == LR_CONSTANT_WITH_WARMUP) return base_lr;
    double progress = (double)(step - warmup) / (double)((total - warmup) > 1 ? (total - warmup) : 1);
    if (k == LR_LINEAR) {
        double f = (double)(total - step) / (double)((total - warmup) > 1 ? (total - warmup) : 1);
        return base_lr * (float)(f > 0 ? f : 0);
    }
    if (k == LR_COSINE_WITH_RESTARTS) { /* num_cycles hard restarts, 0 from the end on */
        if (progress >= 1.0) return 0.0f;
        double f = 0.5 * (1.0 + cos(M_PI * fmod(s->num_cycles * progress, 1.0)));
        return base_lr * (float)(f > 0 ? f : 0);
    }
    if (k == LR_POLYNOMIAL) { /* from base_lr down to lr_end */
        if (step > total) return (float)s->lr_end;
        double remaining = 1.0 - (double)(step - warmup) / (double)(total - warmup);
        return (float)(((double)base_lr - s->lr_end) * pow(remaining, s->power) + s->lr_end);
    }
    if (k == LR_INVERSE_SQRT) /* timescale > 0: checked by glm_lr_kwargs */
        return base_lr * (float)(1.0 / sqrt(((double)step + s->timescale - (double)warmup) / s->timescale));
    double f = 0.5 * (1.0 + cos(M_PI * s->num_cycles * 2.0 * progress));
    if (k == LR_COSINE_WITH_MIN_LR) f = f * (1.0 - s->min_lr_rate) + s->min_lr_rate;
    return base_lr * (float)(f > 0 ? f : 0);
}

float glm_lr_at(glm_lr_kind k, float base_lr, long step, long warmup, long total) {
    glm_lr_sched s = {.kind = k, .base_lr = base_lr, .warmup = warmup, .total = total};
    default_settings(&s);
    return hf_rate(&s, step);
}

/* the keys each kind takes, "" for none */
static const char *kind_keys(glm_lr_kind k) {
    switch (k) {
    case LR_COSINE: case LR_COSINE_WITH_RESTARTS: return "num_cycles";
    case LR_COSINE_WITH_MIN_LR: return "num_cycles, min_lr, min_lr_rate";
    case LR_POLYNOMIAL: return "lr_end, power";
    case LR_INVERSE_SQRT: return "timescale";
    case LR_REDUCE_ON_PLATEAU: return "mode, factor, patience, threshold, threshold_mode, cooldown, min_lr, eps";
    default: return "";
    }
}

static int takes_key(glm_lr_kind k, const char *key) {
    size_t n = strlen(key);
    for (const char *p = kind_keys(k); *p;) { /* "a, b, c" */
        size_t len = strcspn(p, ",");
        if (len == n && !strncmp(p, key, n)) return 1;
        p += len;
        while (*p == ',' || *p == ' ') p++;
    }
    return 0;
}

int glm_lr_kwargs(glm_lr_sched *s, const char *json, glm_err *err) {
    default_settings(s);
    const char *kind = glm_lr_kind_name(s->kind);
    cJSON *o = cJSON_Parse(json && json[0] ? json : "{}");
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return glm_fail(err, "--lr_scheduler_kwargs '%s' is not a JSON object", json);
    }
    int rc = 0, has_min_lr = 0, has_rate = 0;
    double min_lr = 0;
    for (cJSON *it = o->child; it && !rc; it = it->next) {
        if (!takes_key(s->kind, it->string)) {
            rc = glm_fail(err, "--lr_scheduler_kwargs: %s does not take \"%s\"", kind, it->string);
            if (kind_keys(s->kind)[0]) glm_hint(err, "%s takes %s", kind, kind_keys(s->kind));
            else glm_hint(err, "%s takes no settings: drop --lr_scheduler_kwargs", kind);
            break;
        }
        if (!strcmp(it->string, "mode") || !strcmp(it->string, "threshold_mode")) { /* torch's words */
            int mode = !strcmp(it->string, "mode");
            const char *a = mode ? "min" : "rel", *b = mode ? "max" : "abs";
            if (!cJSON_IsString(it) || (strcmp(it->valuestring, a) && strcmp(it->valuestring, b))) {
                rc = glm_fail(err, "--lr_scheduler_kwargs: \"%s\" must be \"%s\" or \"%s\"", it->string, a, b);
                break;
            }
            if (mode) { s->plateau_max = !strcmp(it->valuestring, b); s->plateau.best = s->plateau_max ? -INFINITY : INFINITY; }
            else s->plateau_abs = !strcmp(it->valuestring, b);
            continue;
        }
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble)) {
            rc = glm_fail(err, "--lr_scheduler_kwargs: \"%s\" must be a number", it->string);
            break;
        }
        double v = it->valuedouble;
        const char *key = it->string;
        if (!strcmp(key, "num_cycles")) s->num_cycles = v;
        else if (!strcmp(key, "min_lr")) { min_lr = v; has_min_lr = 1; }
        else if (!strcmp(key, "min_lr_rate")) { s->min_lr_rate = v; has_rate = 1; }
        else if (!strcmp(key, "lr_end")) s->lr_end = v;
        else if (!strcmp(key, "power")) s->power = v;
        else if (!strcmp(key, "factor")) s->factor = v;
        else if (!strcmp(key, "patience")) s->patience = (long)v;
        else if (!strcmp(key, "threshold")) s->threshold = v;
        else if (!strcmp(key, "cooldown")) s->cooldown = (long)v;
        else if (!strcmp(key, "eps")) s->eps = v;
        else s->timescale = v;
        if ((!strcmp(key, "patience") || !strcmp(key, "cooldown")) && (v != floor(v) || v > 1e9))
            rc = glm_fail(err, "--lr_scheduler_kwargs: \"%s\" %g must be a whole number", key, v);
        if (v < 0 && strcmp(key, "power"))
            rc = glm_fail(err, "--lr_scheduler_kwargs: \"%s\" %g must not be negative", key, v);
    }
    cJSON_Delete(o);
    if (rc) return rc;
    if (s->kind == LR_COSINE_WITH_MIN_LR) { /* as get_cosine_with_min_lr_schedule_with_warmup */
        if (has_min_lr == has_rate)
            return glm_fail(err, "--lr_scheduler_type cosine_with_min_lr needs %s of min_lr and min_lr_rate in --lr_scheduler_kwargs",
                            has_rate ? "only one" : "one"),
                   glm_hint(err, "e.g. --lr_scheduler_kwargs '{\"min_lr_rate\": 0.1}' (a tenth of --learning_rate at the end)");
        if (has_min_lr) s->min_lr_rate = min_lr / s->base_lr;
    }
    if (s->kind == LR_REDUCE_ON_PLATEAU && has_min_lr) s->min_lr = min_lr; /* torch's min_lrs */
    if (s->kind == LR_REDUCE_ON_PLATEAU && !(s->factor < 1.0)) /* torch's check, in its words */
        return glm_fail(err, "--lr_scheduler_kwargs: factor %g: Factor should be < 1.0.", s->factor);
    if (s->kind == LR_POLYNOMIAL && !(s->base_lr > s->lr_end))
        return glm_fail(err, "--lr_scheduler_type polynomial decays to lr_end %g: --learning_rate %g must be above it", s->lr_end,
                        (double)s->base_lr);
    if (s->kind == LR_INVERSE_SQRT && !(s->timescale > 0))
        return glm_fail(err, "--lr_scheduler_type inverse_sqrt needs warmup: its timescale is the warmup steps (transformers divides by it)"),
               glm_hint(err, "give --warmup_steps N or --warmup_ratio R, or --lr_scheduler_kwargs '{\"timescale\": N}'");
    return 0;
}

int glm_lr_ds_kind_parse(const char *s, glm_lr_kind *k) {
    static const char *ds[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, ds[i])) { *k = (glm_lr_kind)(LR_DS_WARMUP + i); return 0; }
    return -1;
}

/* DeepSpeed's warmup fraction at iteration step < W (W = max(2, warmup), as its schedulers clamp it) */
static double ds_warmup_gamma(const glm_lr_sched *s, long step, long W) {
    return s->log_warmup ? log((double)step + 1.0) / log((double)W) : (double)step / (double)W;
}

int glm_lr_plateau_step(glm_lr_sched *s, double metric) {
    glm_lr_plateau *p = &s->plateau;
    double best = p->best;
    int better = s->plateau_max ? (s->plateau_abs ? metric > best + s->threshold : metric > best * (1.0 + s->threshold))
                                : (s->plateau_abs ? metric < best - s->threshold : metric < best * (1.0 - s->threshold));
    if (better) { p->best = metric; p->num_bad = 0; }
    else p->num_bad++;
    if (p->cooldown_left > 0) { p->cooldown_left--; p->num_bad = 0; }
    if (p->num_bad <= s->patience) return 0;
    double cut = p->lr * s->factor > s->min_lr ? p->lr * s->factor : s->min_lr;
    int changed = p->lr - cut > s->eps;
    if (changed) p->lr = cut;
    p->cooldown_left = s->cooldown;
    p->num_bad = 0;
    return changed;
}

float glm_lr_sched_at(const glm_lr_sched *s, long step) {
    if (s->kind == LR_REDUCE_ON_PLATEAU) return (float)s->plateau.lr;
    if (s->kind < LR_DS_WARMUP) return hf_rate(s, step);
    long W = s->warmup > 2 ? s->warmup : 2;
    if (s->kind == LR_DS_WARMUP_COSINE) {
        double r;
        if (step < W) r = s->warmup_min_ratio + ds_warmup_gamma(s, step, W) * (1.0 - s->warmup_min_ratio);
        else { /* the total > W is checked where the schedule is read */
            double c = (1.0 + cos(M_PI * (double)(step - W + 1) / (double)(s->total - W))) / 2.0;
            r = s->cos_min_ratio + (1.0 - s->cos_min_ratio) * c;
            if (r < 0) r = 0;
        }
        return (float)(s->base_lr * r);
    }
    double g;
    if (step < W) g = ds_warmup_gamma(s, step, W);
    else if (s->kind == LR_DS_WARMUP) g = 1.0;
    else {
        double den = (double)(s->total - W) > 1.0 ? (double)(s->total - W) : 1.0;
        g = (double)(s->total - step) / den;
        if (g < 0) g = 0;
    }
    return (float)(s->min_lr + ((double)s->base_lr - s->min_lr) * g);
}
