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


def infer_seqlen(source_len, target_len, cutoff_len):
    """LLaMA-Factory's truncation rule (its data processors' infer_seqlen), written from its
    definition: the source gives way while the target is under half of the room, the target while
    the source is, else both keep their share of it."""
    if target_len * 2 < cutoff_len:
        max_target_len = cutoff_len
    elif source_len * 2 < cutoff_len:
        max_target_len = cutoff_len - source_len
    else:
        max_target_len = int(cutoff_len * (target_len / (source_len + target_len)))
    new_target_len = min(max_target_len, target_len)
    new_source_len = min(max(cutoff_len - new_target_len, 0), source_len)
    return new_source_len, new_target_len


def glm2_example_cutoff(rec, tokenizer, cutoff_len):
    """glm2_example's prompt and answer, cut by --cutoff_len: infer_seqlen over the prompt's and the
    answer's ids with the three specials ([gMASK] sop, eos) counted."""
    query = rec["query"] + ("\n" + rec["input"] if rec.get("input") else "")
    if not query or not rec["answer"]:
        return None
    prompt = (rec["system"] + "\n" if rec.get("system") else "") + tokenizer.build_prompt(query, rec.get("history") or [])
    full = tokenizer.encode(prompt, add_special_tokens=True)
    head, a = full[:2], full[2:]
    b = tokenizer.encode(rec["answer"], add_special_tokens=False)
    s, t = infer_seqlen(len(a), len(b), cutoff_len - 3)
    if t == 0:
        return None
    ids = head + a[:s] + b[:t] + [tokenizer.eos_token_id]
    labels = [-100] * (2 + s) + [(x if x != tokenizer.pad_token_id else -100) for x in b[:t] + [tokenizer.eos_token_id]]
    return ids, labels


def cut_conversation(example, tokenizer, cutoff_len, mask_history=False, roles=None, assistant=None, eos_marks=False):
    """A whole ChatGLM3 example (ids, labels) cut as --cutoff_len cuts it, found from the tokens
    alone: a pair's source runs to an <|assistant|> token (included), its target to the next role
    token or the closing one; the closing token is kept aside; pairs in order while room is left,
    each by infer_seqlen; the tokens keep their labels. mask_history: every label but the last
    answer's (its target and the mark after it) is cleared, and the pairs take the room from the
    last one back, kept in their order. roles / assistant: the role tokens' ids where no ChatGLM3
    tokenizer names them (GLM-4's). eos_marks (LLaMA-Factory's labels): with mask_history the first
    token of every pair after the first keeps its label, the eos after the answer before it, as
    LLaMA-Factory's supervised processor labels each pair's source [eos] + [IGNORE] * (n - 1)."""
    if example is None:
        return None
    ids, lab = example
    if roles is None:
        roles = {tokenizer.get_command(r) for r in ("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")}
        assistant = tokenizer.get_command("<|assistant|>")
    end = len(ids) - 1
    marks = [i for i in range(end) if ids[i] in roles]
    pairs, src0 = [], 0
    for j, p in enumerate(marks):
        if ids[p] == assistant:
            nxt = marks[j + 1] if j + 1 < len(marks) else end
            pairs.append((src0, p + 1, p + 1, nxt))
            src0 = nxt
    answers = [q for q in pairs]
    if src0 < end:
        pairs.append((src0, end, end, end))
    lab = list(lab)
    if mask_history:
        keep = set(range(answers[-1][2], answers[-1][3] + 1)) if answers else set()
        if eos_marks:
            keep |= {q[0] for q in pairs[1:]}
        lab = [x if i in keep else -100 for i, x in enumerate(lab)]
    order = list(reversed(pairs)) if mask_history else pairs
    total, kept = 1, {}
    for q in order:
        if total >= cutoff_len:
            break
        kept[q] = infer_seqlen(q[1] - q[0], q[3] - q[2], cutoff_len - total)
        total += sum(kept[q])
    ki, kl = [], []
    for s0, s1, t0, t1 in pairs:
        if (s0, s1, t0, t1) in kept:
            ns, nt = kept[(s0, s1, t0, t1)]
            ki += ids[s0:s0 + ns] + ids[t0:t0 + nt]
            kl += lab[s0:s0 + ns] + lab[t0:t0 + nt]
    ki.append(ids[end])
    kl.append(lab[end])
    kl[0] = -100  # the first token is no one's target
    return (ki, kl) if any(x != -100 for x in kl) else None
