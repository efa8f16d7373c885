#!/usr/bin/env python3
"""--stage kto (train/pref.h GLM_PREF_KTO) against PyTorch fp32 references, on the CPU.

1. The C model through $GLM_BUILD/tests/tool_model_driver --pref_loss kto (P examples, then their P KL
   examples: the same prompts with other answers, ragged and padded) against glm_ref.py's forward with
   the loss written here from LLaMA-Factory's CustomKTOTrainer and TRL's kto_loss (torch autograd): the
   KL rows without gradient, kl = mean(policy - reference) clamped at 0, desirable and undesirable
   losses with their weights, pref_ftx's scaling; the loss and every gradient of full fine-tuning within
   1e-5, tied and untied heads, kl above 0 and clamped.
2. The GLM-4 layout's KTO examples (tests/c/tool_chatglm23 examples --kto) equal a re-implementation of
   LLaMA-Factory's FeedbackDatasetProcessor (the KL answer the previous record's in its group, the first
   record's the last's; each example cut on its own with infer_seqlen), uncut and cut, groups of 2 and all.
3. `glmtrain train --stage kto` on a tiny model: the first loss is 0.5 (policy = reference, kl 0), the
   metrics TRL logs; training moves the desirable answers' rewards above the undesirable ones'; 3 steps +
   resume 3 equal 6; 2 CPU ranks equal 1 (kl averaged over the ranks); dataset_info's kto_tag column
   ("label", as kto_en_demo); evaluation; the errors (a tag that is not a boolean, KTO data under sft).
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


def row_sums(cfg, params, ids, labels):
    logits = glm_ref.forward(cfg, params, ids)["logits"][:, :-1]
    lab = labels[:, 1:]
    mask = lab != -100
    lp = torch.log_softmax(logits.float(), -1).gather(-1, lab.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    s = (lp * mask).sum(-1)
    return s, s / mask.sum(-1)


def kto_loss(c, c_avg, k, rc, rk, tags, beta, ftx, wd, wu):
    """TRL's kto_loss and LLaMA-Factory's get_batch_loss_metrics on one batch."""
    kl = (k.detach() - rk).mean().clamp(min=0)
    ch, rj = tags, ~tags
    chosen = wd * (1 - torch.sigmoid(beta * ((c[ch] - rc[ch]) - kl)))
    rejected = wu * (1 - torch.sigmoid(beta * (kl - (c[rj] - rc[rj]))))
    loss = torch.cat((chosen, rejected), 0).nanmean()
    if ftx > 1e-6 and int(ch.sum()) > 0:
        loss = loss + ftx * (-c_avg[ch]).nanmean() / int(ch.sum()) * len(c)
    return loss


CASES = [  # name, tied, tags, beta, ftx, weights, reference offsets (kl > 0 or clamped)
    ("mixed_tied", True, [1, 0, 1], 0.5, 0.0, (1.0, 1.0), (-0.3, 0.2)),
    ("mixed_ftx_weights_untied", False, [0, 1, 1], 0.3, 0.4, (1.5, 0.7), (0.25, -0.4)),
    ("kl_clamped_untied", False, [1, 0, 0], 0.8, 0.0, (1.0, 2.0), (0.1, 0.6)),
]


def driver_cases(driver, tmp):
    from safetensors.torch import load_file
    lens = [(5, 4), (3, 6), (4, 2)]
    for name, tied, tags, beta, ftx, (wd, wu), (off_t, off_k) in CASES:
        cfg = V.make_cfg(2, 64, 4, 256, tied)
        params = glm_ref.init_params(cfg, seed=7, std=0.2)
        model = os.path.join(tmp, name)
        glm_ref.save_model_dir(model, cfg, params)
        # a KL example: the prompt with another answer
        ids, labels = D.pair_rows(cfg, lens, [(la, lb + 1) for la, lb in lens], torch.Generator().manual_seed(12))
        P = len(lens)
        with torch.no_grad():
            v0, _ = row_sums(cfg, params, ids, labels)
        # the reference away from the policy: the targets' by off_t, the KL rows' by off_k (kl = -off_k before the clamp)
        ref = (v0.double() + torch.tensor([off_t] * P + [off_k] * P, dtype=torch.float64)).tolist()
        batch = os.path.join(tmp, name + ".json")
        json.dump({"input_ids": ids.tolist(), "labels": labels.tolist()}, open(batch, "w"))
        out = os.path.join(tmp, name + ".safetensors")
        ref_arg = ",".join("%.17g" % x for p in range(P) for x in (ref[p], ref[P + p]))
        leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        s, avg = row_sums(cfg, leaves, ids, labels)
        rr = torch.tensor(ref, dtype=torch.float32)
        loss = kto_loss(s[:P], avg[:P], s[P:], rr[:P], rr[P:], torch.tensor(tags, dtype=torch.bool), beta, ftx, wd, wu)
        loss.backward()
        for split in ("", "_split"):  # the KL rows in the same pass, or forward only first (as the trainer runs them)
            cmd = [driver, "--model", model, "--batch", batch, "--out", out, "--pref_loss", "kto", "--pref_beta", repr(beta),
                   "--pref_ftx", repr(ftx), "--kto_tags", ",".join(map(str, tags)), "--kto_weights", "%r,%r" % (wd, wu),
                   "--ref", ref_arg] + (["--kto_split"] if split else [])
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
            if p.returncode != 0:
                report("kto_driver_%s%s" % (name, split), False, p.stdout.decode(errors="replace")[-400:])
                continue
            got = load_file(out)
            e = abs(got["loss"].item() - loss.item()) / abs(loss.item())
            report("kto_driver_%s%s_loss" % (name, split), e < TOL, "C %.7f torch %.7f rel %.1e" % (got["loss"].item(), loss.item(), e))
            errs = sorted(((V.rel(got["grad/" + n], leaves[n].grad), n) for n in params), reverse=True)
            report("kto_driver_%s%s_grads" % (name, split), errs[0][0] < TOL,
                   "%d tensors, worst %s rel %.1e" % (len(errs), errs[0][1], errs[0][0]))


RECORDS = [  # conversation, answer, desirable
    ([{"role": "user", "content": "你好"}], "你好！有什么可以帮你？", True),
    ([{"role": "system", "content": "简短回答"}, {"role": "user", "content": "1+1=?"}], "一加一等于三，这是一个很长的错误回答", False),
    ([{"role": "user", "content": "第一问"}, {"role": "assistant", "content": "答一"}, {"role": "user", "content": "第二问"}],
     "答二", True),
    ([{"role": "user", "content": "讲个笑话"}], "不讲", False),
]


def lf_kto(records, encode, eos, cutoff, group):
    """LLaMA-Factory's FeedbackDatasetProcessor with its glm4 template (test_dpo.lf_pair's encoding): per
    group, kl_response = [last] + responses[:-1]; each example and its KL example cut on their own."""
    import test_glmz1 as Z

    enc_all = lambda ms: D.glm4_turns(ms, encode)  # noqa: E731

    def one(conv, answer):
        e = enc_all(conv + [{"role": "assistant", "content": answer}])
        prompt, resp = sum(e[:-1], []), e[-1] + [eos]
        s, t = Z.infer_seqlen(len(prompt), len(resp), cutoff) if cutoff else (len(prompt), len(resp))
        return prompt[:s] + resp[:t], [-100] * s + resp[:t]
    out = []
    for g0 in range(0, len(records), group):
        grp = records[g0:g0 + group]
        kl = [grp[-1][1]] + [r[1] for r in grp[:-1]]
        for (conv, ans, tag), kla in zip(grp, kl):
            out.append((one(conv, ans), one(conv, kla), tag))
    return out


def kto_examples(tmp):
    import test_glmz1 as Z
    tool = os.path.join(os.environ.get("GLM_BUILD", "build"), "tests", "tool_chatglm23")
    if not os.path.exists(tool):
        print("SKIP kto_examples_equal_llamafactory: %s not built" % tool)
        return
    try:
        tdir, tk, n, specials = Z.make_tokenizer(tmp)
    except Exception as e:  # noqa: BLE001
        print("SKIP kto_examples_equal_llamafactory: the GLM-4 test tokenizer cannot be made (%s)" % str(e).splitlines()[0])
        return
    data = os.path.join(tmp, "kto_glm4.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for conv, a, tag in RECORDS:
            f.write(json.dumps({"messages": conv + [{"role": "assistant", "content": a}], "label": tag}, ensure_ascii=False) + "\n")
    encode = lambda x: tk.encode(x, add_special_tokens=False).ids  # noqa: E731
    eos = n + specials.index("<|user|>")
    for cut, group in ((0, 1000), (0, 2), (16, 1000), (11, 3)):
        want = lf_kto(RECORDS, encode, eos, cut, group)
        args = [tool, "examples", "--tokenizer", tdir, "--train_file", data, "--kto", "--pt_group", str(group),
                "--conversation_labels", "eos", "--max_source_length", "1000", "--max_target_length", "1000"] + \
               (["--cutoff_len", str(cut)] if cut else [])
        p = subprocess.run(args, capture_output=True, text=True, timeout=120)
        got = None
        if p.returncode == 0:
            got = []
            for line in p.stdout.splitlines()[:-1]:
                g = json.loads(line)
                k = g["split"]
                got.append(((g["ids"][:k], g["labels"][:k]), (g["ids"][k:], g["labels"][k:]), g["kto_tag"]))
        detail = p.stderr[-300:] if got is None else "%d examples" % len(got)
        if got is not None and got != want:
            i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), None)
            detail = "%d examples, reference %d; first difference at %s: glmtrain %s, reference %s" % (
                len(got), len(want), i, got[i] if i is not None else "", want[i] if i is not None else "")
        report("kto_examples_equal_llamafactory_cut%d_group%d" % (cut, group), got == want, detail)


def cli_cases(tmp):
    import test_lora_cli as C
    made = C.tiny_poem_run(tmp, "kto_cli")
    if not made:
        return
    tok = made[0]
    words = ["春", "风", "山", "水"]
    recs = [{"instruction": "写一句关于%s的诗" % w, "output": w * 3 if i % 2 else words[(i + 1) % 4] * 2, "kto_tag": bool(i % 2)}
            for i, w in enumerate(words * 2)]
    data = os.path.join(tmp, "kto.json")
    json.dump(recs, open(data, "w"), ensure_ascii=False)
    const = ["--lr_scheduler_type", "constant"]

    def train(out, extra, src=None):
        return C.run(["train", "--model_name_or_path", tok] + (src or ["--train_file", data]) + ["--output_dir", out,
                      "--stage", "kto", "--finetuning_type", "lora", "--lora_target", "all", "--pref_beta", "0.5",
                      "--per_device_train_batch_size", "4", "--learning_rate", "2e-2", "--logging_steps", "1",
                      "--save_strategy", "no", "--disable_tqdm", "--seed", "5", "--report_to", "none",
                      "--overwrite_output_dir"] + extra)

    logged = M.logged

    p = train(os.path.join(tmp, "kto"), ["--max_steps", "16"])
    ok = p.returncode == 0
    report("kto_cli_trains", ok, p.stderr[-600:] if not ok else "")
    if ok:
        loss = logged(p, "loss")
        report("kto_cli_first_loss_is_half", bool(loss) and abs(loss[0] - 0.5) < 1e-6, "first loss %s" % loss[:1])
        have = all(logged(p, k) for k in ("rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected", "kl"))
        m = logged(p, "rewards/margins")
        report("kto_cli_learns", have and len(m) >= 8 and min(m[-4:]) > 0 and sum(m[-4:]) > sum(m[:4])
               and sum(loss[-4:]) < sum(loss[:4]), "margins %s, loss %s" % (m, loss))
    p6 = M.resume_equal("kto_cli_resume", train, tmp, const)
    # 2 ranks at 2 examples each equal 1 rank at 4: kl is the mean of the ranks' means
    base = ["--model_name_or_path", tok, "--train_file", data, "--stage", "kto", "--finetuning_type", "lora",
            "--lora_target", "all", "--pref_beta", "0.5", "--learning_rate", "2e-2", "--logging_steps", "1",
            "--save_strategy", "steps", "--save_steps", "4", "--disable_tqdm", "--seed", "5", "--report_to", "none",
            "--max_steps", "4", "--overwrite_output_dir"] + const
    M.ranks_equal("kto_cli_two_ranks_equal_one", base, tmp, 4, 2)
    # LLaMA-Factory's dataset_info: kto_en_demo names its tag column "label"
    lab = [dict({k: v for k, v in r.items() if k != "kto_tag"}, label=r["kto_tag"]) for r in recs]
    json.dump(lab, open(os.path.join(tmp, "kto_label.json"), "w"), ensure_ascii=False)
    json.dump({"kto_demo": {"file_name": "kto_label.json", "columns": {"prompt": "instruction", "response": "output",
                                                                       "kto_tag": "label"}}},
              open(os.path.join(tmp, "dataset_info.json"), "w"))
    p = train(os.path.join(tmp, "di"), ["--max_steps", "6"] + const, src=["--dataset", "kto_demo", "--dataset_dir", tmp])
    a, b = logged(p, "loss"), logged(p6, "loss")
    report("kto_cli_dataset_info_kto_tag", p.returncode == 0 and a == b, "%s against --train_file's %s %s" % (a, b, p.stderr[-300:]))
    p = C.run(["train", "--model_name_or_path", tok, "--dataset", "kto_demo", "--dataset_dir", tmp, "--output_dir",
               os.path.join(tmp, "di2"), "--max_steps", "1"])
    report("kto_cli_kto_data_under_sft_refused", p.returncode != 0 and "--stage kto" in p.stderr, p.stderr[-300:])
    # evaluation: held-out examples give the loss and the eval_ metrics
    p = train(os.path.join(tmp, "ev"), ["--max_steps", "2", "--val_size", "4", "--eval_strategy", "steps", "--eval_steps", "1",
                                        "--do_eval", "--per_device_eval_batch_size", "2"])
    el = logged(p, "eval_loss")
    report("kto_cli_evaluation", p.returncode == 0 and len(el) >= 2 and logged(p, "eval_kl") and "eval_perplexity" not in p.stderr,
           "eval_loss %s %s" % (el, p.stderr[-300:] if p.returncode else ""))
    one = os.path.join(tmp, "one_kind.json")  # LLaMA-Factory warns when a dataset has one kind only
    json.dump([dict(r, kto_tag=True) for r in recs], open(one, "w"), ensure_ascii=False)
    p = train(os.path.join(tmp, "one"), ["--max_steps", "1"], src=["--train_file", one])
    report("kto_cli_one_kind_warned", p.returncode == 0 and "every one of the 8 training examples is desirable" in p.stderr,
           p.stderr[-300:])
    bad = os.path.join(tmp, "bad.json")
    json.dump([{"instruction": "写诗", "output": "春", "kto_tag": "yes"}], open(bad, "w"), ensure_ascii=False)
    p = train(os.path.join(tmp, "bad"), ["--max_steps", "1"], src=["--train_file", bad])
    report("kto_cli_tag_not_boolean_named", p.returncode != 0 and "kto_tag" in p.stderr and "bad.json" in p.stderr, p.stderr[-300:])


def kto_examples_hf(tmp):
    import test_glm_hf as H
    tool = os.path.join(os.environ.get("GLM_BUILD", "build"), "tests", "tool_chatglm23")
    if H.use_transformers_446("kto_examples_equal_llamafactory", [tool]):
        kto_examples(tmp)


def main():
    return D.run_main("kto", driver_cases, cli_cases, kto_examples_hf)  # the examples last: they put transformers 4.46 on the path


if __name__ == "__main__":
    sys.exit(main())
