/* AdamW with PyTorch semantics over the model's tensor table: decoupled weight decay on the
 * tensors the table marks (matrices), none on biases and LayerNorm parameters; global-norm
 * gradient clipping as torch.nn.utils.clip_grad_norm_.
 *
 * The state covers n elements of a flat index space (the whole model's flat buffer, or a ZeRO
 * shard of it) and comes in two kinds and two places:
 *   - kind: fp32 moments (--optim adamw_torch), or bitsandbytes' blockwise 8-bit moments
 *     (--optim adamw_8bit: codes u8 [n] and an fp32 absmax per GLM_ADAM8_BLOCK elements,
 *     backend/quant8.h), a quarter of the bytes;
 *   - place: on the backend (device), or in host memory (--offload_optimizer cpu), where the
 *     CPU backend's own ops update it from gradients copied to the host, and the new weights go
 *     back rounded to the backend's dtype.
 * An fp32 master copy of the weights exists when the weights are stored in bf16/fp16, and
 * always on the host when offloaded (the host keeps the weights it updates). */
#ifndef GLM_ADAMW_H
#define GLM_ADAMW_H
#include "model/glm.h"

typedef enum glm_optim_kind { GLM_OPTIM_ADAMW = 0, GLM_OPTIM_ADAMW8 = 1 } glm_optim_kind;

/* --optim's names (Hugging Face's): adamw_torch (and adamw_hf, adamw_torch_fused: the same
 * update here), adamw_8bit / adamw_bnb_8bit. -1 for any other name. */
int glm_optim_parse(const char *name);
/* Bytes of optimizer state per trained parameter: moments and the fp32 master copy. */
double glm_optim_state_bytes(int kind, int with_master);

typedef struct glm_adamw {
    float lr, beta1, beta2, eps, weight_decay;
    long step;          /* optimizer steps taken */
    int kind;           /* glm_optim_kind */
    int host;           /* state in host memory (offloaded) */
    size_t n;           /* state elements */
    float *m, *v;       /* [n] fp32 moments (kind adamw) */
    uint8_t *qm, *qv;   /* [n] 8-bit codes (kind adamw_8bit) */
    float *am, *av;     /* [ceil(n / GLM_ADAM8_BLOCK)] their absmax */
    uint8_t *decay;     /* 8-bit kind: bit k = flat elements [64k, 64k + 64) decay, where the state lives */
    float *master;      /* [n] fp32 master weights; NULL on an fp32 backend with the state on it */
    glm_backend *cpu;   /* host state: the CPU backend whose ops update it */
    float *scratch;     /* host state: gradients of one chunk as fp32 */
    /* GaLore (optim/galore.h; m->cfg.peft.galore_rank > 0, one whole state on the backend): the
     * projected rows' state, and m, v then hold only the other rows', galore->flat elements at
     * the offsets galore->moff gives (else n, at the state index). Every row then takes
     * galore_torch's AdamW (eps before the bias correction, weight decay after the step). */
    struct glm_galore *galore;
} glm_adamw;

/* The whole model's state on the model's backend (kind adamw_torch, not offloaded). */
void glm_adamw_init(glm_adamw *o, glm_model *m, float lr, float b1, float b2, float eps, float wd);
/* A state of n elements of the given kind, on the backend or (host) in host memory, zeroed; the
 * master copy (when one is kept) still has to be filled with glm_adamw_master_from. */
void glm_adamw_alloc(glm_adamw *o, glm_model *m, int kind, int host, size_t n, float lr, float b1, float b2,
                     float eps, float wd);
/* master[k, k + n) = the model's weights at flat [lo, lo + n) as fp32. */
void glm_adamw_master_from(glm_adamw *o, glm_model *m, size_t k, size_t lo, size_t n);
void glm_adamw_free(glm_adamw *o, glm_model *m);
/* The moments as a fresh state's (zero, no step taken): BAdam's switch to another block
 * (optim/badam.h). The master copy is the caller's to refill from the weights (glm_adamw_master_from). */
void glm_adamw_restart(glm_adamw *o, glm_model *m);
/* Global L2 norm of the gradients (times grad_scale). */
double glm_grad_norm(glm_model *m, float grad_scale);
/* One update of the whole model (state over the flat buffer) with learning rate lr.
 * grad_scale multiplies every gradient first (1/loss_scale, times the clipping coefficient). */
void glm_adamw_step(glm_adamw *o, glm_model *m, float lr, float grad_scale);
/* Bias corrections of the step about to be taken (o->step already counts it). */
void glm_adamw_corrections(const glm_adamw *o, float *bc1, float *bc2);
/* The update of flat elements [lo, hi) whose state sits at [k, k + hi - lo): on the backend,
 * from grad (S, element lo's gradient at grad) into param (S, element lo's weight there: the
 * model's flat buffer, or a ZeRO-3 shard). With 8-bit states k and lo are multiples of
 * GLM_ADAM8_BLOCK and 64 (a block never straddles two calls). */
void glm_adamw_update(glm_adamw *o, glm_model *m, size_t lo, size_t hi, size_t k, void *param, const void *grad,
                      float lr, float grad_scale, float bc1, float bc2);
/* The same for a host state: buf (host, S) holds the gradients of [lo, hi) on entry and the
 * updated weights, rounded to S, on return. Returns the sum of squares of the gradients read
 * (times grad_scale^2). */
double glm_adamw_update_host(glm_adamw *o, glm_model *m, size_t lo, size_t hi, size_t k, void *buf, float lr,
                             float grad_scale, float bc1, float bc2);
/* The state's elements [k, k + n) as fp32 host values (any of m, v, master may be NULL; master
 * NULL is also what a run without one gives back), and their inverse: put quantizes 8-bit
 * moments blockwise, so k and n must then cover whole blocks (or end the state). */
void glm_adamw_get(const glm_adamw *o, glm_backend *be, size_t k, size_t n, float *m, float *v, float *master);
void glm_adamw_put(glm_adamw *o, glm_backend *be, size_t k, size_t n, const float *m, const float *v, const float *master);
/* 8-bit states as stored (codes and absmax of blocks [k/B, (k+n)/B)), for checkpoints that resume
 * exactly: host buffers qm, qv [n], am, av [blocks]. */
void glm_adamw_get_q8(const glm_adamw *o, glm_backend *be, size_t k, size_t n, uint8_t *qm, uint8_t *qv, float *am,
                      float *av);
void glm_adamw_put_q8(glm_adamw *o, glm_backend *be, size_t k, size_t n, const uint8_t *qm, const uint8_t *qv,
                      const float *am, const float *av);
/* min(1, max_norm / (norm + 1e-6)) as clip_grad_norm_ applies; 1 when max_norm <= 0. */
float glm_clip_coef(double norm, float max_norm);

#endif
