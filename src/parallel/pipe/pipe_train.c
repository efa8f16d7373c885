#include "parallel/pipe/pipe_train.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/fileutil.h"
#include "core/log.h"
#include "model/ckpt.h"
#include "parallel/comm/rendezvous.h"
#ifdef GLM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

const char *glm_plan_size_str(char *buf, size_t n, double bytes) {
    if (bytes >= 1073741824.0) snprintf(buf, n, "%.1f GiB", bytes / 1073741824.0);
    else snprintf(buf, n, "%.2f MiB", bytes / 1048576.0);
    return buf;
}

static int is_spec(const char *s) { return !s || !*s || !strcmp(s, "auto") || !strcmp(s, "thudm"); }

int glm_pp_map(const glm_par_opts *a, const glm_config *c, int cuda, glm_device_map *map, glm_stage_shape *sh,
               glm_err *err) {
    glm_stage_shape_init(sh);
    sh->dtype = !cuda || a->fp32 ? GLM_F32 : a->fp16 ? GLM_F16 : GLM_BF16;
    sh->B = a->per_device_train_batch_size;
    sh->T = a->seq_len;
    sh->gradient_checkpointing = a->gradient_checkpointing;
    sh->n_micro = a->num_microbatches > 0 ? a->num_microbatches : a->gradient_accumulation_steps;
    sh->head_chunk = cuda ? 2048 : 256; /* as glm_model_init_stage picks it */
    sh->optim = a->optim && glm_optim_parse(a->optim) == GLM_OPTIM_ADAMW8 ? GLM_OPTIM_ADAMW8 : GLM_OPTIM_ADAMW;
    sh->offload = a->offload_optimizer && strcmp(a->offload_optimizer, "cpu") == 0;
    sh->in_backward = a->optimizer_in_backward;
    int P = a->pipeline_parallel_size;
    if (P < 1) return glm_fail(err, "--pipeline_parallel_size must be at least 1");
    /* a map file alone says how many stages; the flag's default 1 does not contradict it */
    if (!is_spec(a->device_map) && P == 1) P = 0;
    if (P == 1) return glm_device_map_thudm(map, 1, c, err); /* the whole model as one stage */
    return glm_device_map_make(map, a->device_map, P, c, sh, err);
}

/* The data-parallel ranks that will exchange gradients by copies (dp.h glm_dp_peer_ranks; a stage
 * count > 1 is excluded by the plan, which knows the map). */
static int peer_ranks(const glm_par_opts *a, const glm_config *c, int cuda, int D) {
    return glm_dp_peer_ranks(cuda, D, a->zero_stage, a->nnodes <= 1, 1, c->peft.galore_rank > 0);
}

void glm_pp_print_plan(const glm_par_opts *a, const glm_config *c, int cuda, int D, FILE *out) {
    glm_device_map map;
    glm_stage_shape sh;
    glm_err err;
    if (glm_pp_map(a, c, cuda, &map, &sh, &err)) return;
    sh.dp = a->zero_stage >= 1 ? D / map.n : 1;
    sh.zero2 = a->zero_stage >= 2;
    sh.zero3 = a->zero_stage == 3;
    sh.peer_ranks = peer_ranks(a, c, cuda, D);
    for (int k = 0; k < map.n; k++) {
        glm_mem_plan p = glm_stage_memory_plan(c, &map, k, &sh);
        char sz[7][32], who[48] = "";
        if (map.n > 1) snprintf(who, sizeof who, " stage %d", k);
        fprintf(out, "[glmtrain] memory plan per device%s: %s = weights %s + gradients %s + master %s + moments %s + "
                     "activations %s + scratch %s\n", who, glm_plan_size_str(sz[0], 32, p.total), glm_plan_size_str(sz[1], 32, p.params),
                glm_plan_size_str(sz[2], 32, p.grads), glm_plan_size_str(sz[3], 32, p.master), glm_plan_size_str(sz[4], 32, p.moments),
                glm_plan_size_str(sz[5], 32, p.activations), glm_plan_size_str(sz[6], 32, p.scratch));
        if (p.host > 0) fprintf(out, "[glmtrain] host memory%s: %s (the offloaded optimizer state, master weights and staging)\n",
                                who, glm_plan_size_str(sz[0], 32, p.host));
    }
}

/* The layouts of one stage (no pipeline) that change only how the model states are kept, as
 * flags, in the order to try them: each fits with less speed given up than the next. */
typedef struct layout { const char *flags; int ckpt, optim, offload, in_backward, zero; } layout;
static const layout layouts[] = {
    {"--gradient_checkpointing selective", GLM_CKPT_SELECTIVE, GLM_OPTIM_ADAMW, 0, 0, -1},
    {"--gradient_checkpointing", 1, GLM_OPTIM_ADAMW, 0, 0, -1},
    {"--optim adamw_8bit", 0, GLM_OPTIM_ADAMW8, 0, 0, -1},
    {"--optim adamw_8bit --gradient_checkpointing", 1, GLM_OPTIM_ADAMW8, 0, 0, -1},
    {"--zero_stage 2 --gradient_checkpointing", 1, GLM_OPTIM_ADAMW, 0, 0, 2},
    {"--zero_stage 3 --gradient_checkpointing", 1, GLM_OPTIM_ADAMW, 0, 0, 3},
    {"--zero_stage 2 --optim adamw_8bit --gradient_checkpointing", 1, GLM_OPTIM_ADAMW8, 0, 0, 2},
    {"--zero_stage 3 --optim adamw_8bit --gradient_checkpointing", 1, GLM_OPTIM_ADAMW8, 0, 0, 3},
    {"--offload_optimizer cpu --gradient_checkpointing", 1, GLM_OPTIM_ADAMW, 1, 0, -1},
    {"--zero_stage 2 --offload_optimizer cpu --gradient_checkpointing", 1, GLM_OPTIM_ADAMW, 1, 0, 2},
    {"--offload_optimizer cpu --optim adamw_8bit --gradient_checkpointing", 1, GLM_OPTIM_ADAMW8, 1, 0, -1},
    {"--offload_optimizer cpu --optimizer_in_backward --max_grad_norm 0 --gradient_checkpointing", 1, GLM_OPTIM_ADAMW, 1, 1, -1},
    {"--offload_optimizer cpu --optim adamw_8bit --optimizer_in_backward --max_grad_norm 0 --gradient_checkpointing", 1,
     GLM_OPTIM_ADAMW8, 1, 1, -1},
};

/* The checkpointing level that keeps the fewer activations of a and b (none > selective > full). */
static int thriftier(int a, int b) {
    static const int saving[] = {[GLM_CKPT_NONE] = 0, [GLM_CKPT_FULL] = 2, [GLM_CKPT_SELECTIVE] = 1, [GLM_CKPT_AUTO] = 0};
    return saving[a] >= saving[b] ? a : b;
}

/* Appends "; FLAGS (plans X[, host Y])" to buf at *at; 1 when it fitted in buf. */
static int add_fit(char *buf, size_t n, size_t *at, int found, const char *flags, const glm_mem_plan *p) {
    char t1[32], t2[32];
    int w = snprintf(buf + *at, n - *at, "%s%s (plans %s%s%s)", found ? "; " : "", flags, glm_plan_size_str(t1, 32, p->total),
                     p->host > 0 ? ", host " : "", p->host > 0 ? glm_plan_size_str(t2, 32, p->host) : "");
    if (w < 0 || (size_t)w >= n - *at) return 0;
    *at += (size_t)w;
    return 1;
}

/* Adds `flags` for config c with shape s when its plan fits in cap as asked (checkpointing level
 * ckpt), else with full checkpointing (naming the flag too) when that is thriftier; 1 when added. */
static int add_fit_ckpt(const glm_config *c, const glm_device_map *map, glm_stage_shape s, int ckpt, double cap,
                        const char *flags, char *buf, size_t n, size_t *at, int found) {
    for (int pass = 0; pass < 2; pass++) {
        s.gradient_checkpointing = pass ? thriftier(GLM_CKPT_FULL, ckpt) : ckpt;
        if (pass && s.gradient_checkpointing == ckpt) break;
        glm_mem_plan p = glm_stage_memory_plan(c, map, 0, &s);
        if (p.total > cap) continue;
        char with[96];
        snprintf(with, sizeof with, "%s%s", flags, pass ? " --gradient_checkpointing" : "");
        return add_fit(buf, n, at, found, with, &p);
    }
    return 0;
}

/* Writes into buf the layouts of one stage that fit in cap, with their planned peak and host
 * memory (and LoRA's, for a full fine-tune); returns how many. */
static int fitting_layouts(const glm_par_opts *a, const glm_config *c, int cuda, int D, double cap, char *buf, size_t n) {
    glm_device_map map;
    glm_stage_shape sh;
    glm_err e;
    size_t at = 0;
    int found = 0;
    buf[0] = 0;
    if (glm_pp_map(a, c, cuda, &map, &sh, &e) || map.n != 1) return 0;
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0] && found < 3; i++) {
        const layout *l = &layouts[i];
        if (l->zero >= 0 && D < 2) continue;
        if (l->in_backward && (D > 1 || a->gradient_accumulation_steps > 1 || a->fp16)) continue;
        /* a level the run already has (or a thriftier one) is not a new layout */
        if (l->ckpt == GLM_CKPT_SELECTIVE && a->gradient_checkpointing != GLM_CKPT_NONE) continue;
        glm_stage_shape s = sh;
        s.gradient_checkpointing = thriftier(l->ckpt, a->gradient_checkpointing);
        s.optim = l->optim;
        s.offload = l->offload;
        s.in_backward = l->in_backward;
        int zero = l->zero >= 0 ? l->zero : a->zero_stage;
        s.dp = zero >= 1 ? D : 1;
        s.zero2 = zero >= 2;
        s.zero3 = zero == 3;
        glm_mem_plan p = glm_stage_memory_plan(c, &map, 0, &s);
        if (p.total > cap) continue;
        found += add_fit(buf, n, &at, found, l->flags, &p);
    }
    /* and BAdam, full fine-tuning one layer at a time (one process, or ranks under ZeRO-0/1 each
     * holding the whole model; its deepest backward, from layer 0), as asked or with checkpointing */
    if (c->peft.kind == GLM_FT_FULL && (D == 1 || a->zero_stage <= 1) && c->quant == GLM_Q_NONE) {
        glm_config bc = *c;
        bc.peft = (glm_peft){.kind = GLM_FT_FREEZE, .badam = 1, .badam_layer = 0};
        glm_stage_shape s = sh;
        s.dp = a->zero_stage >= 1 ? D : 1;
        found += add_fit_ckpt(&bc, &map, s, a->gradient_checkpointing, cap, "--use_badam", buf, n, &at, found);
    }
    /* and GaLore (LLaMA-Factory's defaults: rank 16 on every linear module; one process or ZeRO-0
     * ranks), as asked or with checkpointing */
    if (c->peft.kind == GLM_FT_FULL && !c->peft.galore_rank && (D == 1 || a->zero_stage == 0) && c->quant == GLM_Q_NONE &&
        sh.optim == GLM_OPTIM_ADAMW && !sh.offload && !a->optimizer_in_backward) {
        glm_config gc = *c; /* what the plan reads: the rank and the targets (std projections) */
        gc.peft.galore_rank = 16;
        gc.peft.galore_proj = GLM_GALORE_STD;
        snprintf(gc.peft.galore_target, sizeof gc.peft.galore_target, "all");
        glm_stage_shape s = sh;
        s.dp = 1;
        found += add_fit_ckpt(&gc, &map, s, a->gradient_checkpointing, cap, "--use_galore", buf, n, &at, found);
    }
    /* and LoRA (r = 8 on query_key_value, peft's example) */
    if (c->peft.kind == GLM_FT_FULL) {
        glm_config lc = *c;
        lc.peft = (glm_peft){.kind = GLM_FT_LORA, .lora_rank = 8, .lora_alpha = 16, .lora_dropout = 0.05f,
                             .lora_targets = GLM_LORA_QKV};
        glm_stage_shape s = sh;
        /* as asked, then with selective, then with full checkpointing: the first that fits */
        const int levels[3] = {a->gradient_checkpointing, GLM_CKPT_SELECTIVE, GLM_CKPT_FULL};
        static const char *const with[] = {"--finetuning_type lora", "--finetuning_type lora --gradient_checkpointing",
                                           "--finetuning_type lora --gradient_checkpointing selective"};
        for (int pass = 0; pass < 3; pass++) {
            int ck = levels[pass];
            if (pass && thriftier(ck, a->gradient_checkpointing) != ck) continue; /* keeps more than asked */
            s.gradient_checkpointing = ck;
            s.dp = a->zero_stage >= 1 ? D : 1;
            glm_mem_plan p = glm_stage_memory_plan(&lc, &map, 0, &s);
            if (p.total > cap) continue;
            found += add_fit(buf, n, &at, found, pass == 0 || ck == a->gradient_checkpointing ? with[0] : with[ck], &p);
            break;
        }
    }
    return found;
}


/* The largest plan over the stages of a's map (0 when the map cannot be made: the check reports
 * it) for a job of D ranks: D / stages replicas of each stage share its optimizer state under
 * ZeRO >= 1. */
static double worst_stage(const glm_par_opts *a, const glm_config *c, int cuda, int D) {
    glm_device_map map;
    glm_stage_shape sh;
    glm_err e;
    if (glm_pp_map(a, c, cuda, &map, &sh, &e)) return 0;
    sh.dp = a->zero_stage >= 1 && D > map.n ? D / map.n : 1;
    sh.zero2 = a->zero_stage >= 2;
    sh.zero3 = a->zero_stage == 3;
    sh.peer_ranks = peer_ranks(a, c, cuda, D);
    double worst = 0;
    for (int k = 0; k < map.n; k++) {
        double t = glm_stage_memory_plan(c, &map, k, &sh).total;
        worst = t > worst ? t : worst;
    }
    return worst;
}

/* Host memory the node's ranks would take (need, bytes, for all local ranks) against what is
 * available: 0 when it fits or is unknown, else -1 with the message naming both (`what` plans). */
static int over_host(const char *what, double need, int local_ranks, glm_err *err) {
    double have = glm_host_mem_available();
    if (have <= 0 || need <= have) return 0;
    char s1[32], s2[32];
    int r = local_ranks > 1 ? local_ranks : 1;
    return glm_fail(err, "%s plans %s of host memory on this node (%d rank%s) but %s is available", what,
                    glm_plan_size_str(s1, 32, need), r, r > 1 ? "s" : "", glm_plan_size_str(s2, 32, have));
}

int glm_pp_check_host_memory(const glm_par_opts *a, const glm_config *c, int cuda, int D, int local_ranks, glm_err *err) {
    glm_device_map map;
    glm_stage_shape sh;
    if (glm_pp_map(a, c, cuda, &map, &sh, err)) return -1;
    int r = local_ranks > 1 ? local_ranks : 1;
    if (!cuda && !sh.offload) { /* the CPU backend: every stage's states and activations are host memory; past
                                 * what is available the out-of-memory killer would end the run part-way, silently */
        if (!over_host("this CPU run", worst_stage(a, c, 0, D) * r, local_ranks, err)) return 0;
        return glm_hint(err, "the CPU backend trains small models and checks results; fine-tune a model of this size on a GPU "
                             "(LoRA fits a 24 GB card: --finetuning_type lora), or free host memory (the run would be killed "
                             "for memory part-way)");
    }
    if (!sh.offload || map.n != 1) return 0;
    sh.dp = a->zero_stage >= 1 ? D : 1;
    sh.zero2 = a->zero_stage >= 2;
    sh.zero3 = a->zero_stage == 3;
    if (!over_host("--offload_optimizer cpu", glm_stage_memory_plan(c, &map, 0, &sh).host * r, local_ranks, err)) return 0;
    return glm_hint(err, "%s; or free host memory (the run would be killed for memory part-way)",
                    sh.optim == GLM_OPTIM_ADAMW8 ? "shard it over more ranks with --zero_stage 2/3"
                                                 : "--optim adamw_8bit keeps the moments in a quarter of the bytes, or shard them over more ranks with --zero_stage 2/3");
}

/* The fewest stages above P (the auto split) whose every plan fits cap with a's other flags; 0
 * when none does. With D > 1 ranks the stages split those ranks (q divides D, the rest are
 * replicas); one process is told how many it would need. *worst: that split's largest plan. */
static int fewest_stages(const glm_par_opts *a, const glm_config *c, int cuda, int P, int D, double cap, double *worst) {
    glm_par_opts b = *a;
    b.device_map = "auto";
    for (int q = P + 1; q <= c->num_layers && q <= GLM_MAX_STAGES && (D == 1 || q <= D); q++) {
        if (D > 1 && D % q) continue;
        b.pipeline_parallel_size = q;
        *worst = worst_stage(&b, c, cuda, D);
        if (*worst <= 0) return 0;
        if (*worst <= cap) return q;
    }
    return 0;
}

int glm_pp_pick_checkpointing(const glm_par_opts *a, const glm_config *c, int cuda, int D, double cap, double *plan) {
    static const int order[] = {GLM_CKPT_NONE, GLM_CKPT_SELECTIVE, GLM_CKPT_FULL};
    glm_par_opts b = *a;
    for (int i = 0;; i++) { /* the last level is taken when nothing fits: the memory check then says what would */
        b.gradient_checkpointing = order[i];
        *plan = worst_stage(&b, c, cuda, D);
        if (cap <= 0 || *plan <= cap || i == 2) return order[i];
    }
}

/* Refuses a plan of any stage over cap bytes; `what` names the cap in the message. */
static int check_cap(const glm_par_opts *a, const glm_config *c, int cuda, int D, size_t cap, const char *what, glm_err *err) {
    glm_device_map map;
    glm_stage_shape sh;
    if (glm_pp_map(a, c, cuda, &map, &sh, err)) return -1;
    int P = map.n;
    sh.dp = a->zero_stage >= 1 ? D / P : 1;
    sh.zero2 = a->zero_stage >= 2;
    sh.zero3 = a->zero_stage == 3;
    sh.peer_ranks = peer_ranks(a, c, cuda, D);
    for (int k = 0; k < P; k++) {
        glm_mem_plan p = glm_stage_memory_plan(c, &map, k, &sh);
        if (p.total <= (double)cap) continue;
        char who[64] = "the model";
        if (P > 1) snprintf(who, sizeof who, "stage %d (layers %d-%d)", k, map.s[k].l0, map.s[k].l1 - 1);
        char sz[7][32];
        glm_fail(err, "%s: %s plans %s (weights %s, gradients %s, master %s, moments %s, "
                      "activations %s, scratch %s)", what, who, glm_plan_size_str(sz[0], 32, p.total),
                 glm_plan_size_str(sz[1], 32, p.params), glm_plan_size_str(sz[2], 32, p.grads), glm_plan_size_str(sz[3], 32, p.master),
                 glm_plan_size_str(sz[4], 32, p.moments), glm_plan_size_str(sz[5], 32, p.activations), glm_plan_size_str(sz[6], 32, p.scratch));
        /* the layouts of the model states that fit on one stage, and the fewest stages that would
         * fit with the auto split */
        char fits[2048] = "", stages[512] = "";
        if (P == 1) fitting_layouts(a, c, cuda, D, (double)cap, fits, sizeof fits);
        /* pipeline stages take neither offload nor the update inside backward */
        int pipe_ok = !(a->offload_optimizer && strcmp(a->offload_optimizer, "cpu") == 0) && !a->optimizer_in_backward;
        double worst = 0;
        int q = pipe_ok ? fewest_stages(a, c, cuda, P, D, (double)cap, &worst) : 0;
        if (q)
            snprintf(stages, sizeof stages, "--pipeline_parallel_size %d --device_map auto plans at most %s per stage "
                                            "(glmtrain info --pipeline_parallel_size %d shows it)", q, glm_plan_size_str(sz[0], 32, worst), q);
        /* and with 8-bit states, where that takes fewer stages (the guide's 4 x 24 GB: 4 stages) */
        glm_par_opts b8 = *a;
        b8.optim = "adamw_8bit";
        b8.gradient_checkpointing = thriftier(a->gradient_checkpointing, GLM_CKPT_SELECTIVE);
        double worst8 = 0;
        int q8 = pipe_ok && glm_optim_parse(a->optim) != GLM_OPTIM_ADAMW8
                     ? fewest_stages(&b8, c, cuda, P, D, (double)cap, &worst8) : 0;
        if (q8 && (!q || q8 < q)) {
            size_t k = strlen(stages);
            snprintf(stages + k, sizeof stages - k, "%s--pipeline_parallel_size %d --device_map auto --optim adamw_8bit%s "
                                                    "plans at most %s per stage", k ? "; or " : "", q8,
                     b8.gradient_checkpointing == GLM_CKPT_FULL ? " --gradient_checkpointing" : " --gradient_checkpointing selective",
                     glm_plan_size_str(sz[1], 32, worst8));
        }
        if (fits[0] && stages[0]) return glm_hint(err, "layouts that fit: %s; or %s", fits, stages);
        if (fits[0]) return glm_hint(err, "layouts that fit: %s", fits);
        if (stages[0]) return glm_hint(err, "%s", stages);
        return glm_hint(err, "add --gradient_checkpointing, lower --per_device_train_batch_size, or use more stages / ZeRO");
    }
    return 0;
}

int glm_pp_check_memory(const glm_par_opts *a, const glm_config *c, int cuda, int D, glm_err *err) {
    if (!a->max_memory_per_gpu) return 0;
    size_t cap;
    if (glm_parse_size(a->max_memory_per_gpu, &cap)) {
        glm_fail(err, "--max_memory_per_gpu %s is not a size", a->max_memory_per_gpu);
        return glm_hint(err, "write e.g. 70GiB, 80GB or 75000MB");
    }
    char what[96];
    snprintf(what, sizeof what, "--max_memory_per_gpu %s", a->max_memory_per_gpu);
    return check_cap(a, c, cuda, D, cap, what, err);
}

int glm_pp_check_device_memory(const glm_par_opts *a, const glm_config *c, int cuda, int D, size_t device_bytes,
                               glm_err *err) {
    if (a->max_memory_per_gpu || !device_bytes) return 0; /* the flag's own check decides */
    char what[96], sz[32];
    snprintf(what, sizeof what, "the GPU holds %s (no --max_memory_per_gpu given)", glm_plan_size_str(sz, sizeof sz, (double)device_bytes));
    return check_cap(a, c, cuda, D, device_bytes, what, err);
}

/* ---------------------------------------------------------------- setup */

static void arm(void *ctx, int last) { glm_dp_micro_begin((glm_dp *)ctx, last); }

#ifdef GLM_HAVE_CUDA
/* GPU ranks: rank 0's P + 1 NCCL ids (the pipeline's, then each stage's replicas') to everyone. */
static int nccl_ids(glm_pp *pp, int P, unsigned char *ids, glm_err *err) {
    glm_dp *dp = pp->dp;
    if (pp->world_rank == 0)
        for (int i = 0; i <= P; i++) if (glm_nccl_unique_id(ids + 128 * i, err)) return -1;
    if (dp->boot) { /* launched by mpirun: the ids travel over MPI (as floats of raw bytes) */
        size_t nf = 32 * (size_t)(P + 1);
        float *buf = glm_malloc(nf * sizeof(float));
        memcpy(buf, ids, nf * sizeof(float));
        int rc = dp->boot->bcast(dp->boot, buf, nf, GLM_C_F32, 0, "nccl ids", err) || dp->boot->wait(dp->boot, -1, err);
        memcpy(ids, buf, nf * sizeof(float));
        free(buf);
        return rc ? -1 : 0;
    }
    const char *addr = dp->dist.master_addr[0] ? dp->dist.master_addr : "127.0.0.1";
    if (dp->dist.master_port <= 0) {
        glm_fail(err, "rank %d: MASTER_PORT is not set (%s launch)", pp->world_rank, dp->dist.source);
        return glm_hint(err, "export MASTER_ADDR and MASTER_PORT, or start with glmtrain train --nproc_per_node N");
    }
    return glm_rdzv_exchange(addr, dp->dist.master_port, pp->world_rank, pp->world_size, ids, 128 * (size_t)(P + 1),
                             dp->cfg.timeout, err);
}
#endif

int glm_pp_open(glm_pp **out, glm_dp *dp, const glm_par_opts *a, const glm_config *c, glm_backend *be, glm_err *err) {
    glm_pp *pp = glm_calloc(1, sizeof *pp);
    *out = pp;
    pp->dp = dp;
    pp->world_rank = dp->rank;
    pp->world_size = dp->world;
    int cuda = glm_backend_on_gpu(be);
    glm_device_map map;
    glm_stage_shape sh;
    if (glm_pp_map(a, c, cuda, &map, &sh, err)) return -1;
    int P = map.n, W = dp->world;
    if (W < P || W % P) {
        glm_fail(err, "--pipeline_parallel_size %d needs a multiple of %d processes, this job has %d", P, P, W);
        return glm_hint(err, "start P x (data-parallel replicas) ranks: --nproc_per_node %d, or mpirun -np %d", P, P);
    }
    int D = W / P, stage = dp->rank % P, replica = dp->rank / P;
    unsigned char *ids = glm_calloc((size_t)(P + 1), 128);
    int rc = 0;
    glm_comm *group = NULL;
    if (cuda) {
#ifdef GLM_HAVE_CUDA
        rc = nccl_ids(pp, P, ids, err);
        if (!rc) rc = glm_comm_nccl_pipe(&pp->world, dp->rank, W, ids, glm_cuda_stream(be), dp->cfg.timeout, err);
        if (!rc && D > 1)
            rc = glm_comm_nccl(&group, replica, D, ids + 128 * (1 + stage), glm_cuda_stream(be), dp->cfg.timeout, err);
#endif
    } else if (!dp->boot) {
        rc = glm_fail(err, "--pipeline_parallel_size %d: CPU ranks communicate through MPI, but this is no MPI job", P);
        glm_hint(err, "start the ranks with mpirun -np %d, or glmtrain train --nproc_per_node %d", W > 1 ? W : P, W > 1 ? W : P);
    } else {
#ifdef GLM_HAVE_MPI
        /* a communicator of the pipeline's own (every rank in it), so its messages never match
         * the data-parallel collectives' */
        rc = glm_comm_mpi_split(dp->boot, 0, dp->rank, &pp->world, err);
        /* every rank takes part in the split (D is the same everywhere) */
        if (!rc && D > 1) rc = glm_comm_mpi_split(dp->boot, stage, replica, &group, err);
#endif
    }
    free(ids);
    if (rc) return -1;
    pp->world->timeout = dp->cfg.timeout;
    pp->world->interruptible = !dp->cfg.save_on_interrupt;
    if (glm_pipe_init(&pp->pipe, pp->world, &map, c, err)) return -1;
    /* from here on dp speaks for this stage's replicas */
    if (group) {
        group->timeout = dp->cfg.timeout;
        group->interruptible = !dp->cfg.save_on_interrupt;
        if (dp->comm != dp->boot) dp->comm->close(dp->comm);
        dp->comm = group;
    }
    dp->rank = replica;
    dp->world = D;
    glm_pipe_q8_file(dp->q8_file, sizeof dp->q8_file, stage, P); /* each stage's 8-bit moments in a file of its own */
    /* Gradient buckets are reduced over the replicas during the last backward, except on the
     * two stages holding a tied embedding: their copies' gradients must be summed first (with
     * ZeRO-2 a reduced shard of one stage does not line up with the other stage's shard). */
    int tied_end = c->tie_word_embeddings && P > 1 && (stage == 0 || stage == P - 1);
    pp->pipe.before_backward = tied_end ? NULL : arm;
    pp->pipe.hook_ctx = dp;
    pp->pipe.run_seed = (uint64_t)a->seed; /* dropout masks as one process draws them */
    if (pp->world_rank == 0) {
        glm_info("pipeline: %d stages x %d data-parallel replicas (%s), %d micro-batches per step:", P, D, map.source,
                 sh.n_micro);
        glm_device_map_print(stderr, &map);
    }
    glm_info("rank %d: stage %d, replica %d", pp->world_rank, stage, replica);
    return 0;
}

void glm_pp_close(glm_pp *pp, int ok) {
    if (!pp) return;
    if (!ok) {
        if (pp->world) pp->world->broken = 1;
        if (pp->pipe.tied) pp->pipe.tied->broken = 1;
        if (pp->pipe.dp) pp->pipe.dp->broken = 1;
    }
    glm_pipe_free(&pp->pipe);
    if (pp->world) pp->world->close(pp->world);
    free(pp);
}

void glm_pp_model_init(glm_pp *pp, glm_model *m, const glm_config *c, glm_backend *be) {
    glm_pipe_model_init(&pp->pipe, m, c, be);
}

int glm_pp_ready(glm_pp *pp, glm_err *err) { return glm_pipe_sync_tied(&pp->pipe, err); }

/* ---------------------------------------------------------------- per step */

int glm_pp_sum(glm_pp *pp, double *v, int n, int long_wait, const char *what, glm_err *err) {
    double keep = pp->world->timeout;
    if (long_wait) pp->world->timeout = keep > 3600 ? keep : 3600; /* rank 0 may be doing I/O */
    int rc = pp->world->sum_host(pp->world, v, n, -1, what, err);
    pp->world->timeout = keep;
    return rc;
}

int glm_pp_forward_backward(glm_pp *pp, const glm_batch *mb, int k, float dscale, double *loss_sum, glm_err *err) {
    pp->pipe.step = pp->dp->comm->step;
    pp->world->step = pp->pipe.step;
    if (glm_pipe_forward_backward(&pp->pipe, mb, k, dscale, loss_sum, err)) return -1;
    if (glm_pipe_reduce_tied(&pp->pipe, err)) return -1; /* before glm_dp_reduce_grads (see glm_pp_open) */
    if (glm_pipe_reduce_prefix(&pp->pipe, err)) return -1;
    pp->busy_acc += pp->pipe.busy_s;
    pp->step_acc += pp->pipe.step_s;
    pp->steps_acc++;
    return 0;
}

int glm_pp_grad_norm(glm_pp *pp, float grad_scale, double *loss_sum, double *norm, glm_err *err) {
    glm_dp *dp = pp->dp;
    /* each replica squares its shard (all of it without data parallelism); ZeRO-2 reduced only
     * that part, and the shards of a stage's replicas cover the stage once */
    size_t skip = glm_pipe_grad_skip(&pp->pipe);
    glm_backend *be = pp->pipe.m->be;
    double ss = dp->world > 1 ? glm_dp_shard_sumsq(dp, skip)
                              : be->sumsq(be, glm_at(be, pp->pipe.m->grads, skip), pp->pipe.m->tab.total - skip);
    double v[2] = {*loss_sum, ss * (double)grad_scale * grad_scale};
    if (glm_pp_sum(pp, v, 2, 0, "loss and gradient norm", err)) return -1;
    *loss_sum = v[0];
    *norm = sqrt(v[1]);
    return 0;
}

int glm_pp_eval(glm_pp *pp, const glm_batch *b, double v[2], glm_err *err) {
    double loss;
    if (glm_pipe_forward_loss(&pp->pipe, b, &loss, err)) return -1;
    if (pp->pipe.stage == pp->pipe.P - 1) { v[0] += loss; v[1] += b->n_targets; }
    return 0;
}

int glm_pp_save(glm_pp *pp, const char *output_dir, const glm_train_state *st, const char *tokenizer_path,
                const char *args_json, glm_err *err) {
    glm_opt_state o;
    if (glm_dp_opt_state(pp->dp, &o, err)) return -1;
    int rc = glm_pipe_checkpoint_save(&pp->pipe, output_dir, pp->pipe.replica == 0 ? &o : NULL, st, tokenizer_path,
                                      args_json, err);
    free(o.m);
    glm_opt_state_free_q8(&o);
    return rc;
}

int glm_pp_save_final(glm_pp *pp, const char *output_dir, int file_dtype, const char *tokenizer_path,
                      const char *args_json, glm_err *err) {
    return glm_pipe_save_final(&pp->pipe, output_dir, file_dtype, tokenizer_path, args_json, err);
}

int glm_pp_stats(glm_pp *pp, int M, char *line, size_t n, glm_err *err) {
    int P = pp->pipe.P;
    double *v = glm_calloc((size_t)(2 * P + 1), sizeof(double));
    if (pp->pipe.replica == 0 && pp->steps_acc > 0) {
        v[2 * pp->pipe.stage] = pp->busy_acc / pp->steps_acc;
        v[2 * pp->pipe.stage + 1] = pp->step_acc / pp->steps_acc;
    }
    pp->busy_acc = pp->step_acc = 0;
    pp->steps_acc = 0;
    int rc = glm_pp_sum(pp, v, 2 * P, 0, "pipeline statistics", err);
    line[0] = 0;
    if (rc == 0 && pp->world_rank == 0) {
        size_t k = (size_t)snprintf(line, n, "[glmtrain] pipeline (%d stages x %d, %d micro-batches): compute s/step", P,
                                    pp->pipe.D, M);
        for (int s = 0; s < P && k < n; s++) k += (size_t)snprintf(line + k, n - k, " %.3f", v[2 * s]);
        double step = 0, busy = 0;
        for (int s = 0; s < P; s++) { busy += v[2 * s]; if (v[2 * s + 1] > step) step = v[2 * s + 1]; }
        if (k < n)
            snprintf(line + k, n - k, " of %.3f; bubble %.1f%% (1F1B ideal %.1f%%)", step,
                     step > 0 ? 100.0 * (1 - busy / (P * step)) : 0.0, 100.0 * (P - 1) / (M + P - 1));
    }
    free(v);
    return rc;
}
