/* PiSSA (peft's init_lora_weights "pissa_niter_N", LLaMA-Factory's --pissa_init): each adapted
 * weight W [out, in] is split by its r principal singular triplets U S V^T (a randomized SVD
 * of N subspace iterations, as torch.svd_lowrank), A = diag(sqrt(S / scaling)) V^T [r, in],
 * B = U diag(sqrt(S / scaling)) [out, r], and the base keeps the residual W - scaling B A, so the
 * model computes what it did before training and the adapter starts on W's principal part.
 *
 * An adapter trained so fits only that residual. Its folder carries the first values of A and B
 * in pissa_init/ (LLaMA-Factory's place, a peft adapter folder): loading it subtracts
 * scaling B0 A0 from the base again; its converted form (pissa_converted/, a plain LoRA of rank
 * 2r: A = [A; A0], B = [B, -B0], alpha doubled, peft's path_initial_model_for_weight_conversion)
 * fits the original base.
 *
 * The SVD (backend/svd.h) runs its products where the weight lives (the backend's optional
 * float product, else the host's). On a quantized base the float weight is read again from the
 * model's files and the float residual is what gets quantized (QPiSSA), at the start and when a
 * PiSSA folder loads. */
#ifndef GLM_MODEL_PISSA_H
#define GLM_MODEL_PISSA_H
#include <stddef.h>
#include <stdint.h>
#include "core/err.h"
#include "model/glm.h"

#define GLM_PISSA_INIT_DIR "pissa_init"
#define GLM_PISSA_CONVERTED_DIR "pissa_converted"

/* Every LoRA pair of m from its base weight (after the base is loaded), the base rows made the
 * residuals, the first values kept in m->pissa_init; m->cfg.peft.pissa_niter iterations. A
 * quantized row needs m->origin's float weights (an error names the file otherwise). */
int glm_pissa_init(glm_model *m, uint64_t seed, glm_err *err);
/* The tensor file of adapter_dir/pissa_init into path; -1 with err naming the folder and the
 * converted form to use instead when it has none. */
int glm_pissa_init_file(const char *adapter_dir, char *path, size_t n, glm_err *err);
/* The base rows less scaling B0 A0 of the first values in adapter_dir/pissa_init (kept in
 * m->pissa_init): the residual a PiSSA adapter of adapter_dir was trained on. An error names
 * the missing folder and the converted form to use instead. */
int glm_pissa_residual(glm_model *m, const char *adapter_dir, glm_err *err);

#endif
