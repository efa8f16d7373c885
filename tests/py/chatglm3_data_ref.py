"""Python re-implementations of how THUDM builds ChatGLM2/3 training examples, over the reference
tokenizers of chatglm23_tok_ref.py: what test_chatglm23_data.py compares glmtrain's examples with.

- ChatGLM3-6B finetune_demo/finetune_hf.py process_batch (the THUDM label convention), with the
  one rule it lacks taken from the tokenizer's build_chat_input: a system turn's "tools" are
  appended to its content as "\\n" + json.dumps(tools, indent=4, ensure_ascii=False)
  (process_batch itself ignores a turn's tools and refuses a top-level tools column).
- The same ids with LLaMA-Factory's efficient_eos labels (the EOS convention).
- ChatGLM2-6B ptuning/main.py preprocess_function_train.
- glmtrain's mapping of instruction records (alpaca / columns / sharegpt) onto ChatGLM3 turns.
Not a test itself."""
import json


def content_of(message):
    content = message["content"]
    if message["role"] == "system" and "tools" in message:
        content = content + "\n" + json.dumps(message["tools"], indent=4, ensure_ascii=False)
    return content


def process_batch(batch, tokenizer, max_input_length, max_output_length):
    """finetune_hf.py's process_batch (tools as content_of says)."""
    batched_input_ids, batched_labels = [], []
    for conv in batch["conversations"]:
        input_ids, loss_masks = [tokenizer.get_command("[gMASK]"), tokenizer.get_command("sop")], [False, False]
        for message in conv:
            loss_mask_val = message["role"] not in ("system", "user")
            new_input_ids = tokenizer.build_single_message(message["role"], "", content_of(message))
            input_ids += new_input_ids
            loss_masks += [loss_mask_val] * len(new_input_ids)
        input_ids.append(tokenizer.eos_token_id)
        loss_masks = [False, *loss_masks]
        labels = [i if m else -100 for i, m in zip(input_ids, loss_masks)]
        max_length = max_input_length + max_output_length + 1
        batched_input_ids.append(input_ids[:max_length])
        batched_labels.append(labels[:max_length])
    return {"input_ids": batched_input_ids, "labels": batched_labels}


def process_eos(conv, tokenizer, max_input_length, max_output_length):
    """The same ids, LLaMA-Factory's efficient_eos labels: an assistant turn's "\\n" and content are
    targets and the token after it is labelled eos; nothing else is."""
    eos = tokenizer.eos_token_id
    ids, labels = [tokenizer.get_command("[gMASK]"), tokenizer.get_command("sop")], [-100, -100]
    after_assistant = False
    for message in conv:
        t = tokenizer.build_single_message(message["role"], "", content_of(message))
        labels.append(eos if after_assistant else -100)
        if message["role"] == "assistant":
            labels += t[1:]
        else:
            labels += [-100] * (len(t) - 1)
        ids += t
        after_assistant = message["role"] == "assistant"
    ids.append(eos)
    labels.append(eos if after_assistant else -100)
    max_length = max_input_length + max_output_length + 1
    return ids[:max_length], labels[:max_length]


def glm3_example(conv, tokenizer, max_source_length, max_target_length, labels="thudm", train_on_prompt=False):
    """(ids, labels) as glmtrain builds them, or None when the example is dropped (no target)."""
    if not conv:
        return None
    if labels == "thudm":
        out = process_batch({"conversations": [conv]}, tokenizer, max_source_length, max_target_length)
        ids, lab = out["input_ids"][0], out["labels"][0]
    else:
        ids, lab = process_eos(conv, tokenizer, max_source_length, max_target_length)
    if train_on_prompt:
        lab = list(ids)
    return (ids, lab) if any(x != -100 for x in lab) else None


def record_turns(rec, source_prefix=""):
    """An instruction record {system, query, input, answer, history} as ChatGLM3 turns."""
    turns = [{"role": "system", "content": rec["system"]}] if rec.get("system") else []
    for q, r in rec.get("history") or []:
        turns += [{"role": "user", "content": q}, {"role": "assistant", "content": r}]
    query = rec["query"] + ("\n" + rec["input"] if rec.get("input") else "")
    turns += [{"role": "user", "content": query}, {"role": "assistant", "content": rec["answer"]}]
    first = next(t for t in turns if t["role"] == "user")
    first["content"] = source_prefix + first["content"]
    return turns


def glm2_example(rec, tokenizer, max_source_length, max_target_length, source_prefix="", train_on_prompt=False):
    """ChatGLM2-6B ptuning/main.py preprocess_function_train for one record (glmtrain's extensions:
    an alpaca input after the instruction, a system prompt before the prompt); None when dropped."""
    query = rec["query"] + ("\n" + rec["input"] if rec.get("input") else "")
    if not query or not rec["answer"]:
        return None
    prompt = tokenizer.build_prompt(query, rec.get("history") or [])
    prompt = source_prefix + (rec["system"] + "\n" if rec.get("system") else "") + prompt
    a_ids = tokenizer.encode(prompt, add_special_tokens=True, max_length=max_source_length)
    b_ids = tokenizer.encode(rec["answer"], add_special_tokens=False, max_length=max_target_length)
    if not b_ids:
        return None
    input_ids = a_ids + b_ids + [tokenizer.eos_token_id]
    if train_on_prompt:
        return input_ids, list(input_ids)
    labels = [tokenizer.pad_token_id] * len(a_ids) + b_ids + [tokenizer.eos_token_id]
    labels = [(l if l != tokenizer.pad_token_id else -100) for l in labels]
    return input_ids, labels
