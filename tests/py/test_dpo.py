#!/usr/bin/env python3
"""--stage dpo (train/pref.h) against PyTorch fp32 references, on the CPU.

1. The C model through $GLM_BUILD/tests/tool_model_driver --pref_loss ... (a batch of P chosen rows
   then their P rejected rows, ragged and padded) against glm_ref.py's forward with the preference
   losses written here from LLaMA-Factory's CustomDPOTrainer and TRL's dpo_loss (torch autograd):
   the loss and every gradient of full fine-tuning within 1e-5 relative, for sigmoid (with and
   without label smoothing), hinge, ipo, orpo and simpo, with and without pref_ftx, on tied and
   untied heads; the reference values differ from the policy's so that the x term matters.
2. `glmtrain train --stage dpo` on a tiny model (test_lora_cli.tiny_poem_run) from preference records
   (alpaca {"instruction", "chosen", "rejected"} and sharegpt {"conversations", "chosen",
   "rejected"}): the first step's loss is log 2 for sigmoid (policy = reference at the start); the
   metrics LLaMA-Factory logs are there; training raises the chosen answers over the rejected ones
   (rewards/accuracies 1, margins > 0); 3 steps + resume 3 equal 6 steps; the errors of a record
   without "rejected", an unknown stage and P-Tuning with DPO.
Prints PASS/FAIL/SKIP lines (tests/run.sh)."""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import glm_ref  # noqa: E402
import mpi_runs as M  # noqa: E402
import test_model_vs_torch as V  # noqa: E402
from mpi_runs import report  # noqa: E402

torch.set_num_threads(2)
TOL = 1e-5


def row_logps(cfg, params, ids, labels, average):
    """Each row's sum (or mean) of log p of its targets, as get_batch_logps (labels shifted by one)."""
    logits = glm_ref.forward(cfg, params, ids)["logits"][:, :-1]
    lab = labels[:, 1:]
    mask = lab != -100
    lp = torch.log_softmax(logits.float(), -1).gather(-1, lab.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    s = (lp * mask).sum(-1)
    n = mask.sum(-1)
    return (s / n if average else s), s / n


def pref_loss(kind, c, r, rc, rr, c_avg, beta, ftx, gamma, ls):
    """LLaMA-Factory's compute_preference_loss (+ pref_ftx) on one batch's pairs, the mean over them."""
    if kind in ("sigmoid", "hinge", "ipo"):  # TRL's dpo_loss
        logits = (c - r) - (rc - rr)
        if kind == "sigmoid":
            losses = -F.logsigmoid(beta * logits) * (1 - ls) - F.logsigmoid(-beta * logits) * ls
        elif kind == "hinge":
            losses = torch.relu(1 - beta * logits)
        else:
            losses = (logits - 1 / (2 * beta)) ** 2
    elif kind == "orpo":
        log_odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
        losses = -c + beta * -F.logsigmoid(log_odds)
    else:  # simpo
        losses = -F.logsigmoid(beta * ((c - r) - gamma / beta))
    if ftx > 1e-6:
        losses = losses + ftx * -c_avg
    return losses.mean()


CASES = [  # name, kind, beta, ftx, gamma, label smoothing, tied, rows (chosen (a, b) then rejected)
    ("sigmoid_tied", "sigmoid", 0.5, 0.0, 0.5, 0.0, True, [(5, 4), (3, 6)], [(5, 2), (3, 7)]),
    ("sigmoid_ls_ftx_untied", "sigmoid", 0.3, 0.7, 0.5, 0.2, False, [(4, 5), (6, 1), (2, 3)], [(4, 3), (6, 4), (2, 5)]),
    ("hinge_untied", "hinge", 0.1, 0.0, 0.5, 0.0, False, [(5, 4), (3, 6)], [(5, 2), (3, 7)]),
    ("ipo_tied", "ipo", 0.4, 0.0, 0.5, 0.0, True, [(5, 4), (3, 6)], [(5, 2), (3, 7)]),
    ("orpo_untied", "orpo", 0.25, 0.0, 0.5, 0.0, False, [(4, 5), (6, 1), (2, 3)], [(4, 3), (6, 4), (2, 5)]),
    ("simpo_ftx_tied", "simpo", 2.0, 0.5, 1.2, 0.0, True, [(5, 4), (3, 6)], [(5, 2), (3, 7)]),
]


def pair_rows(cfg, first, second, g):
    """A batch of pairs sharing their prompts: the rows of `first` ((prompt, answer) lengths, as
    V.make_rows makes them), then as many rows with the same prompts and random answers of `second`'s
    answer lengths (drawn from generator g); (ids, labels) right-padded."""
    ids_a, lab_a = V.make_rows(cfg, first, seed=11)
    ids_b, lab_b = [], []
    for (la, lb), ia in zip(second, ids_a):
        i, l = glm_ref.make_example(ia[:la], torch.randint(4, 90, (lb,), generator=g).tolist(), cfg)
        ids_b.append(i)
        lab_b.append(l)
    return glm_ref.pad_batch(ids_a + ids_b, lab_a + lab_b, cfg["pad_token_id"])


def run_main(name, driver_cases, *steps):
    """A preference test's main: driver_cases(driver, tmp) when tool_model_driver is built (else SKIP),
    then each step(tmp), in one temporary folder; the exit status of all the checks."""
    tmp = tempfile.mkdtemp(prefix="glm_%s_" % name)
    try:
        driver = V.find_driver()
        if driver:
            driver_cases(driver, tmp)
        else:
            print("SKIP %s_driver: tool_model_driver not built" % name)
        for step in steps:
            step(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if all(M.results) else 1


def driver_cases(driver, tmp):
    from safetensors.torch import load_file  # noqa: F401  (test_model_vs_torch reads the output)
    for name, kind, beta, ftx, gamma, ls, tied, chosen, rejected in CASES:
        cfg = V.make_cfg(2, 64, 4, 256, tied)
        params = glm_ref.init_params(cfg, seed=7, std=0.2)
        model = os.path.join(tmp, name)
        glm_ref.save_model_dir(model, cfg, params)
        # a pair shares its prompt: the rejected row is the chosen one's prompt with another answer
        ids, labels = pair_rows(cfg, chosen, rejected, torch.Generator().manual_seed(12))
        P = len(chosen)
        avg = kind in ("ipo", "orpo", "simpo")
        with torch.no_grad():
            v0, _ = row_logps(cfg, params, ids, labels, avg)
        # references away from the policy: the x term moves the loss (and its kinks stay away)
        off = torch.tensor([0.3, -0.2, 0.5, -0.4, 0.1, 0.25][:2 * P], dtype=torch.float64)
        ref = (v0.double() + off).tolist()
        rc = torch.tensor(ref[:P]); rr = torch.tensor(ref[P:])
        batch = os.path.join(tmp, name + ".json")
        json.dump({"input_ids": ids.tolist(), "labels": labels.tolist()}, open(batch, "w"))
        out = os.path.join(tmp, name + ".safetensors")
        ref_arg = ",".join("%.17g" % x for p in range(P) for x in (ref[p], ref[P + p]))
        cmd = [driver, "--model", model, "--batch", batch, "--out", out, "--pref_loss", kind, "--pref_beta", repr(beta),
               "--pref_ftx", repr(ftx), "--simpo_gamma", repr(gamma), "--label_smoothing", repr(ls), "--ref", ref_arg]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        if p.returncode != 0:
            report(name, False, p.stdout.decode(errors="replace")[-400:])
            continue
        from safetensors.torch import load_file as lf
        got = lf(out)
        leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        val, c_avg_all = row_logps(cfg, leaves, ids, labels, avg)
        loss = pref_loss(kind, val[:P], val[P:], rc.float(), rr.float(), c_avg_all[:P], beta, ftx, gamma, ls)
        loss.backward()
        e = abs(got["loss"].item() - loss.item()) / abs(loss.item())
        report("dpo_driver_%s_loss" % name, e < TOL, "C %.7f torch %.7f rel %.1e" % (got["loss"].item(), loss.item(), e))
        errs = sorted(((V.rel(got["grad/" + n], leaves[n].grad), n) for n in params), reverse=True)
        report("dpo_driver_%s_grads" % name, errs[0][0] < TOL,
               "%d tensors, worst %s rel %.1e" % (len(errs), errs[0][1], errs[0][0]))


def poem_pairs(tmp, skip_name):
    """test_lora_cli's tiny model and tokenizer with 8 preference records (each word's poem chosen, the
    next word's rejected) in tmp/pairs.json: (model folder, config, params, records, file), or None
    after the SKIP line."""
    import test_lora_cli as C
    made = C.tiny_poem_run(tmp, skip_name)
    if not made:
        return None
    tok, cfg, params, _ = made
    words = ["春", "风", "山", "水"]
    pairs = [{"instruction": "写一句关于%s的诗" % w, "chosen": w * 3, "rejected": words[(i + 1) % 4] * 2}
             for i, w in enumerate(words * 2)]
    data = os.path.join(tmp, "pairs.json")
    json.dump(pairs, open(data, "w"), ensure_ascii=False)
    return tok, cfg, params, pairs, data


def cli_cases(tmp):
    import test_lora_cli as C
    made = poem_pairs(tmp, "dpo_cli")
    if not made:
        return
    tok, cfg, params, pairs, data = made
    words = ["春", "风", "山", "水"]

    def train(out, extra, data_file=data, src=None):
        return C.run(["train", "--model_name_or_path", tok] + (src or ["--train_file", data_file]) + ["--output_dir", out,
                      "--stage", "dpo", "--finetuning_type", "lora", "--lora_target", "all", "--lora_dropout", "0",
                      "--per_device_train_batch_size", "2", "--learning_rate", "1e-2", "--logging_steps", "1",
                      "--save_strategy", "no", "--disable_tqdm", "--seed", "5", "--report_to", "none",
                      "--overwrite_output_dir"] + extra)

    logged = M.logged

    out = os.path.join(tmp, "dpo")
    p = train(out, ["--max_steps", "12"])
    ok = p.returncode == 0
    report("dpo_cli_trains", ok, p.stderr[-600:] if not ok else "")
    if ok:
        loss = logged(p, "loss")
        report("dpo_cli_first_loss_is_log2", bool(loss) and abs(loss[0] - math.log(2)) < 1e-4,
               "first loss %s (policy = reference at the start: log 2 = %.4f)" % (loss[:1], math.log(2)))
        acc, margin = logged(p, "rewards/accuracies"), logged(p, "rewards/margins")
        have = all(logged(p, k) for k in ("rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected"))
        report("dpo_cli_logs_the_metrics", have and len(acc) == 12, "%d accuracy lines" % len(acc))
        report("dpo_cli_learns_the_preference", bool(acc) and acc[-1] == 1.0 and margin[-1] > margin[0] and loss[-1] < loss[0],
               "accuracies %s, margins %.4f -> %.4f, loss %.4f -> %.4f" % (acc[-3:], margin[0], margin[-1], loss[0], loss[-1])
               if acc else "no metrics")
    # LLaMA-Factory's DPO trainer turns dropout off (disable_dropout_in_model): --lora_dropout changes nothing
    pd1 = C.run(["train", "--model_name_or_path", tok, "--train_file", data, "--output_dir", os.path.join(tmp, "drop"),
                 "--stage", "dpo", "--finetuning_type", "lora", "--lora_target", "all", "--lora_dropout", "0.3",
                 "--per_device_train_batch_size", "2", "--learning_rate", "1e-2", "--logging_steps", "1",
                 "--save_strategy", "no", "--disable_tqdm", "--seed", "5", "--report_to", "none", "--overwrite_output_dir",
                 "--max_steps", "12"])
    if ok:
        report("dpo_cli_trains_without_dropout", pd1.returncode == 0 and logged(pd1, "loss") == loss
               and "trains without --lora_dropout 0.3" in pd1.stderr,
               "--lora_dropout 0.3 %s, 0 %s %s" % (logged(pd1, "loss")[:4], loss[:4], pd1.stderr[-300:]))
    # --ref_model (LLaMA-Factory's): the base itself gives the default's losses; another model another start
    if ok:
        pr1 = train(os.path.join(tmp, "ref_same"), ["--max_steps", "12", "--ref_model", tok])
        report("dpo_cli_ref_model_base_is_the_default", pr1.returncode == 0 and logged(pr1, "loss") == loss,
               "%s against %s %s" % (logged(pr1, "loss")[:3], loss[:3], pr1.stderr[-300:]))
        other = os.path.join(tmp, "other_ref")
        shutil.copytree(tok, other)
        glm_ref.save_model_dir(other, cfg, glm_ref.init_params(cfg, seed=9, std=0.3))
        pr2 = train(os.path.join(tmp, "ref_other"), ["--max_steps", "2", "--ref_model", other])
        l2 = logged(pr2, "loss")
        report("dpo_cli_ref_model_other", pr2.returncode == 0 and l2 and abs(l2[0] - math.log(2)) > 1e-3 and other in pr2.stderr,
               "first loss %s (log 2 would mean the policy's own reference) %s" % (l2[:1], pr2.stderr[-300:]))
        # --ref_model_adapters merged into --ref_model as it loads: the same as the merged folder
        merged = os.path.join(tmp, "merged_ref")
        pm = C.run(["merge", "--model_name_or_path", tok, "--adapter", out, "--output_dir", merged, "--dtype", "float32"])
        pa = train(os.path.join(tmp, "ref_adapter"), ["--max_steps", "2", "--ref_model", tok, "--ref_model_adapters", out])
        pb = train(os.path.join(tmp, "ref_merged"), ["--max_steps", "2", "--ref_model", merged])
        la, lb = logged(pa, "loss"), logged(pb, "loss")
        report("dpo_cli_ref_model_adapters_merged", pm.returncode == 0 and pa.returncode == 0 and len(la) == 2 and
               all(abs(x - y) <= 1e-4 for x, y in zip(la, lb)) and abs(la[0] - math.log(2)) > 1e-3,
               "with the adapter %s, the merged folder %s %s" % (la, lb, (pm.stderr + pa.stderr)[-300:]))
        # training on a loaded adapter: the reference is the base without it (LLaMA-Factory's disable_adapter), as
        # --ref_model BASE says explicitly
        pc1 = train(os.path.join(tmp, "cont"), ["--max_steps", "2", "--adapter_name_or_path", out])
        pc2 = train(os.path.join(tmp, "cont_ref"), ["--max_steps", "2", "--adapter_name_or_path", out, "--ref_model", tok])
        l1, l2c = logged(pc1, "loss"), logged(pc2, "loss")
        report("dpo_cli_reference_leaves_the_adapter_out", pc1.returncode == 0 and len(l1) == 2 and l1 == l2c
               and abs(l1[0] - math.log(2)) > 1e-3, "%s, with --ref_model the base %s %s" % (l1, l2c, (pc1.stderr + pc2.stderr)[-300:]))
        pr3 = train(os.path.join(tmp, "ref_orpo"), ["--max_steps", "1", "--ref_model", other, "--pref_loss", "orpo"])
        report("dpo_cli_ref_model_with_orpo_refused", pr3.returncode != 0 and "uses no reference" in pr3.stderr, pr3.stderr[-300:])
    # resume: 3 steps, then 3 more from the checkpoint, equal 6 at once
    const = ["--lr_scheduler_type", "constant"]
    p6c = M.resume_equal("dpo_cli_resume", train, tmp, const)
    # evaluation: held-out pairs (--val_size) give the pairs' mean loss and the eval_ metrics, no perplexity
    ev = os.path.join(tmp, "eval")
    p = train(ev, ["--max_steps", "4", "--val_size", "2", "--eval_strategy", "steps", "--eval_steps", "2", "--do_eval",
                   "--per_device_eval_batch_size", "2"])
    el, ea = logged(p, "eval_loss"), logged(p, "eval_rewards/accuracies")
    try:
        res = json.load(open(os.path.join(ev, "eval_results.json")))
    except Exception as e:  # noqa: BLE001
        res = {"error": str(e)}
    report("dpo_cli_evaluation", p.returncode == 0 and len(el) >= 2 and len(ea) == len(el) and "eval_perplexity" not in p.stderr
           and abs(res.get("eval_loss", -1) - el[-1]) < 1e-4 and "eval_perplexity" not in res,
           "eval_loss %s, accuracies %s, eval_results.json %s %s" % (el, ea, res, p.stderr[-300:] if p.returncode else ""))
    # data parallel: 2 CPU ranks at 1 pair each equal 1 rank at 2 pairs (ZeRO 0 and 1)
    base = ["--model_name_or_path", tok, "--train_file", data, "--stage", "dpo", "--finetuning_type", "lora",
            "--lora_target", "all", "--lora_dropout", "0", "--learning_rate", "1e-2", "--logging_steps", "1",
            "--save_strategy", "steps", "--save_steps", "4", "--disable_tqdm", "--seed", "5", "--report_to", "none",
            "--max_steps", "4", "--overwrite_output_dir"] + const
    for z in ("0", "1"):
        M.ranks_equal("dpo_cli_two_ranks_zero%s_equal_one" % z, base, tmp, 2, 1, zero=z)
    # an evaluation alone (--do_train false --do_eval): the reference is the model itself, so sigmoid's
    # loss is log 2; orpo's needs no reference
    for kind, want in (("sigmoid", math.log(2)), ("orpo", None)):
        p = C.run(["train", "--model_name_or_path", tok, "--output_dir", os.path.join(tmp, "evonly"), "--stage", "dpo",
                   "--pref_loss", kind, "--do_train", "false", "--do_eval", "--validation_file", data])
        el = logged(p, "eval_loss")
        report("dpo_cli_evaluation_alone_%s" % kind, p.returncode == 0 and len(el) == 1 and
               (want is None or abs(el[0] - want) < 1e-4) and logged(p, "eval_rewards/accuracies"),
               "exit %d, eval_loss %s %s" % (p.returncode, el, p.stderr[-300:] if p.returncode else ""))
    # sharegpt records, the chosen answer as the last turn
    sg = [{"conversations": [{"from": "human", "value": "写一句关于%s的诗" % w}],
           "chosen": {"from": "gpt", "value": w * 3}, "rejected": {"from": "gpt", "value": "风风"}} for w in words]
    sgf = os.path.join(tmp, "pairs_sharegpt.json")
    json.dump(sg, open(sgf, "w"), ensure_ascii=False)
    p = train(os.path.join(tmp, "sg"), ["--max_steps", "2"], sgf)
    report("dpo_cli_sharegpt_pairs", p.returncode == 0 and len(logged(p, "rewards/chosen")) == 2, p.stderr[-400:])
    # LLaMA-Factory's dataset_info.json: a ranking entry trains under --stage dpo and is refused under sft
    json.dump({"prefs": {"file_name": "pairs.json", "ranking": True,
                         "columns": {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected"}},
               "sft": {"file_name": "pairs.json"}}, open(os.path.join(tmp, "dataset_info.json"), "w"))
    p = train(os.path.join(tmp, "di"), ["--max_steps", "6"] + const, src=["--dataset", "prefs", "--dataset_dir", tmp])
    a, b = logged(p, "loss"), logged(p6c, "loss")
    report("dpo_cli_dataset_info_ranking", p.returncode == 0 and a == b, "%s against --train_file's %s %s" % (a, b, p.stderr[-300:]))
    p = C.run(["train", "--model_name_or_path", tok, "--dataset", "prefs", "--dataset_dir", tmp, "--output_dir",
               os.path.join(tmp, "di2"), "--max_steps", "1"])
    report("dpo_cli_ranking_under_sft_refused", p.returncode != 0 and "--stage dpo" in p.stderr, p.stderr[-300:])
    p = C.run(["train", "--model_name_or_path", tok, "--dataset", "sft", "--dataset_dir", tmp, "--output_dir",
               os.path.join(tmp, "di3"), "--stage", "dpo", "--max_steps", "1"])
    report("dpo_cli_sft_data_under_dpo_refused", p.returncode != 0 and "not ranking data" in p.stderr, p.stderr[-300:])
    # the memory plan counts a pair as two rows
    def activations(extra):
        q = C.run(["info", "--model_name_or_path", tok, "--finetuning_type", "lora"] + extra)
        out = q.stdout + q.stderr
        m, b = re.search(r"activations\s+([0-9.]+ [MG]iB)", out), re.search(r"micro-batch (\d+) x", out)
        return (b.group(1), m.group(1)) if m and b else out[-200:]
    a4, p2, a2 = (activations(x) for x in (["--per_device_train_batch_size", "4"],
                                           ["--per_device_train_batch_size", "2", "--stage", "dpo"],
                                           ["--per_device_train_batch_size", "2"]))
    report("dpo_cli_plan_counts_pairs_as_two_rows", a4 == p2 and a2 != p2 and p2[0] == "4", "sft 4 rows %s, dpo 2 pairs %s, sft 2 rows %s" % (a4, p2, a2))
    # errors
    bad = os.path.join(tmp, "no_rejected.json")
    json.dump([{"instruction": "写诗", "chosen": "春"}], open(bad, "w"), ensure_ascii=False)
    p = train(os.path.join(tmp, "bad"), ["--max_steps", "1"], bad)
    report("dpo_cli_missing_rejected_named", p.returncode != 0 and "'rejected'" in p.stderr and "no_rejected.json" in p.stderr,
           p.stderr[-300:])
    p = train(os.path.join(tmp, "ppo"), ["--max_steps", "1", "--stage", "ppo"])
    report("dpo_cli_unknown_stage_refused", p.returncode != 0 and "--stage ppo" in p.stderr and "/v1/score/evaluation" in p.stderr,
           p.stderr[-300:])
    p = train(os.path.join(tmp, "sftx"), ["--max_steps", "1", "--stage", "sftx"])
    report("dpo_cli_misspelt_stage_refused", p.returncode != 0 and "--stage sftx" in p.stderr and "kto" in p.stderr, p.stderr[-300:])
    p = C.run(["train", "--model_name_or_path", tok, "--train_file", data, "--output_dir", os.path.join(tmp, "pt"),
               "--stage", "dpo", "--finetuning_type", "ptuning", "--pre_seq_len", "4", "--max_steps", "1"])
    report("dpo_cli_ptuning_refused", p.returncode != 0 and "ptuning" in p.stderr, p.stderr[-300:])


PAIR_RECORDS = [
    ([{"role": "user", "content": "你好"}], "你好！有什么可以帮你？", "不知道"),
    ([{"role": "system", "content": "简短回答"}, {"role": "user", "content": "1+1=?"}], "2", "一加一等于三，这是一个很长的错误回答"),
    ([{"role": "user", "content": "第一问"}, {"role": "assistant", "content": "答一"}, {"role": "user", "content": "第二问"}],
     "答二", "我不回答第二问"),
]


def glm4_turns(ms, encode):
    """Each message's ids as LLaMA-Factory's glm4 template encodes them (prefix "[gMASK]<sop>", system
    "<|system|>\n{c}", user "<|user|>\n{c}<|assistant|>", assistant "\n{c}", each slot encoded on its own),
    the system turn folded into the first."""
    system = ms[0]["content"] if ms[0]["role"] == "system" else ""
    ms = ms[1:] if system else ms
    out = []
    for i, m in enumerate(ms):
        slots = (["[gMASK]<sop>"] + (["<|system|>\n" + system] if system else [])) if i == 0 else []
        slots.append({"user": "<|user|>\n%s<|assistant|>", "assistant": "\n%s"}[m["role"]] % m["content"])
        out.append(sum((encode(x) for x in slots), []))
    return out


def lf_pair(conv, chosen, rejected, encode, eos, cutoff):
    """LLaMA-Factory's PairwiseDatasetProcessor._encode_data_example with its glm4 template (prefix
    "[gMASK]<sop>", system "<|system|>\n{c}", user "<|user|>\n{c}<|assistant|>", assistant "\n{c}", each
    slot encoded on its own; efficient_eos): encode_oneturn's prompt (every message before the answer)
    and answer + eos for each of the two, infer_seqlen(prompt, the longer answer, cutoff_len), the prompt
    kept from its start, labels on the answer. eos is GLM-4's closing <|user|> (as test_glmz1 says, what
    glmtrain's GLM-4 examples end in). Returns (chosen ids, labels), (rejected ids, labels)."""
    import test_glmz1 as Z

    enc_all = lambda ms: glm4_turns(ms, encode)  # noqa: E731
    ec = enc_all(conv + [{"role": "assistant", "content": chosen}])
    er = enc_all(conv + [{"role": "assistant", "content": rejected}])
    prompt, c, r = sum(ec[:-1], []), ec[-1] + [eos], er[-1] + [eos]
    s, t = Z.infer_seqlen(len(prompt), max(len(c), len(r)), cutoff) if cutoff else (len(prompt), max(len(c), len(r)))
    p = prompt[:s]
    return (p + c[:t], [-100] * len(p) + c[:t]), (p + r[:t], [-100] * len(p) + r[:t])


def pair_examples(tmp):
    """The GLM-4 layout's pair examples (tool_chatglm23 examples --pairs) against lf_pair."""
    import test_glmz1 as Z
    tool = os.path.join(os.environ.get("GLM_BUILD", "build"), "tests", "tool_chatglm23")
    if not os.path.exists(tool):
        print("SKIP dpo_pairs_equal_llamafactory: %s not built" % tool)
        return
    import test_glm_hf as H
    if not H.use_transformers_446("dpo_pairs_equal_llamafactory", [tool]):
        return
    try:
        tdir, tk, n, specials = Z.make_tokenizer(tmp)
    except Exception as e:  # transformers / tiktoken / tokenizers missing
        print("SKIP dpo_pairs_equal_llamafactory: the GLM-4 test tokenizer cannot be made (%s)" % str(e).splitlines()[0])
        return
    data = os.path.join(tmp, "pairs_glm4.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for conv, c, r in PAIR_RECORDS:
            f.write(json.dumps({"messages": conv, "chosen": {"role": "assistant", "content": c},
                                "rejected": {"role": "assistant", "content": r}}, ensure_ascii=False) + "\n")
    encode = lambda x: tk.encode(x, add_special_tokens=False).ids  # noqa: E731
    eos = n + specials.index("<|user|>")
    for cut in (0, 40, 24, 14):
        want = [lf_pair(conv, c, r, encode, eos, cut) for conv, c, r in PAIR_RECORDS]
        args = [tool, "examples", "--tokenizer", tdir, "--train_file", data, "--pairs", "--conversation_labels", "eos",
                "--max_source_length", "1000", "--max_target_length", "1000"] + (["--cutoff_len", str(cut)] if cut else [])
        p = subprocess.run(args, capture_output=True, text=True, timeout=120)
        got = None
        if p.returncode == 0:
            got = []
            for line in p.stdout.splitlines()[:-1]:
                g = json.loads(line)
                k = g["split"]
                got.append(((g["ids"][:k], g["labels"][:k]), (g["ids"][k:], g["labels"][k:])))
        detail = p.stderr[-300:] if got is None else "%d pairs" % len(got)
        if got is not None and got != want:
            i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), None)
            detail = "%d pairs, reference %d; first difference at %s: glmtrain %s, reference %s" % (
                len(got), len(want), i, got[i] if i is not None else "", want[i] if i is not None else "")
        report("dpo_pairs_equal_llamafactory%s" % ("_cutoff_%d" % cut if cut else ""), got == want, detail)


def main():
    return run_main("dpo", driver_cases, cli_cases, pair_examples)  # pair_examples last: it puts transformers 4.46 on the path


if __name__ == "__main__":
    sys.exit(main())
