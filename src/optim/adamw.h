/* AdamW with PyTorch semantics over the model's tensor table: decoupled weight decay on the
 * tensors the table marks (matrices), none on biases and LayerNorm parameters; global-norm
 * gradient clipping as torch.nn.utils.clip_grad_norm_. State is fp32: moments, and a master
 * copy of the weights when the backend stores parameters in bf16/fp16. */
#ifndef GLM_ADAMW_H
#define GLM_ADAMW_H
#include "model/glm.h"

typedef struct glm_adamw {
    float lr, beta1, beta2, eps, weight_decay;
    long step;          /* optimizer steps taken */
    float *m, *v;       /* [tab.total] fp32, on the backend */
    float *master;      /* [tab.total] fp32 master weights, NULL on an fp32 backend */
} glm_adamw;

void glm_adamw_init(glm_adamw *o, glm_model *m, float lr, float b1, float b2, float eps, float wd);
void glm_adamw_free(glm_adamw *o, glm_model *m);
/* Global L2 norm of the gradients (times grad_scale). */
double glm_grad_norm(glm_model *m, float grad_scale);
/* One update with learning rate lr. grad_scale multiplies every gradient first (1/loss_scale,
 * times the clipping coefficient). */
void glm_adamw_step(glm_adamw *o, glm_model *m, float lr, float grad_scale);
/* min(1, max_norm / (norm + 1e-6)) as clip_grad_norm_ applies; 1 when max_norm <= 0. */
float glm_clip_coef(double norm, float max_norm);

#endif
