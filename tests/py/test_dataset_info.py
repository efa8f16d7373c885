#!/usr/bin/env python3
"""LLaMA-Factory's data flags on `glmtrain train`: `--dataset a,b --dataset_dir DIR` reads the
entries of DIR/dataset_info.json, each file with its own formatting and columns:

  * alpaca with the default columns, alpaca with renamed columns (prompt/query/response/system)
    and sharegpt (role/content tags) together train exactly as one --train_file holding the same
    records in the same order in glmtrain's own alpaca layout (the same losses, step by step);
  * `--max_train_samples N` trains on the first N records (of the datasets in order), as one
    file of those records does;
  * a LLaMA-Factory training config (flat YAML, --config) and THUDM's finetune_demo config
    (nested: data_config, max_input_length, training_args, peft_config; --data_dir) train as
    the same flags do; --eval_dataset is the validation set, an evaluation alone reads entries too; a PREFIX_TUNING config trains a prefix; its DeepSpeed file sets the ZeRO stage; cutoff_len sets the examples' length; a cutoff_len too small, unknown
    keys and malformed YAML are refused naming file:line;
  * `--template` naming the tokenizer's family passes; another one, an unknown one, `--stage dpo`,
    a missing entry, a hub-only entry, ranking data, an unsupported column or tag, and
    --train_file with --dataset are errors naming what is wrong.
Prints PASS/FAIL/SKIP lines."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_train as T  # noqa: E402
from mpi_runs import ENV, GLM, report  # noqa: E402


def losses(text):
    return re.findall(r"\{'loss': ([^,]+),", text)


def train(args):
    return subprocess.run([GLM, "train"] + args, capture_output=True, text=True, timeout=300, env=ENV)


def main():
    if not os.path.exists(GLM) or not shutil.which("spm_train"):
        print("SKIP dataset_info: glmtrain or spm_train missing")
        return 0
    d = tempfile.mkdtemp(prefix="glmtrain-lf-")
    try:
        tok, cfg = T.tiny_model(d)
        data = os.path.join(d, "data")
        os.makedirs(data)
        words = ["春", "风", "明月", "山", "水", "江南", "白云", "故人"]
        a = [{"instruction": "写一句关于%s的诗" % words[i % 8], "input": "" if i % 3 else "七言",
              "output": words[i % 8] + words[(i * 3 + 1) % 8]} for i in range(12)]
        b = [{"q": "说说%s" % words[i % 8], "ctx": "", "ans": words[(i + 2) % 8] + "好", "sys": "简短"} for i in range(8)]
        c = [{"messages": [{"role": "user", "content": "你好 %d" % i}, {"role": "assistant", "content": words[i % 8]}]}
             for i in range(8)]
        json.dump(a, open(os.path.join(data, "a.json"), "w"), ensure_ascii=False)
        json.dump(b, open(os.path.join(data, "b.json"), "w"), ensure_ascii=False)
        with open(os.path.join(data, "c.jsonl"), "w") as f:
            for r in c:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        info = {"poems": {"file_name": "a.json"},
                "renamed": {"file_name": "b.json", "columns": {"prompt": "q", "query": "ctx", "response": "ans", "system": "sys"}},
                "chats": {"file_name": "c.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
                          "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}},
                "hub": {"hf_hub_url": "llamafactory/alpaca_en"},
                "pairs": {"file_name": "a.json", "ranking": True},
                "pics": {"file_name": "c.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"}},
                "odd_tags": {"file_name": "c.jsonl", "formatting": "sharegpt", "tags": {"role_tag": "speaker"}},
                "long_column": {"file_name": "a.json", "columns": {"prompt": "p" * 200}}}
        json.dump(info, open(os.path.join(data, "dataset_info.json"), "w"))
        # the same records in one alpaca file (b's system prompt as glmtrain's alpaca "system",
        # c's single turns as instruction/output)
        same = a + [{"instruction": r["q"], "input": r["ctx"], "output": r["ans"], "system": r["sys"]} for r in b] + \
            [{"instruction": r["messages"][0]["content"], "output": r["messages"][1]["content"]} for r in c]
        one = os.path.join(d, "one.json")
        json.dump(same, open(one, "w"), ensure_ascii=False)
        common = ["--init_from_config", cfg, "--tokenizer_name", tok, "--learning_rate", "1e-2", "--seed", "7",
                  "--max_steps", "6", "--logging_steps", "1", "--per_device_train_batch_size", "4", "--save_strategy", "no",
                  "--disable_tqdm", "--report_to", "none", "--max_source_length", "32", "--max_target_length", "16"]
        p1 = train(common + ["--dataset", "poems, renamed,chats", "--dataset_dir", data, "--output_dir", os.path.join(d, "o1"),
                             "--template", "chatglm", "--stage", "sft"])
        p2 = train(common + ["--train_file", one, "--output_dir", os.path.join(d, "o2")])
        l1, l2 = losses(p1.stdout + p1.stderr), losses(p2.stdout + p2.stderr)
        report("dataset_info_equals_one_train_file", p1.returncode == 0 and len(l1) == 6 and l1 == l2,
               "%s vs %s %s" % (l1, l2, (p1.stderr + p2.stderr)[-600:]))
        report("dataset_info_summary_names_the_datasets", "datasets poems,renamed,chats" in p1.stderr, p1.stderr[-800:])
        # --max_train_samples N (ptuning's): the first N records, across the datasets in order
        for n, src in ((5, ["--train_file", one]), (15, ["--dataset", "poems,renamed,chats", "--dataset_dir", data])):
            first = os.path.join(d, "first%d.json" % n)
            json.dump(same[:n], open(first, "w"), ensure_ascii=False)
            p1 = train(common + src + ["--max_train_samples", str(n), "--output_dir", os.path.join(d, "m1_%d" % n)])
            p2 = train(common + ["--train_file", first, "--output_dir", os.path.join(d, "m2_%d" % n)])
            l1, l2 = losses(p1.stdout + p1.stderr), losses(p2.stdout + p2.stderr)
            report("max_train_samples_%d_is_the_first_records" % n, p1.returncode == 0 and len(l1) == 6 and l1 == l2 and
                   "records %d," % n in p1.stderr, "%s vs %s %s" % (l1, l2, p1.stderr[-500:]))
        # a LLaMA-Factory training config (flat YAML) through --config: the run of the same flags
        yml = os.path.join(d, "lf.yaml")
        with open(yml, "w") as f:
            f.write("""### model
init_from_config: %s
tokenizer_name: %s
trust_remote_code: true

### method
stage: sft
do_train: true
finetuning_type: lora
lora_target: all
lora_rank: 4

### dataset
dataset: poems,renamed
dataset_dir: %s
template: chatglm
cutoff_len: 1024
max_samples: 10
overwrite_cache: true
preprocessing_num_workers: 2

### output
output_dir: %s
logging_steps: 1
save_steps: 500
plot_loss: true
overwrite_output_dir: true
save_only_model: false
report_to: none

### train
per_device_train_batch_size: 4
gradient_accumulation_steps: 1
learning_rate: 1.0e-2
max_steps: 5
lr_scheduler_type: cosine
warmup_ratio: 0.1
ddp_timeout: 180000000
resume_from_checkpoint: null
seed: 7
disable_tqdm: yes
""" % (cfg, tok, data, os.path.join(d, "y1")))
        p1 = train(["--config", yml])
        flags = ["--init_from_config", cfg, "--tokenizer_name", tok, "--finetuning_type", "lora", "--lora_target", "all",
                 "--lora_rank", "4", "--dataset", "poems,renamed", "--dataset_dir", data, "--max_samples", "10", "--cutoff_len", "1024",
                 "--output_dir", os.path.join(d, "y2"), "--logging_steps", "1", "--save_steps", "500", "--report_to", "none",
                 "--per_device_train_batch_size", "4", "--learning_rate", "1e-2", "--max_steps", "5", "--lr_scheduler_type",
                 "cosine", "--warmup_ratio", "0.1", "--seed", "7", "--disable_tqdm"]
        p2 = train(flags)
        l1, l2 = losses(p1.stdout + p1.stderr), losses(p2.stdout + p2.stderr)
        report("lf_yaml_config_equals_flags", p1.returncode == 0 and len(l1) == 5 and l1 == l2 and "records 18," in p1.stderr,
               "%s vs %s %s" % (l1, l2, p1.stderr[-600:]))
        # max_samples: the first 10 records of each dataset (renamed has 8)
        first = os.path.join(d, "each10.json")
        json.dump(same[:10] + same[12:20], open(first, "w"), ensure_ascii=False)
        plain = flags[:flags.index("--dataset")] + flags[flags.index("--max_samples") + 2:]
        plain[plain.index(os.path.join(d, "y2"))] = os.path.join(d, "y3")
        p3 = train(plain + ["--train_file", first])
        report("max_samples_is_per_dataset", p3.returncode == 0 and losses(p3.stdout + p3.stderr) == l2, p3.stderr[-300:])
        for name, text, want in (("cutoff_len_too_small", "cutoff_len: 4\n", "--cutoff_len 4: the tokens an example keeps"),
                                 ("nested_unknown", "model_args:\n  x: 1\n", "lf_bad.yaml:2: unknown flag model_args.x"),
                                 ("unknown_key", "lora_rnak: 8\n", "lf_bad.yaml:1: unknown flag lora_rnak"),
                                 ("malformed", "\tlearning_rate: 1\n", "malformed YAML")):
            bad_yml = os.path.join(d, "lf_bad.yaml")
            open(bad_yml, "w").write(text)
            p = train(["--config", bad_yml] + common + ["--dataset", "poems", "--dataset_dir", data, "--output_dir",
                                                        os.path.join(d, "bady"), "--overwrite_output_dir"])
            report("lf_yaml_refuses_" + name, p.returncode != 0 and want in p.stderr, p.stderr[-300:])
        # THUDM's finetune_demo config (ChatGLM3 / GLM-4 finetune_hf.py's lora.yaml, nested) with
        # finetune_hf.py's data_dir: the run of the same flags
        ft = os.path.join(d, "lora.yaml")
        with open(ft, "w") as f:
            f.write("""data_config:
  train_file: a.json
  val_file: a.json
  test_file: a.json
  num_proc: 2
max_input_length: 32
max_output_length: 16
training_args:
  # see `transformers.Seq2SeqTrainingArguments`
  output_dir: %s
  max_steps: 5
  learning_rate: 1e-2
  per_device_train_batch_size: 4
  dataloader_num_workers: 2
  remove_unused_columns: false
  save_strategy: steps
  save_steps: 500
  log_level: info
  logging_strategy: steps
  logging_steps: 1
  per_device_eval_batch_size: 4
  evaluation_strategy: steps
  eval_steps: 500
  predict_with_generate: true
  generation_config:
    max_new_tokens: 16
  use_cpu: false
  seed: 7
peft_config:
  peft_type: LORA
  task_type: CAUSAL_LM
  r: 4
  lora_alpha: 32
  lora_dropout: 0.1
  target_modules: ["query_key_value", "dense"]
""" % os.path.join(d, "f1"))
        tail = ["--init_from_config", cfg, "--tokenizer_name", tok, "--disable_tqdm", "--report_to", "none"]
        p1 = train(["--config", ft, "--data_dir", data] + tail)
        p2 = train(tail + ["--train_file", os.path.join(data, "a.json"), "--validation_file", os.path.join(data, "a.json"),
                           "--max_source_length", "32", "--max_target_length", "16", "--output_dir", os.path.join(d, "f2"),
                           "--max_steps", "5", "--learning_rate", "1e-2", "--per_device_train_batch_size", "4",
                           "--save_steps", "500", "--logging_steps", "1", "--per_device_eval_batch_size", "4",
                           "--eval_strategy", "steps", "--eval_steps", "500", "--seed", "7", "--finetuning_type", "lora",
                           "--lora_rank", "4", "--lora_alpha", "32", "--lora_dropout", "0.1", "--lora_target",
                           "query_key_value,dense"])
        l1, l2 = losses(p1.stdout + p1.stderr), losses(p2.stdout + p2.stderr)
        report("thudm_finetune_config_equals_flags", p1.returncode == 0 and len(l1) == 5 and l1 == l2 and
               "training_args.log_level is not used" in p1.stderr, "%s vs %s %s" % (l1, l2, p1.stderr[-800:]))
        pt = os.path.join(d, "ptuning_v2.yaml")
        with open(pt, "w") as f:
            f.write("data_config:\n  train_file: a.json\nmax_input_length: 32\nmax_output_length: 16\ntraining_args:\n"
                    "  output_dir: %s\n  max_steps: 2\n  learning_rate: 2e-2\n  logging_steps: 1\n  save_strategy: \"no\"\n"
                    "peft_config:\n  peft_type: PREFIX_TUNING\n  task_type: CAUSAL_LM\n  num_virtual_tokens: 8\n"
                    "  num_attention_heads: 2\n  token_dim: 256\n" % os.path.join(d, "f3"))
        p = train(["--config", pt, "--data_dir", data] + tail)
        report("thudm_ptuning_config_trains_a_prefix", p.returncode == 0 and "pre_seq_len" in p.stderr and
               '"pre_seq_len":\t8' in p.stderr, p.stderr[-600:])
        with open(pt, "a") as f:
            f.write("  # the DeepSpeed file of the demo\n")
        # the demo's DeepSpeed file (ChatGLM3 finetune_demo/configs/ds_zero_3.json), read as the Trainer does
        z3 = os.path.join(d, "ds_zero_3.json")
        json.dump({"train_micro_batch_size_per_gpu": "auto", "zero_allow_untested_optimizer": True, "bf16": {"enabled": "auto"},
                   "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
                   "zero_optimization": {"stage": 3, "allgather_partitions": True, "allgather_bucket_size": 5e8,
                                         "reduce_scatter": True, "contiguous_gradients": True, "overlap_comm": True,
                                         "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                                         "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
                                         "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                                         "stage3_gather_16bit_weights_on_model_save": True}}, open(z3, "w"))
        ds = os.path.join(d, "ds.yaml")
        open(ds, "w").write("training_args:\n  deepspeed: %s\n  max_steps: 1\n" % z3)
        p = train(["--config", ds, "--data_dir", data, "--train_file", "a.json", "--output_dir", os.path.join(d, "f4")] + tail)
        report("thudm_config_deepspeed_file_sets_zero_3", p.returncode == 0 and re.search(r'"zero_stage":\s*3', p.stderr) is not None,
               p.stderr[-300:])
        # LLaMA-Factory's quantization_bit 4 is bitsandbytes NF4: said when its flags meet THUDM's INT4
        p = train(common + ["--dataset", "poems", "--dataset_dir", data, "--output_dir", os.path.join(d, "q4"),
                            "--finetuning_type", "lora", "--quantization_bit", "4", "--max_steps", "1"])
        report("lf_quantization_bit_4_says_nf4", p.returncode == 0 and "--quantization_type nf4" in p.stderr, p.stderr[-400:])
        # --eval_dataset: the validation set named in dataset_info.json, as --validation_file of its file
        def eval_losses(p):
            return re.findall(r"'eval_loss': ([0-9.]+)", p.stderr)
        run_ev = ["--dataset", "renamed", "--dataset_dir", data, "--max_steps", "2", "--eval_strategy", "steps", "--eval_steps", "1"]
        pa = train(common + run_ev + ["--eval_dataset", "poems", "--output_dir", os.path.join(d, "ev1")])
        pb = train(common + run_ev + ["--validation_file", os.path.join(data, "a.json"), "--output_dir", os.path.join(d, "ev2")])
        report("eval_dataset_equals_its_file_as_validation_file", pa.returncode == 0 and len(eval_losses(pa)) == 2 and
               eval_losses(pa) == eval_losses(pb) and "validation data: datasets poems" in pa.stderr,
               "%s vs %s %s" % (eval_losses(pa), eval_losses(pb), pa.stderr[-400:]))
        # an evaluation alone over a dataset_info entry (LLaMA-Factory's --do_eval without --do_train)
        pa = train(common + ["--dataset", "poems", "--dataset_dir", data, "--do_train", "false", "--do_eval", "--output_dir",
                             os.path.join(d, "ev3")])
        pb = train(common + ["--eval_dataset", "poems", "--dataset_dir", data, "--do_train", "false", "--do_eval", "--output_dir",
                             os.path.join(d, "ev4")])
        pc = train(common + ["--validation_file", os.path.join(data, "a.json"), "--do_train", "false", "--do_eval", "--output_dir",
                             os.path.join(d, "ev5")])
        report("eval_only_over_dataset_entries_equals_the_file", pa.returncode == 0 and eval_losses(pa) and
               eval_losses(pa) == eval_losses(pb) == eval_losses(pc),
               "%s %s %s %s" % (eval_losses(pa), eval_losses(pb), eval_losses(pc), pa.stderr[-300:] + pb.stderr[-300:]))
        # LLaMA-Factory's kernel switches are read and left alone; what changes training is refused
        yk = os.path.join(d, "kernels.yaml")
        open(yk, "w").write("flash_attn: auto\nuse_unsloth: false\nquantization_method: bitsandbytes\nmax_steps: 1\n")
        p = train(["--config", yk] + common + ["--dataset", "poems", "--dataset_dir", data, "--output_dir", os.path.join(d, "k1")])
        report("lf_kernel_switches_left_alone", p.returncode == 0 and "flash_attn is not used" in p.stderr, p.stderr[-300:])
        open(yk, "w").write("neftune_noise_alpha: 5\nmax_steps: 1\n")
        p = train(["--config", yk] + common + ["--dataset", "poems", "--dataset_dir", data, "--output_dir", os.path.join(d, "k2")])
        report("lf_neftune_trains", p.returncode == 0 and "NEFTune: noise of 5/sqrt" in p.stderr, p.stderr[-300:])
        two = os.path.join(d, "two_objects")  # dataset_info.json holding two objects: never read as the first
        os.makedirs(two)
        open(os.path.join(two, "dataset_info.json"), "w").write(json.dumps(info) + '\n{"more": {"file_name": "b.json"}}\n')
        bad = [("template_other_family", ["--dataset", "poems", "--template", "glm4"], "--template glm4"),
               ("eval_dataset_and_validation_file", ["--dataset", "poems", "--eval_dataset", "poems", "--validation_file", one],
                "--eval_dataset and --validation_file"),
               ("template_unknown", ["--dataset", "poems", "--template", "qwen"], "--template qwen"),
               ("stage_dpo", ["--dataset", "poems", "--stage", "dpo"], "--stage dpo"),
               ("missing_entry", ["--dataset", "nope"], "no dataset \"nope\""),
               ("hub_entry", ["--dataset", "hub"], "hf_hub_url"),
               ("ranking", ["--dataset", "pairs"], "ranking"),
               ("image_column", ["--dataset", "pics"], "images"),
               ("odd_tag", ["--dataset", "odd_tags"], "role_tag"),
               ("both_sources", ["--dataset", "poems", "--train_file", one], "--train_file and --dataset"),
               ("no_info_file", ["--dataset", "poems", "--dataset_dir", d], "dataset_info.json"),
               ("long_column_name", ["--dataset", "long_column"], "names a column of more than 127 bytes"),
               ("two_objects", ["--dataset", "poems", "--dataset_dir", two], "more after the JSON value ended")]
        for name, flags, want in bad:
            args = common + ["--output_dir", os.path.join(d, "bad"), "--overwrite_output_dir"] + flags
            if "--dataset_dir" not in flags:
                args += ["--dataset_dir", data]
            p = train(args)
            report("dataset_info_refuses_" + name, p.returncode != 0 and want in p.stderr and "Traceback" not in p.stderr
                   and "Sanitizer" not in p.stderr, p.stderr[-400:])
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
