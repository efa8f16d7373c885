/* The disk a run's saves take, said before the first step (trainer.h trainer_disk_plan): a save
 * that finds the disk full fails part-way, hours into a run, and the steps since the checkpoint
 * before it are lost. The figures come from the tensor table (ckpt/ glm_checkpoint_bytes,
 * glm_final_model_bytes), as the writers lay the files out. */
#include "train/trainer.h"

/* How many checkpoints the run writes from here: every save_steps steps, each epoch's end, or at
 * most each evaluation (--save_strategy best). */
static long saves_ahead(const trainer *t) {
    long left = t->total_steps - t->st.global_step;
    if (left <= 0) return 0;
    long epochs = t->steps_per_epoch > 0 ? (left + t->steps_per_epoch - 1) / t->steps_per_epoch : 1;
    if (t->save_when == GLM_WHEN_STEPS) return left / t->save_every;
    if (t->save_when == GLM_WHEN_EPOCH) return epochs;
    if (t->save_when == GLM_WHEN_BEST) {
        if (t->eval_when == GLM_WHEN_EPOCH) return epochs;
        return t->eval_when == GLM_WHEN_STEPS ? left / t->eval_every : 0;
    }
    return 0;
}

/* This run's checkpoints already in output_dir (a resumed run's): rotation counts them. */
static long saved_before(const trainer *t) {
    long *steps, mine = 0;
    int k = glm_checkpoint_list(t->a->output_dir, &steps);
    for (int i = 0; i < k; i++) {
        char dir[4096], id[64];
        snprintf(dir, sizeof dir, "%s/checkpoint-%ld", t->a->output_dir, steps[i]);
        glm_checkpoint_run_id(dir, id, sizeof id);
        mine += id[0] && strcmp(id, t->st.run_id) == 0;
    }
    free(steps);
    return mine;
}

void trainer_disk_plan(const trainer *t) {
    const glm_train_args *a = t->a;
    const glm_config *c = &t->m.cfg;
    size_t text = strlen(t->args_json) + 4096; /* training_args.json and trainer_state.json, whose log grows */
    int dtype_bytes = !strcmp(a->save_dtype, "float32") ? 4 : 2;
    double model = glm_final_model_bytes(c, dtype_bytes, t->tok_path, text), final = a->save_final_model ? model : 0;
    int opt_kinds = 2 + (t->be->dtype != GLM_F32) + (t->dp->opt->kind == GLM_OPTIM_ADAMW8); /* moments, master, 8-bit codes */
    double ckpt = a->save_only_model ? model : glm_checkpoint_bytes(c, opt_kinds, t->tok_path, text);
    long before = saved_before(t), ahead = saves_ahead(t), all = before + ahead;
    /* kept at once: --save_total_limit (the best one kept beside the newest: 2 at a limit of 1),
     * and while a checkpoint is written the oldest is still there */
    long keep = a->save_total_limit > 0 ? a->save_total_limit + (a->load_best_model_at_end && a->save_total_limit == 1) : all;
    if (keep > all) keep = all;
    long writing = ahead > 0 && keep < all ? keep + 1 : keep;
    double during = (writing - before) * ckpt, after = (keep - before) * ckpt + final;
    double need = during > after ? during : after, free_b = glm_disk_free(a->output_dir);
    if (need <= 0 || free_b < 0) return;
    char s_ckpt[32], s_final[32], s_need[32], s_free[32];
    glm_fmt_bytes(s_ckpt, sizeof s_ckpt, ckpt);
    glm_fmt_bytes(s_final, sizeof s_final, final);
    glm_fmt_bytes(s_need, sizeof s_need, need);
    glm_fmt_bytes(s_free, sizeof s_free, free_b);
    glm_info("disk: %ld checkpoint%s ahead of about %s each (%s), at most %ld at once%s; the final model about %s; "
             "about %s more than %s holds now, %s free there", ahead, ahead == 1 ? "" : "s", s_ckpt,
             a->save_only_model ? "the model alone" : "weights and optimizer state", writing,
             writing > keep ? " while the newest is written" : "", s_final, s_need, a->output_dir, s_free);
    if (need <= free_b) return;
    char alt[160] = "";
    if (!a->save_only_model) {
        char s_alt[32];
        glm_fmt_bytes(s_alt, sizeof s_alt, model);
        snprintf(alt, sizeof alt, ", --save_only_model true (checkpoints of about %s, without the optimizer state: no "
                                  "run resumes from them)", s_alt);
    }
    glm_warn("the saves of this run need about %s on the disk of %s and %s are free there: a save would fail part-way, and "
             "the steps since the checkpoint before it would be lost. Free space, lower --save_total_limit (now %d)%s, or "
             "pick another --output_dir", s_need, a->output_dir, s_free, a->save_total_limit, alt);
}
