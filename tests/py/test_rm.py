#!/usr/bin/env python3
"""--stage rm (a reward model: train/pref.h GLM_PREF_RM, model/glm.c value_head) against PyTorch fp32
references, on the CPU.

1. The C model through $GLM_BUILD/tests/tool_model_driver --value_head DIR (a batch of P chosen rows
   then their P rejected rows, ragged and right-padded) against glm_ref.py's forward with TRL's
   ValueHead (dropout, then Linear(H, 1) on the final norm's output) and LLaMA-Factory's
   PairwiseTrainer loss written here: each row's score is the value at its last token
   (attention_mask.sum - 1), loss = -logsigmoid(chosen - rejected).mean(). The loss and every gradient
   within 1e-5 relative for full fine-tuning (tied and untied heads), with the value head's dropout
   (its mask rebuilt from backend/mask_hash.h), LoRA and freeze.
2. `glmtrain train --stage rm` on a tiny model (test_lora_cli.tiny_poem_run) from preference records:
   it trains (the loss falls, the evaluation's accuracy is logged and written), value_head.safetensors
   beside the adapter (v_head.summary.weight [1, H], .bias [1]) and beside a full model; an evaluation
   alone of the saved output gives the final evaluation's numbers again (the head and adapter load);
   --do_predict writes each test pair's scores (generated_predictions.jsonl) and predict_results.json,
   alone and after training; 3 steps + resume 3 equal 6 steps; 2 CPU ranks equal 1; full fine-tuning
   leaves the LM head as loaded; P-Tuning refused.
Prints PASS/FAIL/SKIP lines (tests/run.sh)."""
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import glm_ref  # noqa: E402
import mpi_runs as M  # noqa: E402
import test_dpo as D  # noqa: E402
import test_model_vs_torch as V  # noqa: E402
from mpi_runs import report  # noqa: E402

torch.set_num_threads(2)
TOL = 1e-5
VHEAD_SEED_XOR = 0x5bd1e9955bd1e995  # model/glm.c value_head: the dropout seed's stream


def scores(cfg, params, vhead, ids, labels, lora=None, drop=0.0, seed=0):
    """Each row's value at its last labelled token (the batch is right-padded: LLaMA-Factory's
    attention_mask.sum(-1) - 1), through TRL's ValueHead: dropout then Linear(H, 1)."""
    hidden = glm_ref.forward(cfg, params, ids, lora=lora)["hidden"]  # [b, s, H]
    last = torch.tensor([max(i for i, v in enumerate(row) if v != -100) for row in labels.tolist()])
    h = hidden[torch.arange(ids.shape[0]), last]  # [b, H]
    if drop > 0:
        keep = glm_ref.dropout_keep(seed ^ VHEAD_SEED_XOR, h.numel(), drop).view_as(h)
        h = h * keep / (1 - drop)
    return F.linear(h, vhead["v_head.summary.weight"], vhead["v_head.summary.bias"]).squeeze(-1)


def pairwise_loss(v, P):
    return -F.logsigmoid(v[:P].float() - v[P:].float()).mean()


CASES = [  # name, tied, finetuning flags, dropout
    ("full_tied", True, [], 0.0),
    ("full_untied_dropout", False, [], 0.1),
    ("full_untied_every_row", False, ["--keep_all_rows"], 0.1),  # the scored rows gathered from all, not compacted
    ("lora_qkv_untied", False, ["--finetuning_type", "lora", "--lora_rank", "4", "--lora_alpha", "8",
                                "--lora_target", "query_key_value"], 0.0),
    ("freeze_last_layer_tied", True, ["--finetuning_type", "freeze", "--num_layer_trainable", "1"], 0.0),
]


def driver_cases(driver, tmp):
    from safetensors.torch import load_file, save_file
    chosen, rejected = [(5, 4), (3, 6), (4, 2)], [(5, 2), (3, 7), (4, 5)]
    for name, tied, flags, drop in CASES:
        cfg = V.make_cfg(2, 64, 4, 256, tied)
        params = glm_ref.init_params(cfg, seed=7, std=0.2)
        model = os.path.join(tmp, name)
        glm_ref.save_model_dir(model, cfg, params)
        g = torch.Generator().manual_seed(21)
        bound = 1 / 64 ** 0.5
        vhead = {"v_head.summary.weight": (torch.rand(1, 64, generator=g) * 2 - 1) * bound * 8,
                 "v_head.summary.bias": (torch.rand(1, generator=g) * 2 - 1) * bound}
        vdir = os.path.join(tmp, name + ".vhead")
        os.makedirs(vdir)
        save_file(vhead, os.path.join(vdir, "value_head.safetensors"))
        ids, labels = D.pair_rows(cfg, chosen, rejected, g)
        P = len(chosen)
        batch = os.path.join(tmp, name + ".json")
        json.dump({"input_ids": ids.tolist(), "labels": labels.tolist()}, open(batch, "w"))
        out = os.path.join(tmp, name + ".safetensors")
        extra, lora = [], None
        leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        if "lora" in flags:
            adapters = {k: v.float() for k, v in glm_ref.init_lora(cfg, 4, ["query_key_value"], seed=3).items()}
            apath = os.path.join(tmp, name + ".adapter.safetensors")
            save_file(adapters, apath)
            extra = ["--adapter", apath]
            leaves_a = {k: v.clone().requires_grad_(True) for k, v in adapters.items()}
            lora = (leaves_a, glm_ref.lora_scaling(8, 4))
        cmd = [driver, "--model", model, "--batch", batch, "--out", out, "--value_head", vdir,
               "--summary_dropout_prob", repr(drop), "--dropout_seed", "77"] + flags + extra
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        if p.returncode != 0:
            report("rm_driver_%s" % name, False, p.stdout.decode(errors="replace")[-400:])
            continue
        got = load_file(out)
        vleaves = {k: v.clone().requires_grad_(True) for k, v in vhead.items()}
        v = scores(cfg, leaves, vleaves, ids, labels, lora=lora, drop=drop, seed=77)
        loss = pairwise_loss(v, P)
        loss.backward()
        e = abs(got["loss"].item() - loss.item()) / abs(loss.item())
        report("rm_driver_%s_loss" % name, e < TOL, "C %.7f torch %.7f rel %.1e" % (got["loss"].item(), loss.item(), e))
        every = dict(leaves, **vleaves, **(lora[0] if lora else {}))
        names = [k[len("grad/"):] for k in got if k.startswith("grad/")]
        want_g = {n: every[n].grad if every[n].grad is not None else torch.zeros_like(every[n]) for n in names}
        # a pair's two scores move opposite ways, so the gradients of what adds a constant to both (the
        # value head's bias, the final norm's bias) cancel to rounding noise: those (below a thousandth of
        # the largest gradient) are measured against the largest gradient
        gmax = max(g.abs().max().item() for g in want_g.values())
        den = {n: g.abs().max().item() if g.abs().max().item() >= 1e-3 * gmax else gmax for n, g in want_g.items()}
        errs = sorted((((got["grad/" + n].double() - want_g[n].double()).abs().max().item() / den[n], n) for n in names),
                      reverse=True)
        want = {"v_head.summary.weight", "v_head.summary.bias"}
        report("rm_driver_%s_grads" % name, errs[0][0] < TOL and want <= set(names),
               "%d tensors, worst %s rel %.1e" % (len(errs), errs[0][1], errs[0][0]))


def cli_cases(tmp):
    import test_lora_cli as C
    made = D.poem_pairs(tmp, "rm_cli")
    if not made:
        return
    tok, cfg, params, pairs, data = made
    const = ["--lr_scheduler_type", "constant"]

    def train(out, extra, ft="lora"):
        return C.run(["train", "--model_name_or_path", tok, "--train_file", data, "--output_dir", out,
                      "--stage", "rm", "--finetuning_type", ft, "--lora_target", "all", "--lora_dropout", "0",
                      "--per_device_train_batch_size", "2", "--learning_rate", "1e-2", "--logging_steps", "1",
                      "--save_strategy", "no", "--disable_tqdm", "--seed", "5", "--report_to", "none",
                      "--overwrite_output_dir"] + extra)

    logged = M.logged

    out = os.path.join(tmp, "rm")
    p = train(out, ["--max_steps", "16", "--validation_file", data, "--do_eval", "--eval_strategy", "steps",
                    "--eval_steps", "8", "--per_device_eval_batch_size", "4"])
    ok = p.returncode == 0
    report("rm_cli_trains", ok, p.stderr[-600:] if not ok else "")
    if not ok:
        return
    loss, el, acc = logged(p, "loss"), logged(p, "eval_loss"), logged(p, "eval_accuracy")
    report("rm_cli_learns_the_preference", len(loss) == 16 and len(acc) == len(el) >= 2 and acc[-1] == 1.0 and el[-1] < el[0]
           and sum(loss[-4:]) < sum(loss[:4]), "loss %s, eval_loss %s, eval_accuracy %s" % (loss, el, acc))
    try:
        from safetensors.torch import load_file
        vh = load_file(os.path.join(out, "value_head.safetensors"))
        shapes = {k: list(v.shape) for k, v in vh.items()}
        res = json.load(open(os.path.join(out, "eval_results.json")))
    except Exception as e:  # noqa: BLE001
        shapes, res = str(e), {}
    H = cfg["hidden_size"]
    report("rm_cli_writes_the_value_head", shapes == {"v_head.summary.weight": [1, H], "v_head.summary.bias": [1]}
           and os.path.exists(os.path.join(out, "adapter_model.safetensors")) and res.get("eval_accuracy") == 1.0,
           "value_head %s, eval_results %s" % (shapes, res))
    # the saved adapter and value head, evaluated alone, give the final evaluation again
    p2 = C.run(["train", "--model_name_or_path", tok, "--adapter_name_or_path", out, "--output_dir", os.path.join(tmp, "ev"),
                "--stage", "rm", "--finetuning_type", "lora", "--do_train", "false", "--do_eval", "--validation_file", data,
                "--per_device_eval_batch_size", "4"])
    e2, a2 = logged(p2, "eval_loss"), logged(p2, "eval_accuracy")
    report("rm_cli_saved_head_evaluates_the_same", p2.returncode == 0 and e2 and abs(e2[0] - el[-1]) < 1e-4 and a2 == acc[-1:],
           "alone %s %s, at the end of training %s %s %s" % (e2, a2, el[-1:], acc[-1:], p2.stderr[-300:] if p2.returncode else ""))
    # --do_predict alone: the pairs' scores (LLaMA-Factory's generated_predictions.jsonl) and predict_results.json,
    # whose loss and accuracy are the final evaluation's (the same pairs)
    pd = os.path.join(tmp, "pred_alone")
    pq = C.run(["train", "--model_name_or_path", tok, "--adapter_name_or_path", out, "--output_dir", pd, "--stage", "rm",
                "--finetuning_type", "lora", "--do_train", "false", "--do_predict", "--test_file", data,
                "--per_device_eval_batch_size", "3"])
    try:
        rows = [json.loads(l) for l in open(os.path.join(pd, "generated_predictions.jsonl"))]
        pres = json.load(open(os.path.join(pd, "predict_results.json")))
    except Exception as e:  # noqa: BLE001
        rows, pres = [], {"error": str(e)}
    good = len(rows) == len(pairs) and all(set(r) == {"chosen", "rejected"} and r["chosen"] > r["rejected"] for r in rows)
    # each line as json.dumps({"chosen": round(c, 2), ...}) writes it (LLaMA-Factory's save_predictions)
    lines = open(os.path.join(pd, "generated_predictions.jsonl")).read().splitlines() if rows else []
    good = good and lines == [json.dumps({"chosen": round(r["chosen"], 2), "rejected": round(r["rejected"], 2)}) for r in rows]
    report("rm_cli_predict_scores_the_pairs", pq.returncode == 0 and good and pres.get("predict_accuracy") == 1.0
           and abs(pres.get("predict_loss", -1) - el[-1]) < 1e-4,
           "%d rows %s, predict_results %s, final eval_loss %s %s" % (len(rows), rows[:2], pres, el[-1:], pq.stderr[-300:]))
    # resume: 3 steps, then 3 more from the checkpoint, equal 6 at once (the value head's dropout on)
    p6 = M.resume_equal("rm_cli_resume", train, tmp, const)
    # --do_predict after training: the test pairs scored with the model in memory
    pa = train(os.path.join(tmp, "pred_after"), ["--max_steps", "2", "--do_predict", "--test_file", data])
    path = os.path.join(tmp, "pred_after", "generated_predictions.jsonl")
    n = sum(1 for _ in open(path)) if os.path.exists(path) else 0
    report("rm_cli_predict_after_training", pa.returncode == 0 and n == len(pairs) and "'predict_accuracy'" in pa.stderr,
           "%d rows %s" % (n, pa.stderr[-300:] if pa.returncode else ""))
    # full fine-tuning: the whole model and the value head beside it; the LM head unchanged
    fo = os.path.join(tmp, "rm_full")
    p = train(fo, ["--max_steps", "2", "--weight_decay", "0.1"], ft="full")
    try:
        from safetensors.torch import load_file
        import glob
        w = {}
        for f in glob.glob(os.path.join(fo, "*.safetensors")):
            if not f.endswith("value_head.safetensors"):
                w.update(load_file(f))
        has_vh = os.path.exists(os.path.join(fo, "value_head.safetensors"))
        head_key = "lm_head.weight" if "lm_head.weight" in w else "transformer.word_embeddings.weight"
        moved = {k for k in params if k in w and not torch.equal(w[k].float(), params[k].float())}
        detail = "value head %s; %d of %d tensors moved; v_head in the model: %s" % (
            has_vh, len(moved), len(params), any(k.startswith("v_head") for k in w))
        ok = p.returncode == 0 and has_vh and not any(k.startswith("v_head") for k in w) and len(moved) > 0
        if not cfg["tie_word_embeddings"]:
            ok = ok and head_key not in moved
            detail += "; lm_head moved: %s" % (head_key in moved)
    except Exception as e:  # noqa: BLE001
        ok, detail = False, str(e) + p.stderr[-300:]
    report("rm_cli_full_fine_tuning_files", ok, detail)
    # the full model's folder scores alone: its value head read from beside the model
    pf = C.run(["train", "--model_name_or_path", fo, "--output_dir", os.path.join(tmp, "pred_full"), "--stage", "rm",
                "--finetuning_type", "full", "--do_train", "false", "--do_predict", "--test_file", data])
    report("rm_cli_full_model_scores_alone", pf.returncode == 0 and "the value head from" in pf.stderr
           and os.path.exists(os.path.join(tmp, "pred_full", "generated_predictions.jsonl")), pf.stderr[-400:])
    # gradient checkpointing recomputes the same steps (the value head's dropout from the same seeds)
    pc = train(os.path.join(tmp, "ckpt"), ["--max_steps", "6", "--gradient_checkpointing"] + const)
    a, b = logged(p6, "loss"), logged(pc, "loss")
    report("rm_cli_gradient_checkpointing_same_losses", pc.returncode == 0 and len(a) == 6 and
           all(abs(x - y) <= 1e-4 * max(1.0, abs(x)) for x, y in zip(a, b)), "%s against %s %s" % (b, a, pc.stderr[-300:]))
    # data parallel: 2 CPU ranks at 1 pair each equal 1 rank at 2 pairs
    base = ["--model_name_or_path", tok, "--train_file", data, "--stage", "rm", "--finetuning_type", "lora",
            "--lora_target", "all", "--lora_dropout", "0", "--summary_dropout_prob", "0", "--learning_rate", "1e-2",
            "--logging_steps", "1", "--save_strategy", "steps", "--save_steps", "4", "--disable_tqdm", "--seed", "5",
            "--report_to", "none", "--max_steps", "4", "--overwrite_output_dir"] + const
    M.ranks_equal("rm_cli_two_ranks_equal_one", base, tmp, 2, 1)
    # the best checkpoint by eval_accuracy (transformers' greater_is_better for a metric that is not a loss)
    pb = train(os.path.join(tmp, "best"), ["--max_steps", "6", "--validation_file", data, "--eval_strategy", "steps",
                                           "--eval_steps", "2", "--save_strategy", "steps", "--save_steps", "2",
                                           "--load_best_model_at_end", "--metric_for_best_model", "accuracy",
                                           "--learning_rate", "5e-3", "--eval_delay", "0"])
    acc = logged(pb, "eval_accuracy")
    want = 2 * (1 + max(range(len(acc)), key=lambda i: (acc[i], -i))) if acc else -1  # the first of the highest
    report("rm_cli_best_model_by_accuracy", pb.returncode == 0 and ("checkpoint-%d (accuracy" % want) in pb.stderr,
           "eval_accuracy %s, want checkpoint-%d: %s" % (acc, want, [l for l in pb.stderr.splitlines() if "best model" in l][-1:]
                                                          or pb.stderr[-300:]))
    # refusals
    p = train(os.path.join(tmp, "pt"), ["--max_steps", "1", "--pre_seq_len", "4"], ft="ptuning")
    report("rm_cli_ptuning_refused", p.returncode != 0 and "--stage rm" in p.stderr and "ptuning" in p.stderr, p.stderr[-300:])


def main():
    return D.run_main("rm", driver_cases, cli_cases)


if __name__ == "__main__":
    sys.exit(main())
