#include "optim/adamw.h"
#include <math.h>
#include <stdlib.h>

void glm_adamw_init(glm_adamw *o, glm_model *m, float lr, float b1, float b2, float eps, float wd) {
    glm_backend *be = m->be;
    size_t n = m->tab.total;
    *o = (glm_adamw){.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd};
    o->m = be->alloc(be, n * sizeof(float));
    o->v = be->alloc(be, n * sizeof(float));
    be->zero(be, o->m, n * sizeof(float));
    be->zero(be, o->v, n * sizeof(float));
    if (be->dtype != GLM_F32) {
        /* the master copy starts from the stored weights: on the device when the backend can
         * (a host round trip is 27 GB each way for ChatGLM-6B) */
        o->master = be->alloc(be, n * sizeof(float));
        if (be->to_f32) {
            be->to_f32(be, o->master, m->params, n);
        } else {
            float *host = glm_malloc(n * sizeof(float));
            be->download_f32(be, host, m->params, n);
            be->upload(be, o->master, host, n * sizeof(float));
            free(host);
        }
    }
}

void glm_adamw_free(glm_adamw *o, glm_model *m) {
    m->be->free(m->be, o->m);
    m->be->free(m->be, o->v);
    if (o->master) m->be->free(m->be, o->master);
    *o = (glm_adamw){0};
}

double glm_grad_norm(glm_model *m, float grad_scale) {
    /* padding between tensors is never written, so it stays zero and adds nothing */
    return sqrt(m->be->sumsq(m->be, m->grads, m->tab.total)) * grad_scale;
}

float glm_clip_coef(double norm, float max_norm) {
    if (max_norm <= 0) return 1.0f;
    float coef = (float)(max_norm / (norm + 1e-6));
    return coef < 1.0f ? coef : 1.0f;
}

void glm_adamw_step(glm_adamw *o, glm_model *m, float lr, float grad_scale) {
    glm_backend *be = m->be;
    o->step++;
    float bc1 = 1.0f - powf(o->beta1, (float)o->step), bc2 = 1.0f - powf(o->beta2, (float)o->step);
    for (int i = 0; i < m->tab.n; i++) {
        const glm_tensor *t = &m->tab.t[i];
        be->adamw(be, glm_at(be, m->params, t->offset), o->master ? o->master + t->offset : NULL,
                  glm_at(be, m->grads, t->offset), o->m + t->offset, o->v + t->offset, t->numel, lr, o->beta1,
                  o->beta2, o->eps, t->decay ? o->weight_decay : 0.0f, bc1, bc2, grad_scale);
    }
}
