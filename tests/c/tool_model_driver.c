/* Test driver: runs the C model on a given model folder and batch so a PyTorch reference
 * (tests/py/test_model_vs_torch.py) can compare loss, every gradient and AdamW steps.
 *   tool_model_driver --model DIR --batch FILE.json --out OUT.safetensors [--steps K] [--lr F]
 *     [--weight_decay F] [--beta1 F] [--beta2 F] [--eps F] [--max_grad_norm F] [--gradient_checkpointing [selective]]
 *     [--finetuning_type full|lora|freeze] [--lora_rank R] [--lora_alpha F (0 = 2R)] [--lora_target LIST]
 *     [--use_rslora] [--use_dora] [--lora_dropout P --dropout_seed S] [--loraplus_lr_ratio X] [--num_layer_trainable N] [--freeze_trainable_modules LIST] [--freeze_extra_modules LIST] [--additional_target LIST] [--adapter DIR_OR_FILE] [--adapter_seed S]
 *     [--finetuning_type ptuning --pre_seq_len P [--prefix_projection]]
 *     [--quantization_bit 4|8] [--quantization_type int|nf4]  (the frozen linear weights quantized)
 *     [--use_llama_pro]  (with freeze: every (L / num_layer_trainable)-th layer trains, LLaMA Pro's rule)
 *     [--badam_interval K --badam_order ascending|descending|random|fixed [--badam_start S] [--seed N]]
 *       (BAdam, optim/badam.h: one whole layer trains, the next taking over with a fresh AdamW state
 *       as the trainer does it; OUT also holds "blocks" [K], the layer each step trained)
 *     [--galore_rank R [--galore_gap K] [--galore_scale S] [--galore_proj std|reverse_std|right|left|full]
 *      [--galore_target LIST]]  (GaLore, optim/galore.h, with full or freeze)
 *     [--pref_loss sigmoid|hinge|ipo|orpo|simpo --pref_beta B [--pref_ftx F] [--simpo_gamma G]
 *      [--label_smoothing S] [--ref c0,r0,c1,r1,...]]  (train/pref.h: the batch's rows are P chosen
 *      examples then their P rejected ones; "loss" is the mean over the pairs, the gradients of it)
 *     [--value_head DIR [--summary_dropout_prob P]]  (--stage rm: DIR/value_head.safetensors scores each
 *      row's last token, the pairs as above under the pairwise loss; dropout's mask from --dropout_seed)
 *     [--keep_all_rows]  (the top layer computes every row, not only the supervised ones)
 *     [--pref_loss kto --kto_tags 1,0,... [--kto_weights WD,WU]]  (--stage kto: rows 0..P-1 the examples
 *      (tag 1 desirable), P..2P-1 their KL examples; --ref gives each one's reference value and its KL's;
 *      --kto_split: the KL rows forward only first, then the examples' rows alone, as the trainer runs them)
 * OUT holds "loss" [1], "grad_norm" [1], "grad/<name>", "losses" [K], "param/<name>" for the
 * trainable rows (m.tab), and after K > 0 steps "fparam/<name>" for the frozen rows (m.ftab);
 * "norm_bwd" [1] counts the first step's norm backward calls (the backward stops at the lowest
 * layer that trains, and skips that layer's input gradient over a frozen embedding).
 * LoRA adapters come from --adapter (a peft folder, or a safetensors file holding the row names
 * without peft's prefix), else glm_model_init_adapters(adapter_seed). P-Tuning v2's prefix
 * encoder (transformer.prefix_encoder.*) comes from --adapter FILE (a safetensors file with
 * those row names), else glm_model_init_adapters(adapter_seed). Dropout stays 0 (the prefix's;
 * LoRA's unless --lora_dropout P: its masks are backend/mask_hash.h's from --dropout_seed S, the
 * same every step, which tests/py/glm_ref.py's lora_masks rebuilds). */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "core/fileutil.h"
#include "io/safetensors.h"
#include "model/adapter.h"
#include "model/glm.h"
#include "optim/adamw.h"
#include "optim/badam.h"
#include "train/pref.h"

static int die(glm_err *e) { glm_err_print(e); return 1; }

/* The CPU backend's norm backward ops, wrapped to count their calls (this tool only). */
static struct {
    void (*ln)(glm_backend *, void *, void *, void *, const void *, const void *, const void *, const float *,
               const float *, int, int);
    void (*rms)(glm_backend *, void *, void *, const void *, const void *, const void *, const float *, int, int);
    int calls;
} norm_count;
static void counted_ln_bwd(glm_backend *be, void *dx, void *dw, void *db, const void *dout, const void *x,
                           const void *w, const float *mean, const float *rstd, int N, int C) {
    norm_count.calls++;
    norm_count.ln(be, dx, dw, db, dout, x, w, mean, rstd, N, C);
}
static void counted_rms_bwd(glm_backend *be, void *dx, void *dw, const void *dout, const void *x, const void *w,
                            const float *rstd, int N, int C) {
    norm_count.calls++;
    norm_count.rms(be, dx, dw, dout, x, w, rstd, N, C);
}

/* Reads {"input_ids": [[..]], "labels": [[..]]} into a right-padded batch. */
static int read_batch(const char *path, const glm_config *c, glm_batch *b, glm_err *err) {
    char *text = glm_read_file(path, NULL, err);
    if (!text) return -1;
    cJSON *o = cJSON_Parse(text);
    free(text);
    cJSON *ids = cJSON_GetObjectItem(o, "input_ids"), *labels = cJSON_GetObjectItem(o, "labels");
    if (!cJSON_IsArray(ids) || !cJSON_IsArray(labels) || cJSON_GetArraySize(ids) != cJSON_GetArraySize(labels)) {
        cJSON_Delete(o);
        return glm_fail(err, "%s: need input_ids and labels arrays of equal length", path);
    }
    int B = cJSON_GetArraySize(ids), T = 0;
    for (int r = 0; r < B; r++) if (cJSON_GetArraySize(cJSON_GetArrayItem(ids, r)) > T) T = cJSON_GetArraySize(cJSON_GetArrayItem(ids, r));
    glm_batch_alloc(b, B, T);
    int32_t *row = glm_malloc(sizeof(int32_t) * T), *lab = glm_malloc(sizeof(int32_t) * T);
    for (int r = 0; r < B; r++) {
        cJSON *ri = cJSON_GetArrayItem(ids, r), *rl = cJSON_GetArrayItem(labels, r);
        int n = cJSON_GetArraySize(ri);
        for (int i = 0; i < n; i++) {
            row[i] = cJSON_GetArrayItem(ri, i)->valueint;
            lab[i] = cJSON_GetArrayItem(rl, i)->valueint;
        }
        glm_batch_set_row(b, r, row, lab, n, c->pad_token_id, c->gmask_token_id, c->mask_token_id, c->bos_token_id);
    }
    glm_batch_count_targets(b);
    free(row); free(lab);
    cJSON_Delete(o);
    return 0;
}

int main(int argc, char **argv) {
    const char *model = NULL, *batch_path = NULL, *out = NULL;
    const char *ft = "full", *targets = "query_key_value", *adapter = NULL, *qtype = NULL;
    const char *freeze_modules = "all", *freeze_extra = "", *additional = "";
    int qbits = 0, llama_pro = 0;
    int badam_interval = 0, badam_start = -1;
    int galore_rank = 0, galore_gap = 200;
    float galore_scale = 2.0f;
    const char *galore_proj = "std", *galore_target = "all";
    const char *badam_order = "ascending";
    unsigned long long seed = 42;
    int dora = 0;
    float lora_dropout = 0.0f;
    unsigned long long dropout_seed = 0;
    int steps = 0, ckpt = 0, rank = 8, rslora = 0, n_trainable = 2, pre_seq_len = 0, projection = 0;
    float alpha = 0.0f, loraplus = 0.0f;
    unsigned long long adapter_seed = 1;
    float lr = 1e-3f, wd = 0.0f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, max_norm = 0.0f;
    const char *pref_loss = NULL, *pref_ref = NULL, *value_head = NULL, *kto_tags = NULL;
    float summary_dropout = 0.0f;
    int keep_all = 0; /* --keep_all_rows: the top layer computes every row (glm.h keep_all_rows) */
    int kto_split = 0; /* --kto_split: the KL rows forward only first, then the examples alone (as the trainer) */
    glm_pref_cfg pref = {.beta = 0.1, .simpo_gamma = 0.5, .kto_desirable = 1, .kto_undesirable = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (strcmp(a, name) == 0 && v && (i++, 1))
        if (ARG("--model")) model = v;
        else if (ARG("--batch")) batch_path = v;
        else if (ARG("--out")) out = v;
        else if (ARG("--steps")) steps = atoi(v);
        else if (ARG("--lr")) lr = strtof(v, NULL);
        else if (ARG("--weight_decay")) wd = strtof(v, NULL);
        else if (ARG("--beta1")) b1 = strtof(v, NULL);
        else if (ARG("--beta2")) b2 = strtof(v, NULL);
        else if (ARG("--eps")) eps = strtof(v, NULL);
        else if (ARG("--max_grad_norm")) max_norm = strtof(v, NULL);
        else if (strcmp(a, "--gradient_checkpointing") == 0)
            ckpt = v && strcmp(v, "selective") == 0 ? (i++, GLM_CKPT_SELECTIVE) : GLM_CKPT_FULL;
        else if (ARG("--finetuning_type")) ft = v;
        else if (ARG("--lora_rank")) rank = atoi(v);
        else if (ARG("--lora_alpha")) alpha = strtof(v, NULL);
        else if (ARG("--lora_target")) targets = v;
        else if (strcmp(a, "--use_rslora") == 0) rslora = 1;
        else if (strcmp(a, "--use_dora") == 0) dora = 1;
        else if (ARG("--lora_dropout")) lora_dropout = strtof(v, NULL);
        else if (ARG("--dropout_seed")) dropout_seed = strtoull(v, NULL, 10);
        else if (ARG("--loraplus_lr_ratio")) loraplus = strtof(v, NULL);
        else if (ARG("--num_layer_trainable")) n_trainable = atoi(v);
        else if (ARG("--freeze_trainable_modules")) freeze_modules = v;
        else if (ARG("--freeze_extra_modules")) freeze_extra = v;
        else if (ARG("--additional_target")) additional = v;
        else if (ARG("--adapter")) adapter = v;
        else if (ARG("--adapter_seed")) adapter_seed = strtoull(v, NULL, 10);
        else if (ARG("--pre_seq_len")) pre_seq_len = atoi(v);
        else if (strcmp(a, "--prefix_projection") == 0) projection = 1;
        else if (ARG("--quantization_bit")) qbits = atoi(v);
        else if (ARG("--quantization_type")) qtype = v;
        else if (strcmp(a, "--use_llama_pro") == 0) llama_pro = 1;
        else if (ARG("--badam_interval")) badam_interval = atoi(v);
        else if (ARG("--badam_order")) badam_order = v;
        else if (ARG("--badam_start")) badam_start = atoi(v);
        else if (ARG("--seed")) seed = strtoull(v, NULL, 10);
        else if (ARG("--galore_rank")) galore_rank = atoi(v);
        else if (ARG("--galore_gap")) galore_gap = atoi(v);
        else if (ARG("--galore_scale")) galore_scale = strtof(v, NULL);
        else if (ARG("--galore_proj")) galore_proj = v;
        else if (ARG("--galore_target")) galore_target = v;
        else if (ARG("--pref_loss")) pref_loss = v;
        else if (ARG("--pref_beta")) pref.beta = strtod(v, NULL);
        else if (ARG("--pref_ftx")) pref.ftx = strtod(v, NULL);
        else if (ARG("--simpo_gamma")) pref.simpo_gamma = strtod(v, NULL);
        else if (ARG("--label_smoothing")) pref.label_smoothing = strtod(v, NULL);
        else if (ARG("--ref")) pref_ref = v;
        else if (ARG("--value_head")) value_head = v;
        else if (ARG("--kto_tags")) kto_tags = v;
        else if (strcmp(a, "--kto_split") == 0) kto_split = 1;
        else if (ARG("--kto_weights")) sscanf(v, "%lf,%lf", &pref.kto_desirable, &pref.kto_undesirable);
        else if (ARG("--summary_dropout_prob")) summary_dropout = strtof(v, NULL);
        else if (strcmp(a, "--keep_all_rows") == 0) keep_all = 1;
        else { fprintf(stderr, "unknown argument %s\n", a); return 2; }
#undef ARG
    }
    if (!model || !batch_path || !out) { fprintf(stderr, "usage: see the header of tool_model_driver.c\n"); return 2; }
    glm_err err;
    glm_config c;
    if (glm_config_load(&c, model, &err)) return die(&err);
    /* what trains decides the table, so it is set before glm_model_init */
    glm_badam bs = {.order = glm_badam_parse_order(badam_order), .start = badam_start, .interval = badam_interval,
                    .blocks = c.num_layers, .seed = seed};
    if (badam_interval > 0) {
        if (bs.order < 0) { fprintf(stderr, "--badam_order %s: ascending, descending, random or fixed\n", badam_order); return 2; }
        c.peft = (glm_peft){.kind = GLM_FT_FREEZE, .badam = 1, .badam_layer = glm_badam_block(&bs, 1)};
    } else if (strcmp(ft, "lora") == 0) {
        c.peft = (glm_peft){.kind = GLM_FT_LORA, .lora_rank = rank, .lora_alpha = alpha > 0 ? alpha : 2.0f * rank,
                            .use_rslora = rslora, .use_dora = dora, .loraplus_lr_ratio = loraplus,
                            .lora_dropout = lora_dropout};
        if (glm_lora_targets_parse(targets, &c.peft.lora_targets, &err) ||
            glm_modules_parse(&c, "--additional_target", additional, 1, &c.peft.extra_modules, &err) ||
            glm_extra_modules_check(&c, &c.peft, "--additional_target", &err))
            return die(&err);
    } else if (strcmp(ft, "freeze") == 0) {
        c.peft = (glm_peft){.kind = GLM_FT_FREEZE, .num_layer_trainable = n_trainable,
                            .llama_pro = llama_pro && n_trainable > 0 ? c.num_layers / n_trainable : 0};
        if (glm_modules_parse(&c, "--freeze_trainable_modules", freeze_modules, 0, &c.peft.freeze_modules, &err) ||
            glm_modules_parse(&c, "--freeze_extra_modules", freeze_extra, 1, &c.peft.extra_modules, &err))
            return die(&err);
    } else if (strcmp(ft, "ptuning") == 0) {
        if (pre_seq_len <= 0) { fprintf(stderr, "--finetuning_type ptuning needs --pre_seq_len P > 0\n"); return 2; }
        c.peft = (glm_peft){.kind = GLM_FT_PTUNING, .pre_seq_len = pre_seq_len, .prefix_projection = projection,
                            .prefix_dropout = 0.0f};
    } else if (strcmp(ft, "full") != 0) {
        fprintf(stderr, "--finetuning_type %s: full, lora, ptuning or freeze\n", ft);
        return 2;
    }
    if (galore_rank > 0) {
        c.peft.galore_rank = galore_rank;
        c.peft.galore_gap = galore_gap;
        c.peft.galore_scale = galore_scale;
        c.peft.galore_proj = glm_galore_proj_parse(galore_proj);
        snprintf(c.peft.galore_target, sizeof c.peft.galore_target, "%s", galore_target);
        if (c.peft.galore_proj < 0) { fprintf(stderr, "--galore_proj %s: std, reverse_std, right, left or full\n", galore_proj); return 2; }
    }
    if (glm_config_set_quant(&c, qbits, qtype, model, &err)) return die(&err);
    c.value_head = value_head != NULL;
    c.value_head_dropout = summary_dropout;
    glm_backend *be = glm_backend_cpu();
    norm_count.ln = be->layernorm_bwd;
    norm_count.rms = be->rmsnorm_bwd;
    be->layernorm_bwd = counted_ln_bwd;
    be->rmsnorm_bwd = counted_rms_bwd;
    glm_model m;
    glm_model_init(&m, &c, be);
    m.gradient_checkpointing = ckpt;
    if (glm_model_load(&m, model, &err)) return die(&err);
    if (c.peft.kind == GLM_FT_LORA) {
        int rc = !adapter ? (glm_model_init_adapters(&m, adapter_seed), 0)
                 : glm_is_dir(adapter) ? glm_adapter_load(&m, adapter, &err)
                                       : glm_model_load_adapter_file(&m, adapter, "", &err);
        if (rc) return die(&err);
    } else if (c.peft.kind == GLM_FT_PTUNING) {
        if (!adapter) glm_model_init_adapters(&m, adapter_seed);
        else if (glm_model_load_adapter_file(&m, adapter, "", &err)) return die(&err);
    }
    if (value_head && glm_model_load_value_head(&m, value_head, 1, &err)) return die(&err);
    glm_batch b;
    if (read_batch(batch_path, &c, &b, &err)) return die(&err);
    glm_model_set_dropout_seed(&m, dropout_seed); /* every step draws the same masks (tests rebuild them) */
    if (lora_dropout > 0 || keep_all) m.keep_all_rows = 1; /* the top layer's masks over every row, as the reference draws them */

    size_t total = m.tab.total;
    float *grads = glm_malloc(total * sizeof(float)), *params = glm_malloc(total * sizeof(float));
    float *losses = glm_calloc(steps > 0 ? steps : 1, sizeof(float));
    float *blocks = glm_calloc(steps > 0 ? steps : 1, sizeof(float));
    glm_tensor *rows0 = glm_malloc(((size_t)m.tab.n + 1) * sizeof *rows0); /* the first step's rows (BAdam moves them) */
    memcpy(rows0, m.tab.t, (size_t)m.tab.n * sizeof *rows0);
    int nrows0 = m.tab.n;
    float loss0 = 0, norm0 = 0, norm_bwd = 0;
    glm_adamw opt;
    glm_adamw_init(&opt, &m, lr, b1, b2, eps, wd);
    double *ref_vals = NULL;
    if (value_head) pref_loss = "rm";
    if (pref_loss) {
        if (value_head) pref.loss = GLM_PREF_RM;
        else if (!strcmp(pref_loss, "kto")) pref.loss = GLM_PREF_KTO;
        else if (glm_pref_loss_parse(pref_loss, &pref.loss)) { fprintf(stderr, "unknown --pref_loss %s\n", pref_loss); return 2; }
        if (pref_ref) {
            ref_vals = glm_calloc((size_t)b.B, sizeof(double));
            const char *p = pref_ref;
            for (int i = 0; i < b.B && *p; i++) {
                char *end;
                ref_vals[i] = strtod(p, &end);
                p = *end == ',' ? end + 1 : end;
            }
        }
    }
    int nsteps = steps > 0 ? steps : 1;
    for (int s = 0; s < nsteps; s++) {
        glm_zero_grads(&m);
        float loss;
        if (pref_loss) {
            int P = b.B / 2;
            uint8_t tags[64] = {0};
            for (int u = 0; kto_tags && u < P && u < 64; u++) tags[u] = kto_tags[2 * u] == '1';
            glm_pref_batch pb = {.cfg = &pref, .ref = ref_vals, .tags = tags};
            double kl[64];
            glm_batch rows = b;
            if (kto_split) {
                glm_pref_kl_sums(&m, &b, kl);
                pb.kl_sums = kl;
                rows = glm_batch_rows(&b, 0, P);
            }
            loss = (float)(glm_forward_backward_weighted(&m, &rows, 1.0f / P, glm_pref_weigh, &pb) / P);
        } else {
            double sum = glm_forward_backward(&m, &b, 1.0f / b.n_targets);
            loss = (float)(sum / b.n_targets);
        }
        double norm = glm_grad_norm(&m, 1.0f);
        if (s == 0) {
            loss0 = loss; norm0 = (float)norm; norm_bwd = (float)norm_count.calls;
            be->download_f32(be, grads, m.grads, total);
        }
        losses[s] = loss;
        blocks[s] = (float)m.cfg.peft.badam_layer;
        if (steps > 0) glm_adamw_step(&opt, &m, lr, glm_clip_coef(norm, max_norm));
        if (badam_interval > 0 && glm_badam_round(&bs, s + 2) != glm_badam_round(&bs, s + 1)) { /* as train.c's turn */
            glm_model_train_layer(&m, glm_badam_block(&bs, s + 2));
            glm_adamw_restart(&opt, &m);
            glm_adamw_master_from(&opt, &m, 0, 0, m.tab.total);
        }
    }
    glm_model_get_params(&m, params);
    size_t ftotal = m.ftab.total;
    float *fparams = glm_malloc((ftotal ? ftotal : 1) * sizeof(float));
    if (ftotal) be->download_f32(be, fparams, m.fparams, ftotal);

    int ne = 0;
    st_entry *e = glm_calloc(2 * m.tab.n + m.ftab.n + 5, sizeof *e);
    char (*names)[160] = glm_calloc(2 * m.tab.n + m.ftab.n, 160);
    e[ne++] = (st_entry){.name = "loss", .ndim = 1, .shape = {1}, .data = &loss0, .data_dtype = ST_F32, .file_dtype = ST_F32};
    e[ne++] = (st_entry){.name = "grad_norm", .ndim = 1, .shape = {1}, .data = &norm0, .data_dtype = ST_F32, .file_dtype = ST_F32};
    e[ne++] = (st_entry){.name = "norm_bwd", .ndim = 1, .shape = {1}, .data = &norm_bwd, .data_dtype = ST_F32, .file_dtype = ST_F32};
    if (steps > 0) e[ne++] = (st_entry){.name = "losses", .ndim = 1, .shape = {steps}, .data = losses, .data_dtype = ST_F32, .file_dtype = ST_F32};
    if (steps > 0 && badam_interval > 0)
        e[ne++] = (st_entry){.name = "blocks", .ndim = 1, .shape = {steps}, .data = blocks, .data_dtype = ST_F32, .file_dtype = ST_F32};
    for (int i = 0; i < m.tab.n; i++) {
        for (int k = 0; k < 2; k++) {
            const glm_tensor *t = k ? &m.tab.t[i] : i < nrows0 ? &rows0[i] : NULL;
            if ((k == 1 && steps == 0) || !t) continue;
            char *nm = names[2 * i + k];
            snprintf(nm, 160, "%s%s", k ? "param/" : "grad/", t->name);
            e[ne] = (st_entry){.name = nm, .ndim = t->ndim, .data = (k ? params : grads) + t->offset,
                               .data_dtype = ST_F32, .file_dtype = ST_F32};
            e[ne].shape[0] = t->shape[0]; e[ne].shape[1] = t->shape[1];
            ne++;
        }
    }
    for (int i = 0; i < m.ftab.n && steps > 0; i++) { /* frozen rows: must come out as they went in */
        const glm_tensor *t = &m.ftab.t[i];
        char *nm = names[2 * m.tab.n + i];
        snprintf(nm, 160, "fparam/%s", t->name);
        e[ne] = (st_entry){.name = nm, .ndim = t->ndim, .data = fparams + t->offset, .data_dtype = ST_F32, .file_dtype = ST_F32};
        e[ne].shape[0] = t->shape[0]; e[ne].shape[1] = t->shape[1];
        ne++;
    }
    if (st_save(out, e, ne, 0, &err)) return die(&err);
    printf("loss %.8f grad_norm %.8f supervised %d\n", loss0, norm0, b.n_targets);
    glm_adamw_free(&opt, &m);
    glm_model_free(&m);
    glm_batch_free(&b);
    be->destroy(be);
    free(grads); free(params); free(fparams); free(losses); free(blocks); free(rows0); free(e); free(names); free(ref_vals);
    return 0;
}
