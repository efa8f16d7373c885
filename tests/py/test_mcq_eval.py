#!/usr/bin/env python3
"""`glmtrain eval` (infer/mcq.h): MMLU, C-Eval and CMMLU as LLaMA-Factory's `llamafactory-cli eval`
scores them, on a tiny ChatGLM3 model (tests/py/glm2_ref.py's weights) with a SentencePiece tokenizer
trained here in the real file's layout (tests/py/chatglm23_tok_ref.py).

The benchmark files are written here in LLaMA-Factory's evaluation/ layouts (mmlu: data/{dev,test}/
S_{split}.csv without a header; ceval: {dev,val}/S_{split}.csv with id/question/A-D/answer/explanation;
cmmlu: {dev,test}/S.csv behind an index column), with the cells pandas types (numbers, a column of
integers and floats, NA words, True/False, quotes, commas and line breaks). The reference reads them
with pandas as LLaMA-Factory's loading scripts do, makes each question's messages as its EvalTemplate
(the first n_shot dev rows as the shots), the prompt as ChatGLM3's build_chat_input, and picks the
letter (the last id of encode(letter)) with the highest logit of glm2_ref's forward at the prompt's
end. glmtrain's results.json (every prediction) and results.log (LLaMA-Factory's score lines) must
equal the reference's, for both languages, 0 and 2 shots, batches of 1 and 3 (padding); and the
errors: a task still zipped, an unknown split, an existing --save_dir.
Prints PASS/FAIL/SKIP lines."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mpi_runs import ENV, GLM, report  # noqa: E402

CATS = ["Average", "STEM", "Social Sciences", "Humanities", "Other"]
MAPS = {
    "mmlu": {"abstract_algebra": {"name": "abstract algebra", "category": "STEM"},
             "world_religions": {"name": "world religions", "category": "Humanities"}},
    "ceval": {"computer_network": {"name": "计算机网络", "category": "STEM"},
              "law": {"name": "法学", "category": "Humanities"}},
    "cmmlu": {"agronomy": {"name": "农学", "category": "Other"},
              "chinese_history": {"name": "中国历史", "category": "Humanities"}},
}
WORDS = ["春", "风", "山", "水", "你好", "再见", "北京", "天气", "数学", "历史", "答案", "问题"]


def rows(seed, n, numeric):
    import random
    g = random.Random(seed)
    out = []
    for i in range(n):
        q = "".join(g.choice(WORDS) for _ in range(g.randint(2, 6)))
        if i % 3 == 0:
            q += ', "quoted", and\na second line'
        ch = []
        for k in range(4):
            if numeric:  # a column of integers and floats: pandas makes it floats ("2" shows as "2.0")
                ch.append(str(g.randint(0, 9)) if (i + k) % 2 else "%.2f" % (g.random() * 10))
            else:
                ch.append("".join(g.choice(WORDS) for _ in range(g.randint(1, 3))))
        if not numeric and i == 1:
            ch[2] = "None"  # an NA word (pandas 2's list): the prompt shows nan
        if not numeric and i == 3:
            ch[1] = "NA"
        if not numeric and i == 2:
            ch[3] = "True"
        out.append((q, ch, "ABCD"[g.randint(0, 3)]))
    return out


def write_tasks(root):
    import csv
    for task, mp in MAPS.items():
        d = os.path.join(root, task)
        os.makedirs(d)
        json.dump(mp, open(os.path.join(d, "mapping.json"), "w"), ensure_ascii=False, indent=2)
        for si, subj in enumerate(mp):
            for split, n in (("dev", 3), ("val", 5), ("test", 5)):
                if task == "ceval" and split == "test":
                    continue
                if task == "cmmlu" and split == "val":
                    continue
                rs = rows(hash((task, subj, split)) % 1000, n, numeric=(si == 0 and split != "dev"))
                if task == "mmlu":
                    path = os.path.join(d, "data", split, "%s_%s.csv" % (subj, split))
                elif task == "cmmlu":
                    path = os.path.join(d, split, "%s.csv" % subj)
                else:
                    path = os.path.join(d, split, "%s_%s.csv" % (subj, split))
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", newline="", encoding="utf-8") as f:
                    w = csv.writer(f)
                    if task == "ceval":
                        w.writerow(["id", "question", "A", "B", "C", "D", "answer", "explanation"])
                    if task == "cmmlu":
                        w.writerow(["", "Question", "A", "B", "C", "D", "Answer"])
                    for i, (q, ch, a) in enumerate(rs):
                        if task == "mmlu":
                            w.writerow([q] + ch + [a])
                        elif task == "cmmlu":
                            w.writerow([i, q] + ch + [a])
                        else:
                            w.writerow([i, q] + ch + [a, "解析"])


def pandas_items(root, task, subj, split):
    """The records LLaMA-Factory's loading script yields (pandas.read_csv as it calls it)."""
    import pandas as pd
    # LLaMA-Factory requires pandas >= 2, whose NA words include "None"; Debian's 1.5 gets it added
    na = {"na_values": ["None"]} if int(pd.__version__.split(".")[0]) < 2 else {}
    folder = {"train": "dev", "validation": "val", "test": "test"}[split]
    d = os.path.join(root, task)
    if task == "mmlu":
        df = pd.read_csv(os.path.join(d, "data", folder, "%s_%s.csv" % (subj, folder)), header=None, **na)
        df.columns = ["question", "A", "B", "C", "D", "answer"]
        return df.to_dict(orient="records")
    if task == "cmmlu":
        df = pd.read_csv(os.path.join(d, folder, "%s.csv" % subj), header=0, index_col=0, encoding="utf-8", **na)
        out = []
        for inst in df.to_dict(orient="records"):
            inst["question"] = inst.pop("Question", "")
            inst["answer"] = inst.pop("Answer", "")
            out.append(inst)
        return out
    return pd.read_csv(os.path.join(d, folder, "%s_%s.csv" % (subj, folder)), encoding="utf-8", **na).to_dict(orient="records")


def messages(target, support, subject, lang):
    """LLaMA-Factory's EvalTemplate.format_example."""
    system = ("The following are multiple choice questions (with answers) about {subject}.\n\n" if lang == "en"
              else "以下是中国关于{subject}考试的单项选择题，请选出其中的正确答案。\n\n")
    answer = "\nAnswer:" if lang == "en" else "\n答案："

    def parse(ex):
        cands = ["\n{choice}. {content}".format(choice=ch, content=ex[ch]) for ch in "ABCD" if ch in ex]
        return "".join([ex["question"]] + cands + [answer]), ex["answer"]
    ms = []
    for ex in support:
        p, r = parse(ex)
        ms += [{"role": "user", "content": p}, {"role": "assistant", "content": r}]
    p, r = parse(target)
    ms += [{"role": "user", "content": p}, {"role": "assistant", "content": r}]
    ms[0]["content"] = system.format(subject=subject) + ms[0]["content"]
    return ms


def chatglm3_ids(tok, ms):
    return tok.build_chat_input(ms[-2]["content"], history=ms[:-2])


def chatglm2_ids(tok, ms):
    """ChatGLM2-6B's model.chat prompt: build_prompt's rounds, [gMASK] sop in front."""
    hist = [(ms[i]["content"], ms[i + 1]["content"]) for i in range(0, len(ms) - 2, 2)]
    return tok.encode(tok.build_prompt(ms[-2]["content"], history=hist), add_special_tokens=True)


def reference(root, task, split, lang, n_shot, tok, cfg, params, prompt_ids=chatglm3_ids):
    import torch
    import glm2_ref
    letters = [tok.encode(ch, add_special_tokens=False)[-1] for ch in "ABCD"]
    results, corrects = {}, {c: [] for c in CATS}
    for subj, info in MAPS[task].items():
        dev = pandas_items(root, task, subj, "train")
        outs = []
        for ex in pandas_items(root, task, subj, split):
            ms = messages(ex, dev[:n_shot], info["name"], lang)
            ids = prompt_ids(tok, ms)
            with torch.no_grad():
                logits = glm2_ref.forward(cfg, params, torch.tensor([ids]))["logits"][0, -1]
            pred = "ABCD"[int(torch.argmax(logits[letters]))]
            outs.append(pred)
            ok = pred == ex["answer"]
            corrects[info["category"]].append(ok)
            corrects["Average"].append(ok)
        results[subj] = {str(i): outs[i] for i in range(len(outs))}
    lines = "\n".join("{:>15}: {:.2f}".format(c, 100 * sum(v) / len(v)) for c, v in corrects.items() if len(v))
    return results, lines


def main():
    try:
        import pandas  # noqa: F401
        import chatglm23_tok_ref as R
        import tokenizer_corpus as tc
        import glm2_ref
        import torch
        from safetensors.torch import save_file
    except Exception as e:  # noqa: BLE001
        print("SKIP mcq_eval: %s (python3-pandas, python3-sentencepiece, safetensors: scripts/install-deps.sh)" % e)
        return 0
    if not os.path.exists(GLM) or not shutil.which("spm_train"):
        print("SKIP mcq_eval: %s or spm_train missing" % GLM)
        return 0
    torch.set_num_threads(2)
    tmp = tempfile.mkdtemp(prefix="glm_mcq_")
    try:
        model = R.train_model(tmp, tc.corpus(seed=2023))
        tok = R.ChatGLM3Tokenizer(model)
        tdir = R.write_folder(os.path.join(tmp, "model"), model, R.CONFIG_V3)
        vocab = (tok.vocab_size + 63) // 64 * 64
        raw = {"model_type": "chatglm", "architectures": ["ChatGLMModel"], "padded_vocab_size": vocab,
               "hidden_size": 32, "num_layers": 2, "num_attention_heads": 4, "kv_channels": 8,
               "multi_query_attention": True, "multi_query_group_num": 2, "ffn_hidden_size": 48,
               "layernorm_epsilon": 1e-5, "rmsnorm": True, "add_qkv_bias": True, "add_bias_linear": False,
               "apply_residual_connection_post_layernorm": False, "post_layer_norm": True, "original_rope": True,
               "seq_length": 2048, "tie_word_embeddings": False, "eos_token_id": tok.eos_token_id, "pad_token_id": 0}
        json.dump(raw, open(os.path.join(tdir, "config.json"), "w"))
        cfg = glm2_ref.load_config(raw)
        params = glm2_ref.init_params(cfg, seed=5, std=0.4)
        save_file({k: v.float().contiguous() for k, v in params.items()}, os.path.join(tdir, "model.safetensors"))
        root = os.path.join(tmp, "evaluation")
        write_tasks(root)
        runs = [("mmlu", "test", "en", 2, 3), ("ceval", "validation", "zh", 2, 1), ("cmmlu", "test", "zh", 0, 3),
                ("mmlu", "test", "zh", 0, 2)]
        for task, split, lang, shots, bs in runs:
            name = "mcq_%s_%s_%s_%dshot_b%d" % (task, split, lang, shots, bs)
            want, lines = reference(root, task, split, lang, shots, tok, cfg, params)
            save = os.path.join(tmp, name)
            p = subprocess.run([GLM, "eval", "--model_name_or_path", tdir, "--task", "%s_%s" % (task, split),
                                "--task_dir", root, "--lang", lang, "--n_shot", str(shots), "--batch_size", str(bs),
                                "--save_dir", save], capture_output=True, text=True, timeout=300, env=ENV)
            try:
                got = json.load(open(os.path.join(save, "results.json")))
                log = open(os.path.join(save, "results.log")).read()
            except Exception as e:  # noqa: BLE001
                got, log = {"error": str(e)}, ""
            report(name + "_predictions", p.returncode == 0 and got == want,
                   "glmtrain %s, reference %s %s" % (got, want, p.stderr[-400:] if p.returncode else ""))
            report(name + "_scores", log == lines and lines in p.stdout, "glmtrain %r, reference %r" % (log, lines))
        # ChatGLM2-6B's tokenizer beside the same weights: its rounds prompt ("[Round 1]\n\n问：...")
        tdir2 = R.write_folder(os.path.join(tmp, "model2"), model, R.CONFIG_V2)
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(tdir, f), tdir2)
        tok2 = R.ChatGLM2Tokenizer(model)
        want, lines = reference(root, "mmlu", "test", "zh", 2, tok2, cfg, params, chatglm2_ids)
        save = os.path.join(tmp, "mcq_chatglm2")
        p = subprocess.run([GLM, "eval", "--model_name_or_path", tdir2, "--task", "mmlu_test", "--task_dir", root, "--lang", "zh",
                            "--n_shot", "2", "--batch_size", "3", "--save_dir", save], capture_output=True, text=True,
                           timeout=300, env=ENV)
        try:
            got = json.load(open(os.path.join(save, "results.json")))
        except Exception as e:  # noqa: BLE001
            got = {"error": str(e)}
        report("mcq_chatglm2_rounds_prompt_predictions", p.returncode == 0 and got == want,
               "glmtrain %s, reference %s %s" % (got, want, p.stderr[-300:] if p.returncode else ""))
        # errors
        zipped = os.path.join(tmp, "zipped")
        os.makedirs(os.path.join(zipped, "ceval"))
        shutil.copy(os.path.join(root, "ceval", "mapping.json"), os.path.join(zipped, "ceval"))
        open(os.path.join(zipped, "ceval", "ceval.zip"), "wb").close()
        base = [GLM, "eval", "--model_name_or_path", tdir]
        p = subprocess.run(base + ["--task", "ceval_validation", "--task_dir", zipped], capture_output=True, text=True, env=ENV)
        report("mcq_zipped_task_says_unzip", p.returncode != 0 and "unzip ceval.zip" in p.stderr, p.stderr[-300:])
        p = subprocess.run(base + ["--task", "mmlu_dev", "--task_dir", root], capture_output=True, text=True, env=ENV)
        report("mcq_unknown_split_named", p.returncode != 0 and "\"dev\"" in p.stderr, p.stderr[-300:])
        p = subprocess.run(base + ["--task", "cmmlu_validation", "--task_dir", root], capture_output=True, text=True, env=ENV)
        report("mcq_cmmlu_has_no_validation", p.returncode != 0 and "cmmlu_test" in p.stderr, p.stderr[-300:])
        p = subprocess.run(base + ["--task", "mmlu_test", "--task_dir", root, "--save_dir", tmp], capture_output=True,
                           text=True, env=ENV)
        report("mcq_existing_save_dir_refused", p.returncode != 0 and "--save_dir" in p.stderr, p.stderr[-300:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
