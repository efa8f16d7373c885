/* GaLore's projected AdamW (optim/galore.h). */
#include "optim/galore.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/svd.h"
#include "core/log.h"
#include "io/safetensors.h"

static float *zeroed(glm_backend *be, size_t n) {
    float *p = be->alloc(be, (n ? n : 1) * sizeof(float));
    be->zero(be, p, (n ? n : 1) * sizeof(float));
    return p;
}

glm_galore *glm_galore_new(glm_model *m) {
    const glm_table *tab = &m->tab;
    glm_backend *be = m->be;
    int n = 0;
    for (int i = 0; i < tab->n; i++) n += tab->t[i].galore;
    if (!n) return NULL;
    glm_galore *g = glm_calloc(1, sizeof *g);
    g->n = n;
    g->rows = glm_calloc((size_t)n, sizeof *g->rows);
    g->tab = tab;
    g->gap = m->cfg.peft.galore_gap > 0 ? m->cfg.peft.galore_gap : 1;
    g->scale = m->cfg.peft.galore_scale;
    g->moff = glm_malloc(((size_t)tab->n + 1) * sizeof(size_t));
    size_t low, scratch, biggest_low = 0;
    glm_galore_state(&m->cfg, tab, &g->flat, &low, &scratch, g->moff);
    for (int i = 0, k = 0; i < tab->n; i++) {
        const glm_tensor *t = &tab->t[i];
        if (!t->galore) continue;
        glm_galore_row *w = &g->rows[k++];
        w->row = i;
        w->side = glm_galore_shape(&m->cfg, t, &w->r, &w->low, &w->nproj);
        w->proj = zeroed(be, w->nproj);
        w->m = zeroed(be, w->low);
        w->v = zeroed(be, w->low);
        size_t wide = (size_t)(t->shape[0] > t->shape[1] ? t->shape[0] : t->shape[1]) * w->r; /* U^T G or U N */
        size_t need = w->side == GLM_GALORE_FROM_BOTH ? w->low + wide : w->low;
        if (need > biggest_low) biggest_low = need;
    }
    g->full = be->alloc(be, scratch * sizeof(float));
    g->lowbuf = be->alloc(be, biggest_low * sizeof(float));
    return g;
}

void glm_galore_free(glm_galore *g, glm_model *m) {
    if (!g) return;
    glm_backend *be = m->be;
    for (int k = 0; k < g->n; k++) {
        be->free(be, g->rows[k].proj);
        be->free(be, g->rows[k].m);
        be->free(be, g->rows[k].v);
    }
    be->free(be, g->full);
    be->free(be, g->lowbuf);
    free(g->rows);
    free(g->moff);
    free(g);
}

void glm_galore_restart(glm_galore *g, glm_model *m) {
    for (int k = 0; k < g->n; k++) {
        m->be->zero(m->be, g->rows[k].m, g->rows[k].low * sizeof(float));
        m->be->zero(m->be, g->rows[k].v, g->rows[k].low * sizeof(float));
        g->rows[k].projected = 0;
    }
}

/* P from the SVD of the gradient G (floats on the backend): the top r right vectors as rows
 * (right), the top r left vectors as columns (left), or both, U_r first (both); signs fixed. */
static void new_projection(glm_galore *g, glm_model *m, glm_galore_row *w, const float *G, long step) {
    glm_backend *be = m->be;
    const glm_tensor *t = &m->tab.t[w->row];
    int rows = (int)t->shape[0], cols = (int)t->shape[1], r = w->r;
    float *u = w->side == GLM_GALORE_FROM_RIGHT ? NULL : glm_malloc((size_t)rows * r * sizeof(float));
    float *v = glm_malloc((size_t)cols * r * sizeof(float)), *s = glm_malloc((size_t)r * sizeof(float));
    /* converged (the full SVD's top triplets), so the start does not matter; a fixed one per row and step */
    uint64_t seed = 0x9a10e5ULL * (uint64_t)(w->row + 1) + 1000003ULL * (uint64_t)step;
    /* from the previous projection (the gradient's subspace moves slowly): its right vectors
     * (right, both: Vh_r's rows) or left ones (left: U_r) */
    float *start = NULL;
    int start_right = w->side != GLM_GALORE_FROM_LEFT;
    if (w->projected) {
        size_t at = w->side == GLM_GALORE_FROM_BOTH ? (size_t)rows * r : 0, n = (size_t)r * (start_right ? cols : rows);
        float *p = glm_malloc(n * sizeof(float));
        start = glm_malloc(n * sizeof(float));
        be->download(be, p, w->proj + at, n * sizeof(float));
        if (start_right) /* Vh_r [r, cols] -> [cols, r] */
            for (int j = 0; j < r; j++)
                for (int c = 0; c < cols; c++) start[(size_t)c * r + j] = p[(size_t)j * cols + c];
        else memcpy(start, p, n * sizeof(float));
        free(p);
    }
    int its = glm_svd_top(be, G, rows, cols, r, GLM_GALORE_SVD_ITERS, seed, start, start_right, u, s, v);
    free(start);
    g->capped += its < 0;
    g->iters += its < 0 ? GLM_GALORE_SVD_ITERS : its;
    glm_svd_fix_signs(u, v, rows, cols, r);
    size_t at = 0;
    if (u) { /* U_r [rows, r] as it is */
        be->upload(be, w->proj, u, (size_t)rows * r * sizeof(float));
        at = (size_t)rows * r;
    }
    if (w->side != GLM_GALORE_FROM_LEFT) { /* Vh_r [r, cols]: row j is v's column j */
        float *p = glm_malloc((size_t)r * cols * sizeof(float));
        for (int j = 0; j < r; j++)
            for (int c = 0; c < cols; c++) p[(size_t)j * cols + c] = v[(size_t)c * r + j];
        be->upload(be, w->proj + at, p, (size_t)r * cols * sizeof(float));
        free(p);
    }
    be->sync(be);
    w->projected = 1;
    free(u);
    free(v);
    free(s);
}

void glm_galore_update(glm_galore *g, glm_model *m, int k, void *param, float *master, const void *grad, long step,
                       float lr, float wd, float b1, float b2, float eps, float bc1, float bc2, float gs) {
    glm_backend *be = m->be;
    glm_galore_row *w = &g->rows[k];
    const glm_tensor *t = &m->tab.t[w->row];
    int rows = (int)t->shape[0], cols = (int)t->shape[1], r = w->r;
    /* the gradient as floats: itself on an fp32 backend, else converted into the full-size buffer
     * (which the update overwrites once the gradient is projected) */
    const float *G = grad;
    if (be->dtype != GLM_F32) {
        be->to_f32(be, g->full, grad, t->numel);
        G = g->full;
    }
    if (!w->projected || (step - 1) % g->gap == 0) {
        if (!g->refreshing++) g->t0 = glm_now();
        new_projection(g, m, w, G, step);
    }
    /* the projected gradient (galore_torch's project: G P^T, P^T G, or (U^T G) Vh^T), gs folded in */
    float *low = g->lowbuf, *tmp = g->lowbuf + w->low;
    const float *U = w->proj, *Vh = w->proj + (size_t)rows * r;
    if (w->side == GLM_GALORE_FROM_RIGHT) be->sgemm(be, 0, 1, rows, r, cols, gs, G, cols, w->proj, cols, 0.0f, low, r);
    else if (w->side == GLM_GALORE_FROM_LEFT) be->sgemm(be, 1, 0, r, cols, rows, gs, w->proj, r, G, cols, 0.0f, low, cols);
    else {
        be->sgemm(be, 1, 0, r, cols, rows, gs, U, r, G, cols, 0.0f, tmp, cols);
        be->sgemm(be, 0, 1, r, r, cols, 1.0f, tmp, cols, Vh, cols, 0.0f, low, r);
    }
    be->adam_dir(be, low, low, w->m, w->v, w->low, b1, b2, eps);
    /* project_back, times scale, into the full-size buffer (N P, P N, or (U N) Vh) */
    if (w->side == GLM_GALORE_FROM_RIGHT) be->sgemm(be, 0, 0, rows, cols, r, g->scale, low, r, w->proj, cols, 0.0f, g->full, cols);
    else if (w->side == GLM_GALORE_FROM_LEFT) be->sgemm(be, 0, 0, rows, cols, r, g->scale, w->proj, r, low, cols, 0.0f, g->full, cols);
    else {
        be->sgemm(be, 0, 0, rows, r, r, 1.0f, U, r, low, r, 0.0f, tmp, r);
        be->sgemm(be, 0, 0, rows, cols, r, g->scale, tmp, r, Vh, cols, 0.0f, g->full, cols);
    }
    float step_size = lr * sqrtf(bc2) / bc1;
    be->apply_dir(be, param, master, g->full, t->numel, -step_size, wd > 0 ? -lr * wd : 0.0f);
    if (++g->updated < g->n) return;
    g->updated = 0; /* the step's last projected row (in any order: inside backward the top layer comes first) */
    if (g->refreshing) { /* what the step's new projections cost */
        be->sync(be);
        glm_info("GaLore: step %ld: new projections of %d weights in %.1f s (%.0f subspace iterations each on average)",
                 step, g->refreshing, glm_now() - g->t0, (double)g->iters / g->refreshing);
        if (g->capped)
            glm_warn("GaLore: %d of them stopped at %d subspace iterations (close singular values around rank %d): "
                     "each uses the subspace reached", g->capped, GLM_GALORE_SVD_ITERS, w->r);
        g->refreshing = g->capped = 0;
        g->iters = 0;
    }
}

/* ---------------------------------------------------------------- checkpoints */

typedef struct part { const char *prefix; float *data; size_t n; int64_t shape[2]; } part;

/* The saved parts of row w (weight t): P (one or, from both sides, two) and the two moments. */
static int parts_of(const glm_galore_row *w, const glm_tensor *t, part out[4]) {
    int64_t rows = t->shape[0], cols = t->shape[1], r = w->r, k = 0;
    int64_t ms[2] = {w->side == GLM_GALORE_FROM_RIGHT ? rows : r, w->side == GLM_GALORE_FROM_LEFT ? cols : r};
    if (w->side == GLM_GALORE_FROM_RIGHT) out[k++] = (part){"proj/", w->proj, (size_t)(r * cols), {r, cols}};
    else out[k++] = (part){"proj/", w->proj, (size_t)(rows * r), {rows, r}};
    if (w->side == GLM_GALORE_FROM_BOTH) out[k++] = (part){"proj_right/", w->proj + rows * r, (size_t)(r * cols), {r, cols}};
    out[k++] = (part){"exp_avg/", w->m, w->low, {ms[0], ms[1]}};
    out[k++] = (part){"exp_avg_sq/", w->v, w->low, {ms[0], ms[1]}};
    return (int)k;
}

int glm_galore_save(const glm_galore *g, glm_model *m, const char *path, glm_err *err) {
    glm_backend *be = m->be;
    st_entry *e = glm_calloc((size_t)g->n * 4 + 1, sizeof *e);
    char (*names)[160] = glm_calloc((size_t)g->n * 4 + 1, 160);
    float **host = glm_calloc((size_t)g->n * 4 + 1, sizeof *host);
    int ne = 0;
    for (int k = 0; k < g->n; k++) {
        const glm_tensor *t = &m->tab.t[g->rows[k].row];
        part ps[4];
        int np = parts_of(&g->rows[k], t, ps);
        for (int i = 0; i < np; i++, ne++) {
            host[ne] = glm_malloc((ps[i].n ? ps[i].n : 1) * sizeof(float));
            be->download(be, host[ne], ps[i].data, ps[i].n * sizeof(float));
            snprintf(names[ne], 160, "%s%s", ps[i].prefix, t->name);
            e[ne] = (st_entry){.name = names[ne], .ndim = 2, .data = host[ne], .data_dtype = ST_F32, .file_dtype = ST_F32};
            e[ne].shape[0] = ps[i].shape[0];
            e[ne].shape[1] = ps[i].shape[1];
        }
    }
    int rc = st_save(path, e, ne, 0, err);
    for (int i = 0; i < ne; i++) free(host[i]);
    free(host);
    free(e);
    free(names);
    return rc;
}

int glm_galore_load(glm_galore *g, glm_model *m, const char *path, glm_err *err) {
    glm_backend *be = m->be;
    st_reader *rd;
    if (st_open(&rd, path, err)) return -1;
    int rc = 0;
    for (int k = 0; k < g->n && rc == 0; k++) {
        const glm_tensor *t = &m->tab.t[g->rows[k].row];
        part ps[4];
        int np = parts_of(&g->rows[k], t, ps);
        for (int i = 0; i < np && rc == 0; i++) {
            char name[160];
            snprintf(name, sizeof name, "%s%s", ps[i].prefix, t->name);
            float *h = glm_malloc((ps[i].n ? ps[i].n : 1) * sizeof(float));
            rc = st_read_f32(rd, name, h, 2, ps[i].shape, err);
            if (rc == 0) be->upload(be, ps[i].data, h, ps[i].n * sizeof(float));
            free(h);
        }
    }
    st_close(rd);
    if (rc) return glm_hint(err, "resume with the run's own --galore_rank, --galore_proj_type and --galore_target");
    be->sync(be);
    for (int k = 0; k < g->n; k++) g->rows[k].projected = 1;
    return 0;
}
