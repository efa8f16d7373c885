/* Training throughput of the CUDA backend on ChatGLM-6B shapes (glm_config_chatglm6b with an
 * untied head), random init on the device, AdamW with fp32 master weights over the trainable
 * rows, rows of half prompt / half answer (labels on the answer half only). Full fine-tuning by
 * default; --lora R trains LoRA adapters of rank R on a frozen base (alpha 2R and dropout 0.05
 * as `glmtrain train`'s defaults, targets query_key_value or all four linear modules), --freeze N
 * the last N layers (LLaMA-Factory's freeze mode).
 *
 *   bench_train [--fp32 [--tf32] | --fp16] [--runs 512x4,512x8,512x8c,2048x2] [--steps 6] [--warmup 2]
 *               [--layers L] [--head_chunk R] [--detail] [--out FILE]
 *               [--lora R [--lora_target qkv|all|NAMES] [--lora_alpha A] [--lora_dropout P] [--dora]]
 *               [--freeze N] [--ptuning P [--prefix_projection]] [--quant int8|int4|nf4] [--tied]
 *               [--family chatglm|chatglm2] [--optim adamw_8bit] [--offload] [--in_backward] [--all_rows]
 *               [--vary_prompts]
 * (--detail: one more step with an event at every op, printed as a per-op table; --head_chunk:
 * rows of logits per head/loss chunk, the model's default when absent; --lora_target also takes
 * peft's comma-separated module names, e.g. query_key_value,dense)
 *
 * A run "TxB" is seq T, micro-batch B; a trailing "c" turns on gradient checkpointing (full), "s"
 * selective checkpointing (the norms, attention and activation rebuilt in backward). Each run
 * builds a fresh model and optimizer (checkpointing changes the activation layout) and times
 * whole optimizer steps: zero grads, forward + backward, grad norm + clip, AdamW. Reported:
 * tokens/s (all B*T tokens), MFU = tok/s * F / 989e12 with N = all parameters of the model
 * (trainable + frozen) and
 *   full fine-tuning:  F = 6N + 12 L H T   (the formula of docs/PERF.md)
 *   LoRA, P-Tuning:    F = 4N + 12 L H T   (the work that is needed: forward 2N and the input
 *                      gradients 2N; no weight gradients of the frozen base; attention's forward
 *                      and backward are the same as for full fine-tuning; the adapters' own
 *                      FLOPs, ~0.3% at r = 8, are not counted),
 *   freeze (last n):   F = 2N + 4 N_l + 2 N_head + (4 L + 8 n) H T   (forward; backward only
 *                      through the n trainable layers, N_l their parameters: input and weight
 *                      gradients; the head's input gradient; attention forward in every layer,
 *                      backward in the n),
 * peak GPU memory, time from the run's start (and from the process start) to the end of its
 * first step, and the step-time split from one profiled step. The label names the fine-tuning
 * kind: 512x8+lora8 (query_key_value), 512x8+lora8all (all four), 512x4+ckpt+lora8,
 * 512x8+freeze2. --quant stores the frozen linear weights quantized (random integers,
 * bench_common.h); --tied ties the head to the embedding as the chatglm-6b download does (the
 * memory bars of issue 17 are for that model); --family chatglm2 takes ChatGLM2-6B's shapes (the
 * ChatGLM2 block; ids of its tokenizer), its label ending in "+glm2". --optim adamw_8bit,
 * --offload (the optimizer state in host memory) and --in_backward (each unit updated inside
 * backward; no clipping) run the step through parallel/dp/dp.h as `glmtrain train` does with
 * --optim, --offload_optimizer cpu and --optimizer_in_backward; the label adds +8bit, +off, +ib.
 * --all_rows: the top layer computes every row past its attention, not only the supervised ones
 * (the model's keep_all_rows; label +allrows), to time what that saves. --vary_prompts: each
 * step its own batch, the rows' prompts of random lengths, so the supervised tokens differ from
 * step to step as in real data (label +vary). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "bench_common.h"
#include "core/rng.h"
#include "model/glm.h"
#include "optim/adamw.h"
#include "parallel/dp/dp.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Row: prompt of T/2-1 random tokens, [gMASK], <sop>, answer tokens, <eop> = T tokens. */
/* B rows of T tokens: a prompt, [gMASK] <sop>, an answer and <eop>, labels on the answer. The
 * prompt is half the row, or with vary a length drawn per row from [T/4, 3T/4) (as real data,
 * whose supervised tokens differ from batch to batch). */
static void make_batch(glm_batch *b, const glm_config *c, int B, int T, uint64_t seed, int vary) {
    glm_rng r;
    glm_rng_seed(&r, seed);
    glm_batch_alloc(b, B, T);
    int32_t *ids = malloc(sizeof(int32_t) * T), *lab = malloc(sizeof(int32_t) * T);
    for (int row = 0; row < B; row++) {
        int n = 0;
        int top = c->vocab_size - 10 < 120000 ? c->vocab_size - 10 : 120000;
        int prompt = vary ? T / 4 + (int)glm_rng_below(&r, T / 2) : T / 2;
        for (int i = 0; i < prompt - 1; i++) ids[n++] = 5 + (int)glm_rng_below(&r, top);
        ids[n++] = c->gmask_token_id;
        int ctx = n;
        ids[n++] = c->bos_token_id;
        while (n < T - 1) ids[n++] = 5 + (int)glm_rng_below(&r, top);
        ids[n++] = c->eos_token_id;
        for (int i = 0; i < T; i++) lab[i] = i < ctx ? -100 : ids[i];
        glm_batch_set_row(b, row, ids, lab, T, c->pad_token_id, c->gmask_token_id, c->mask_token_id, c->bos_token_id);
    }
    glm_batch_count_targets(b);
    free(ids);
    free(lab);
}

/* HF-style init on the device: N(0, 0.02) matrices, LayerNorm weights 1, biases 0, for the rows
 * of both tables (trainable, then the frozen base); the LoRA adapters are left to
 * glm_model_init_adapters (A uniform, B = 0, as peft). */
static void init_device(glm_model *m) {
    for (int i = 0; i < glm_model_nrows(m); i++) {
        void *p;
        const glm_tensor *t = glm_model_row(m, i, &p);
        if (glm_is_extra(t->kind)) continue; /* adapters and the prefix encoder: glm_model_init_adapters */
        if (t->qtype) bench_fill_quantized(m, t, p, 1000 + (uint64_t)i);
        else if (t->ndim == 2) glm_cuda_fill_normal(m->be, p, t->numel, 1000 + (uint64_t)i, 0.02f);
        else if (t->kind == T_LN1_W || t->kind == T_LN2_W || t->kind == T_LNF_W) glm_cuda_fill(m->be, p, t->numel, 1.0f);
    }
}

/* glm_adamw_init without its host round trip of the master copy (27 GB each way here). */
static void adamw_init_device(glm_adamw *o, glm_model *m) {
    glm_backend *be = m->be;
    size_t n = m->tab.total;
    *o = (glm_adamw){.lr = 1e-5f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
    o->m = be->alloc(be, n * sizeof(float));
    o->v = be->alloc(be, n * sizeof(float));
    be->zero(be, o->m, n * sizeof(float));
    be->zero(be, o->v, n * sizeof(float));
    if (be->dtype != GLM_F32) {
        o->master = be->alloc(be, n * sizeof(float));
        be->to_f32(be, o->master, m->params, n);
    }
}

/* The step through parallel/dp/dp.h (one process), for the optimizer's other layouts. */
static double dp_step(glm_dp *dp, glm_model *m, const glm_batch *b, double *loss) {
    static uint64_t n_steps;
    double t0 = now();
    glm_err e;
    glm_model_set_dropout_seed(m, 0x5eed0000ULL + n_steps++);
    glm_dp_begin_step(dp, 1e-5f, 1);
    glm_dp_zero_grads(dp);
    glm_dp_micro_begin(dp, 1);
    *loss = glm_forward_backward(m, b, 1.0f / b->n_targets) / b->n_targets;
    double norm = 0, sum = 0;
    if (glm_dp_reduce_grads(dp, &e) || glm_dp_grad_norm(dp, 1.0f, &sum, &norm, &e) ||
        glm_dp_optimizer_step(dp, 1e-5f, dp->cfg.in_backward ? 1.0f : glm_clip_coef(norm, 1.0f), &e)) {
        fprintf(stderr, "bench_train: %s\n", e.msg);
        exit(1);
    }
    m->be->sync(m->be);
    return now() - t0;
}

static double step(glm_model *m, glm_adamw *o, const glm_batch *b, double *loss) {
    static uint64_t n_steps;
    double t0 = now();
    glm_model_set_dropout_seed(m, 0x5eed0000ULL + n_steps++); /* fresh LoRA dropout masks per step */
    glm_zero_grads(m);
    *loss = glm_forward_backward(m, b, 1.0f / b->n_targets) / b->n_targets;
    double norm = glm_grad_norm(m, 1.0f);
    glm_adamw_step(o, m, 1e-5f, glm_clip_coef(norm, 1.0f));
    m->be->sync(m->be);
    return now() - t0;
}

int main(int argc, char **argv) {
    double t_proc = now();
    glm_dtype dt = GLM_BF16;
    const char *runs = "512x4,512x8,512x8c,2048x2", *out = NULL;
    int steps = 6, warmup = 2, layers = 0, detail = 0, head_chunk = 0;
    int lora = 0, freeze = 0, ptuning = 0, projection = 0, quant = 0, tied = 0, glm2 = 0, all_rows = 0, vary = 0;
    float lora_alpha = 0, lora_dropout = 0.05f;
    int dora = 0;
    const char *lora_target = "qkv";
    int optim8 = 0, offload = 0, in_bwd = 0, tf32 = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--fp32")) dt = GLM_F32;
        else if (!strcmp(a, "--tf32")) tf32 = 1;
        else if (!strcmp(a, "--fp16")) dt = GLM_F16;
        else if (!strcmp(a, "--bf16")) dt = GLM_BF16;
        else if (!strcmp(a, "--runs")) { runs = v; i++; }
        else if (!strcmp(a, "--steps")) { steps = atoi(v); i++; }
        else if (!strcmp(a, "--warmup")) { warmup = atoi(v); i++; }
        else if (!strcmp(a, "--layers")) { layers = atoi(v); i++; }
        else if (!strcmp(a, "--out")) { out = v; i++; }
        else if (!strcmp(a, "--detail")) detail = 1;
        else if (!strcmp(a, "--head_chunk")) { head_chunk = atoi(v); i++; }
        else if (!strcmp(a, "--lora")) { lora = atoi(v); i++; }
        else if (!strcmp(a, "--lora_target")) { lora_target = v; i++; }
        else if (!strcmp(a, "--lora_alpha")) { lora_alpha = (float)atof(v); i++; }
        else if (!strcmp(a, "--lora_dropout")) { lora_dropout = (float)atof(v); i++; }
        else if (!strcmp(a, "--dora")) dora = 1;
        else if (!strcmp(a, "--freeze")) { freeze = atoi(v); i++; }
        else if (!strcmp(a, "--ptuning")) { ptuning = atoi(v); i++; }
        else if (!strcmp(a, "--prefix_projection")) projection = 1;
        else if (!strcmp(a, "--tied")) tied = 1;
        else if (!strcmp(a, "--all_rows")) all_rows = 1;
        else if (!strcmp(a, "--vary_prompts")) vary = 1;
        else if (!strcmp(a, "--optim")) { optim8 = glm_optim_parse(v) == GLM_OPTIM_ADAMW8; i++; }
        else if (!strcmp(a, "--offload")) offload = 1;
        else if (!strcmp(a, "--in_backward")) in_bwd = 1;
        else if (!strcmp(a, "--family")) { glm2 = !strcmp(v, "chatglm2"); i++; }
        else if (!strcmp(a, "--quant")) {
            quant = bench_parse_quant(v);
            if (quant < 0) { fprintf(stderr, "bench_train: --quant int8|int4|nf4\n"); return 2; }
            i++;
        }
        else { fprintf(stderr, "usage: see the header of bench/bench_train.c (unknown %s)\n", a); return 2; }
    }
    glm_config c = glm2 ? glm_config_chatglm2_6b() : glm_config_chatglm6b();
    if (glm2) { /* ChatGLM2's tokenizer: [gMASK] 64790, sop 64792, eos 2 (the config names none of the first two) */
        c.gmask_token_id = 64790; c.bos_token_id = 64792; c.mask_token_id = 64789;
    }
    c.tie_word_embeddings = tied && !glm2;
    if (layers > 0) c.num_layers = layers;
    char ftname[32] = "full"; /* the fine-tuning kind, for the label and the records */
    if (lora > 0 && freeze > 0) { fprintf(stderr, "bench_train: --lora and --freeze exclude each other\n"); return 2; }
    if (lora > 0) {
        glm_err e = {0};
        int bits = 0;
        const char *names = !strcmp(lora_target, "qkv") ? "query_key_value" : lora_target;
        if (glm_lora_targets_parse(names, &bits, &e)) { fprintf(stderr, "bench_train: --lora_target %s: %s\n", lora_target, e.msg); return 2; }
        c.peft = (glm_peft){.kind = GLM_FT_LORA, .lora_rank = lora, .lora_alpha = lora_alpha > 0 ? lora_alpha : 2.0f * lora,
                            .lora_dropout = dora ? 0.0f : lora_dropout, .lora_targets = bits, .use_dora = dora};
        snprintf(ftname, sizeof ftname, "%s%d%s", dora ? "dora" : "lora", lora,
                 bits == GLM_LORA_QKV ? "" : bits == GLM_LORA_ALL ? "all" : "x");
    } else if (ptuning > 0) { /* P-Tuning v2: a prefix of P tokens (THUDM's prefix dropout 0.1) */
        c.peft = (glm_peft){.kind = GLM_FT_PTUNING, .pre_seq_len = ptuning, .prefix_projection = projection, .prefix_dropout = 0.1f};
        snprintf(ftname, sizeof ftname, "ptuning%d%s", ptuning, projection ? "proj" : "");
    } else if (freeze > 0) {
        if (freeze > c.num_layers) { fprintf(stderr, "bench_train: --freeze %d > %d layers\n", freeze, c.num_layers); return 2; }
        c.peft = (glm_peft){.kind = GLM_FT_FREEZE, .num_layer_trainable = freeze};
        snprintf(ftname, sizeof ftname, "freeze%d", freeze);
    }
    int peft = c.peft.kind != GLM_FT_FULL;
    if (quant && !peft) { fprintf(stderr, "bench_train: --quant needs --lora, --ptuning or --freeze\n"); return 2; }
    c.quant = quant;
    if (quant || tied) {
        size_t n = strlen(ftname);
        snprintf(ftname + n, sizeof ftname - n, "%s%s%s", quant ? "+" : "", quant ? glm_qtype_name((glm_qtype)quant) : "",
                 tied ? "+tied" : "");
    }
    char err[256];
    glm_backend *be = glm_backend_cuda(0, dt, err, sizeof err);
    if (!be) { fprintf(stderr, "bench_train: %s\n", err); return 1; }
    be->allow_tf32 = tf32;
    be->tune_products = 1; /* as glmtrain train */
    FILE *f = out ? fopen(out, "a") : NULL;
    const char *dname = dt == GLM_F32 ? (tf32 ? "tf32" : "fp32") : dt == GLM_BF16 ? "bf16" : "fp16";
    printf("%-6s %-18s %9s %9s %6s %8s %8s %8s | %7s %7s %7s %7s  loss\n", "dtype", "run", "step_ms", "tok/s", "MFU",
           "peakGiB", "first_s", "proc_s", "gemm", "attn", "other", "optim");
    char spec[256];
    snprintf(spec, sizeof spec, "%s", runs);
    for (char *tok = strtok(spec, ","); tok; tok = strtok(NULL, ",")) {
        int T = 0, B = 0;
        char ck = 0;
        if (sscanf(tok, "%dx%d%c", &T, &B, &ck) < 2) { fprintf(stderr, "bad run %s\n", tok); return 2; }
        double t_run = now();
        glm_cuda_memory_reset_peak(be);
        glm_model m;
        glm_model_init(&m, &c, be);
        m.gradient_checkpointing = ck == 'c' ? GLM_CKPT_FULL : ck == 's' ? GLM_CKPT_SELECTIVE : GLM_CKPT_NONE;
        m.keep_all_rows = all_rows;
        if (head_chunk > 0) m.head_chunk = head_chunk; /* before the first forward sizes the logits */
        init_device(&m);
        if (c.peft.kind == GLM_FT_LORA || c.peft.kind == GLM_FT_PTUNING) glm_model_init_adapters(&m, 1);
        glm_adamw o;
        glm_dp *dp = NULL;
        int via_dp = optim8 || offload || in_bwd;
        if (via_dp) {
            glm_err e;
            glm_dp_cfg dc = {.zero_stage = 1, .bucket_mb = 400, .timeout = 1800, .optim = optim8 ? GLM_OPTIM_ADAMW8 : 0,
                             .offload = offload, .in_backward = in_bwd};
            if (glm_dp_open(&dp, &dc, &e) || glm_dp_attach(dp, &m, &o, 1e-5f, 0.9f, 0.999f, 1e-8f, 0.01f, &e)) {
                fprintf(stderr, "bench_train: %s\n", e.msg);
                return 1;
            }
        } else {
            adamw_init_device(&o, &m);
        }
        /* one batch, or with --vary_prompts one per step (made before the clock starts) */
        int nb = vary ? warmup + steps + 2 : 1, bi = 0;
        glm_batch *bs = calloc(nb, sizeof *bs);
        for (int i = 0; i < nb; i++) make_batch(&bs[i], &c, B, T, 42 + (uint64_t)i, vary);
#define STEP(l) (via_dp ? dp_step(dp, &m, &bs[bi % nb], (l)) : step(&m, &o, &bs[bi % nb], (l)))
        double loss = 0, first = 0, *ts = calloc(steps > 0 ? steps : 1, sizeof(double));
        for (int s = 0; s < warmup; s++, bi++) {
            STEP(&loss);
            if (s == 0) first = now();
        }
        for (int s = 0; s < steps; s++, bi++) ts[s] = STEP(&loss);
        if (warmup == 0 && steps > 0) first = t_run + ts[0];
        char order[256] = ""; /* the timed steps in the order they ran */
        for (int s = 0, at = 0; s < steps && at < (int)sizeof order - 12; s++)
            at += snprintf(order + at, sizeof order - at, "%s%.1f", s ? "," : "", ts[s] * 1e3);
        qsort(ts, steps, sizeof(double), cmp_d);
        double med = steps ? ts[steps / 2] : 0;
        /* one more step with per-category events */
        double split[GLM_PROF_NCAT] = {0}, l2;
        glm_cuda_profile(be, 1);
        double prof_wall = STEP(&l2), prof_gpu = 0;
        glm_cuda_profile_read(be, split);
        glm_cuda_profile(be, 0);
        for (int k = 0; k < GLM_PROF_NCAT; k++) prof_gpu += split[k];
        if (detail) { /* per-op table, sorted by time */
            char what[64];
            snprintf(what, sizeof what, "%dx%d%s, one step", T, B, ck == 'c' ? "+ckpt" : ck == 's' ? "+sel" : "");
            glm_cuda_profile(be, 2);
            STEP(&l2);
            bench_print_ops(be, what);
        }
        size_t used, peak, total;
        glm_cuda_memory(be, &used, &peak, &total);
        double tok = (double)B * T / med;
        double n_all = (double)m.tab.n_params + (double)m.ftab.n_params + (double)m.qtab.n_params; /* all rows */
        double flops_tok = (peft ? 4.0 : 6.0) * n_all + 12.0 * c.num_layers * c.hidden_size * (double)T;
        if (freeze > 0) {
            double n_l = 0;
            for (int i = 0; i < m.tab.n; i++)
                if (m.tab.t[i].layer >= 0) n_l += (double)m.tab.t[i].numel;
            flops_tok = 2.0 * n_all + 4.0 * n_l + 2.0 * (double)c.vocab_size * c.hidden_size +
                        (4.0 * c.num_layers + 8.0 * freeze) * c.hidden_size * (double)T;
        }
        double mfu = tok * flops_tok / 989e12;
        char label[80];
        snprintf(label, sizeof label, "%dx%d%s%s%s%s%s%s%s%s%s%s", T, B, ck == 'c' ? "+ckpt" : ck == 's' ? "+sel" : "", m.head_chunk != 256 ? "+hc" : "",
                 peft ? "+" : "", peft ? ftname : "", glm2 ? "+glm2" : "", optim8 ? "+8bit" : "", offload ? "+off" : "",
                 in_bwd ? "+ib" : "", all_rows ? "+allrows" : "", vary ? "+vary" : "");
        printf("%-6s %-18s %9.1f %9.0f %5.1f%% %8.1f %8.1f %8.1f | %7.1f %7.1f %7.1f %7.1f  %.4f\n", dname, label,
               med * 1e3, tok, 100 * mfu, peak / 1073741824.0, first - t_run, first - t_proc, split[GLM_PROF_GEMM],
               split[GLM_PROF_ATTN], split[GLM_PROF_OTHER], split[GLM_PROF_OPTIM], loss);
        /* the split's step: its wall time against the span of its events on the GPU (from its
         * first op to its end): the difference is time the GPU waited for the host */
        long plans, tuned;
        glm_cuda_gemm_counts(be, &plans, &tuned);
        printf("       steps (ms, in order): %s; the split's step %.1f ms, %.1f ms of it on the GPU; product plans %ld, timed %ld\n",
               order, prof_wall * 1e3, prof_gpu, plans, tuned);
        fflush(stdout);
        if (f)
            fprintf(f, "{\"dtype\":\"%s\",\"run\":\"%s\",\"seq\":%d,\"batch\":%d,\"ckpt\":%d,\"step_ms\":%.2f,\"tok_s\":%.1f,"
                       "\"mfu\":%.4f,\"peak_gib\":%.2f,\"first_step_s\":%.2f,\"from_process_start_s\":%.2f,\"gemm_ms\":%.1f,"
                       "\"attn_ms\":%.1f,\"other_ms\":%.1f,\"optim_ms\":%.1f,\"loss\":%.5f,\"n_params\":%.0f,\"n_trainable\":%zu,"
                       "\"head_chunk\":%d,\"ft\":\"%s\",\"lora_rank\":%d,\"lora_targets\":%d,\"freeze\":%d,"
                       "\"flops_per_token\":%.4g,\"steps_ms\":[%s],\"split_step_ms\":%.2f,\"split_gpu_ms\":%.2f}\n",
                    dname, label, T, B, m.gradient_checkpointing, med * 1e3, tok, mfu, peak / 1073741824.0, first - t_run, first - t_proc,
                    split[GLM_PROF_GEMM], split[GLM_PROF_ATTN], split[GLM_PROF_OTHER], split[GLM_PROF_OPTIM], loss,
                    n_all, m.tab.n_params, m.head_chunk, peft ? ftname : "full", lora, c.peft.lora_targets, freeze, flops_tok,
                    order, prof_wall * 1e3, prof_gpu);
        free(ts);
        for (int i = 0; i < nb; i++) glm_batch_free(&bs[i]);
        free(bs);
        glm_dp_close(dp, 1);
        glm_adamw_free(&o, &m);
        glm_model_free(&m);
#undef STEP
    }
    if (f) fclose(f);
    be->destroy(be);
    return 0;
}
