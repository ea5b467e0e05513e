#!/usr/bin/env python
"""Build eagleflow's embedded demo target model and its prompt set, offline.

The demo target is a tiny Llama (``LlamaForCausalLM``) that thinks before it
answers, like the reasoning models eagleflow serves in production: every
assistant turn is ``<think>\\n...\\n</think>\\n<answer><|end|>``. Its one skill is
continuing Python code taken from this interpreter's own standard library.

Everything is derived from a fixed seed and the local stdlib sources (no
network):

1. text: ``*.py`` under ``sysconfig.get_paths()["stdlib"]`` (tests, generated
   tables and huge files skipped), sorted, then shuffled with the seed;
2. tokenizer: byte-level BPE (``tokenizers``), 2048 ids including the specials
   ``<|user|> <|assistant|> <|system|> <|end|> <|pad|>`` and the added
   *non-special* tokens ``<think>`` / ``</think>`` (single ids that survive
   ``skip_special_tokens=True``, as vLLM's ``deepseek_r1`` reasoning parser
   needs), saved as a transformers fast tokenizer with a chat template;
3. data: "Continue this code from `<path>`" examples, with a reasoning that is
   derivable from the snippet and the next lines of the file as the answer;
4. model: a 4-layer Llama trained from scratch on 2 CPU threads with a step cap
   and a wall-clock budget, saved in bfloat16;
5. prompts: ``prompts.jsonl`` with 1200 user prompts built the same way.

Usage::

    python scripts/build_demo_target.py --out demo            # ~6 min on 2 cores
    python scripts/build_demo_target.py --out /tmp/x --max-steps 20 --time-budget 30

The LR schedule follows the step cap, so the build is reproducible run to run
(same Python stdlib, same torch, same thread count) as long as the step cap,
not the time budget, ends training; the script says which one did.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import sys
import sysconfig
import time
from pathlib import Path

SPECIAL_TOKENS = ["<|pad|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
THINK_TOKENS = ["<think>", "</think>"]
VOCAB_SIZE = 2048  # including the specials and the two think tokens

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

MODEL_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=192,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=3,
    num_key_value_heads=1,
    head_dim=64,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    hidden_act="silu",
    attention_bias=False,
    mlp_bias=False,
    initializer_range=0.02,
)

MAX_EXAMPLE_TOKENS = 400
SNIPPET_LINES = (10, 15)
ANSWER_LINES = 10
MAX_LINE_CHARS = 100

# Directory names (any path component) that are skipped in the stdlib.
SKIP_DIRS = {
    "test",
    "tests",
    "idle_test",
    "site-packages",
    "__pycache__",
    "encodings",
    "pydoc_data",
    "ensurepip",
    "turtledemo",
    "lib2to3",
}
SKIP_FILE_RE = re.compile(r"^(_sysconfigdata.*|.*_test\.py|test_.*|unicodedata.*|stringprep)\.py$|^\w*_?tables?\.py$")
MAX_FILE_BYTES = 200_000
MIN_FILE_BYTES = 1_500

DEF_RE = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)")


def log(msg: str) -> None:
    print(f"[build_demo_target {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------- text


def stdlib_files(seed: int) -> list[tuple[str, str]]:
    """(relative path, text) of the selected stdlib sources, in a seeded order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    picked = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS or part.startswith("config-") for part in rel.parts[:-1]):
            continue
        if SKIP_FILE_RE.match(rel.name):
            continue
        size = path.stat().st_size
        if not (MIN_FILE_BYTES <= size <= MAX_FILE_BYTES):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        text = text.replace("\r\n", "\n").replace("\t", "    ")
        picked.append((rel.as_posix(), text))
    picked.sort()
    random.Random(seed).shuffle(picked)
    return picked


# ---------------------------------------------------------------------- examples


def defined_names(lines: list[str]) -> list[str]:
    names = []
    for line in lines:
        m = DEF_RE.match(line)
        if m and m.group(1) not in names:
            names.append(m.group(1))
    return names


def reasoning_for(path: str, snippet: list[str]) -> str:
    names = defined_names(snippet)
    if not names:
        defines = "no new names"
    elif len(names) == 1:
        defines = names[0]
    else:
        names = names[:4]
        defines = ", ".join(names[:-1]) + " and " + names[-1]
    return f"The snippet is from {path}. It defines {defines}. I will continue after line {len(snippet)}."


def user_prompt(path: str, snippet: list[str]) -> str:
    return f"Continue this code from `{path}`:\n```python\n" + "\n".join(snippet) + "\n```"


def assistant_answer(path: str, snippet: list[str], answer: list[str]) -> str:
    return "<think>\n" + reasoning_for(path, snippet) + "\n</think>\n" + "\n".join(answer)


def sample_window(rng: random.Random, path: str, lines: list[str]):
    """One (snippet, answer) window of the file, or None if this draw is unusable."""
    k = rng.randint(*SNIPPET_LINES)
    if len(lines) < k + ANSWER_LINES:
        return None
    start = rng.randrange(0, len(lines) - k - ANSWER_LINES + 1)
    snippet = lines[start : start + k]
    answer = lines[start + k : start + k + ANSWER_LINES]
    window = snippet + answer
    if any(len(line) > MAX_LINE_CHARS for line in window):
        return None
    if sum(1 for line in snippet if line.strip()) < 6:
        return None
    if sum(1 for line in answer if line.strip()) < 4:
        return None
    # Do not start a snippet on a blank line; trim trailing blank answer lines.
    if not snippet[0].strip():
        return None
    while answer and not answer[-1].strip():
        answer = answer[:-1]
    return snippet, answer


def make_examples(files, n: int, seed: int, tokenizer=None) -> list[dict]:
    """n examples (user, assistant); files drawn uniformly, windows seeded.

    If a tokenizer is given, examples longer than MAX_EXAMPLE_TOKENS (chat
    formatted) are dropped and another draw is made.
    """
    rng = random.Random(seed)
    split = [(path, [line.rstrip() for line in text.split("\n")]) for path, text in files]
    out, seen = [], set()
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > n * 50:
            raise RuntimeError(f"could only build {len(out)} of {n} examples")
        path, lines = split[rng.randrange(len(split))]
        win = sample_window(rng, path, lines)
        if win is None:
            continue
        snippet, answer = win
        key = (path, "\n".join(snippet))
        if key in seen:
            continue
        ex = {"path": path, "user": user_prompt(path, snippet), "assistant": assistant_answer(path, snippet, answer)}
        if tokenizer is not None:
            ids = tokenizer(chat_text(ex), add_special_tokens=False)["input_ids"]
            if len(ids) > MAX_EXAMPLE_TOKENS:
                continue
            ex["ids"] = ids
        seen.add(key)
        out.append(ex)
    return out


def chat_text(ex: dict) -> str:
    """The chat template applied to [user, assistant], ending at the eos <|end|>."""
    return f"<|user|>\n{ex['user']}<|end|>\n<|assistant|>\n{ex['assistant']}<|end|>"


# --------------------------------------------------------------------- tokenizer


def build_tokenizer(files, out_dir: Path):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(THINK_TOKENS),
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [text for _, text in files]
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tok.add_tokens(
        [
            AddedToken(t, special=False, normalized=False, single_word=False, lstrip=False, rstrip=False)
            for t in THINK_TOKENS
        ]
    )
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|end|>",
        pad_token="<|pad|>",
        additional_special_tokens=["<|user|>", "<|assistant|>", "<|system|>"],
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    save_tokenizer(fast, out_dir)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(out_dir)


def save_tokenizer(fast, out_dir: Path) -> None:
    """save_pretrained, then make the files readable by transformers 4.x and 5.x alike.

    transformers 5 writes the chat template to chat_template.jinja, names the
    class "TokenizersBackend", lists extra specials as a list under
    "extra_special_tokens" (4.x wants a dict there) and no longer writes
    special_tokens_map.json. We keep the template in tokenizer_config.json, use
    the class name both versions know, the key both read, and write the legacy
    special_tokens_map.json too.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        fast.save_pretrained(out_dir, save_jinja_files=False)
    except TypeError:  # older transformers: the template goes to tokenizer_config.json
        fast.save_pretrained(out_dir)
    jinja = out_dir / "chat_template.jinja"
    if jinja.exists():
        jinja.unlink()
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    extra = cfg.pop("extra_special_tokens", None) or cfg.get("additional_special_tokens") or []
    if isinstance(extra, dict):
        extra = list(extra.values())
    for k in ("is_local", "local_files_only", "name_or_path"):
        cfg.pop(k, None)
    cfg["additional_special_tokens"] = list(extra)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False, sort_keys=True) + "\n")
    stm = {"additional_special_tokens": list(extra), "eos_token": cfg["eos_token"], "pad_token": cfg["pad_token"]}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(stm, indent=2) + "\n")


def check_tokenizer(tk) -> dict:
    ids = {t: tk.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS + THINK_TOKENS}
    for t, i in ids.items():
        assert isinstance(i, int) and i != tk.unk_token_id, (t, i)
        assert tk.encode(t, add_special_tokens=False) == [i], (t, tk.encode(t, add_special_tokens=False))
    sample = "<think>\nreason\n</think>\ndef f(x):\n    return x<|end|>"
    enc = tk.encode(sample, add_special_tokens=False)
    dec = tk.decode(enc, skip_special_tokens=True)
    assert dec == "<think>\nreason\n</think>\ndef f(x):\n    return x", repr(dec)
    rendered = tk.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert rendered == "<|user|>\nhi<|end|>\n<|assistant|>\n", repr(rendered)
    full = tk.apply_chat_template(
        [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}], tokenize=False
    )
    assert full == chat_text({"user": "u", "assistant": "a"}) + "\n", repr(full)
    return ids


# ------------------------------------------------------------------------- model


def new_llama(end_id: int, pad_id: int):
    """The demo target's architecture, freshly initialised (torch's seed is set)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**MODEL_CONFIG, bos_token_id=None, eos_token_id=end_id, pad_token_id=pad_id)
    return LlamaForCausalLM(config)


def train_model(tk, train, out_dir: Path, args, new_model=new_llama) -> dict:
    """Train new_model(end_id, pad_id) on train's token ids; save it in bf16 to out_dir."""
    import torch
    from transformers import GenerationConfig

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    end_id = tk.convert_tokens_to_ids("<|end|>")
    pad_id = tk.convert_tokens_to_ids("<|pad|>")
    model = new_model(end_id, pad_id)
    model.config._attn_implementation = "sdpa"
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params:,} parameters ({n_params * 2 / 1e6:.2f} MB in bf16)")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        frac = (step - args.warmup) / max(1, args.max_steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    # Deterministic order: examples are already seeded; batches take them in turn.
    order = list(range(len(train)))
    random.Random(args.seed + 1).shuffle(order)
    model.train()
    t0 = time.time()
    step, tokens, ema = 0, 0, None
    stopped_by = "step cap"
    cursor = 0
    while step < args.max_steps:
        if time.time() - t0 > args.time_budget:
            stopped_by = "time budget"
            break
        batch = []
        for _ in range(args.batch_size):
            batch.append(train[order[cursor % len(order)]]["ids"])
            cursor += 1
        width = max(len(b) for b in batch)
        inp = torch.full((len(batch), width), pad_id, dtype=torch.long)
        att = torch.zeros((len(batch), width), dtype=torch.long)
        lab = torch.full((len(batch), width), -100, dtype=torch.long)
        for i, b in enumerate(batch):
            inp[i, : len(b)] = torch.tensor(b)
            att[i, : len(b)] = 1
            lab[i, : len(b)] = torch.tensor(b)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        out = model(input_ids=inp, attention_mask=att, labels=lab)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = out.loss.item()
        ema = loss if ema is None else 0.95 * ema + 0.05 * loss
        tokens += int(att.sum())
        step += 1
        if step % args.log_every == 0 or step == 1:
            el = time.time() - t0
            log(
                f"step {step:5d}  loss {loss:.4f}  ema {ema:.4f}  lr {lr_at(step - 1):.2e}  "
                f"{tokens / el:,.0f} tok/s  {el:.0f}s"
            )
    train_s = time.time() - t0
    log(
        f"training stopped by {stopped_by} after {step} steps, {train_s:.0f}s, "
        f"{tokens:,} tokens, last loss {loss:.4f}, ema {ema:.4f}"
    )

    model.eval()
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        eos_token_id=end_id, pad_token_id=pad_id, do_sample=False, max_new_tokens=256
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = "bfloat16"  # older readers; transformers 5 writes "dtype"
    cfg["dtype"] = "bfloat16"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return {
        "params": n_params,
        "steps": step,
        "train_s": round(train_s, 1),
        "tokens": tokens,
        "last_loss": round(loss, 4),
        "ema_loss": round(ema, 4),
        "stopped_by": stopped_by,
    }


def evaluate(tk, target: Path, heldout, n: int = 8, show: int = 3, threads: int = 2) -> dict:
    """Loss on 64 prompt-set examples (with their reference answers) and greedy
    decodes of a few prompts with HF (bf16, as saved); report format compliance."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16).eval()
    end_id = tk.convert_tokens_to_ids("<|end|>")
    tot, cnt = 0.0, 0
    with torch.no_grad():
        for ex in heldout[:64]:
            ids = torch.tensor([ex["ids"]])
            loss = model(input_ids=ids, labels=ids).loss.float().item()
            tot += loss * (ids.shape[1] - 1)
            cnt += ids.shape[1] - 1
    ok_think = ok_close = ok_end = 0
    for i, ex in enumerate(heldout[:n]):
        prompt = tk.apply_chat_template(
            [{"role": "user", "content": ex["user"]}], tokenize=False, add_generation_prompt=True
        )
        ids = tk(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=160, do_sample=False, eos_token_id=end_id, pad_token_id=end_id)
        new = gen[0, ids.shape[1] :].tolist()
        text = tk.decode(new, skip_special_tokens=False)
        ok_think += text.startswith("<think>")
        ok_close += "</think>" in text
        ok_end += end_id in new
        if i < show:
            log(f"sample ({ex['path']}):\n{text}\n" + "-" * 60)
    return {
        "heldout_loss_bf16": round(tot / cnt, 4),
        "n": n,
        "starts_with_think": ok_think,
        "closes_think": ok_close,
        "ends_within_160": ok_end,
    }


# -------------------------------------------------------------------------- main


def arg_parser(doc: str = __doc__) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", default="demo", help="output dir (target/ and prompts.jsonl)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=700)
    ap.add_argument(
        "--time-budget", type=float, default=600.0, help="seconds of training (a guard: the step cap normally ends it)"
    )
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-prompts", type=int, default=1200)
    ap.add_argument("--max-target-mb", type=float, default=5.0)
    return ap


def offline_env() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def finish_target(tk, target: Path, prompts, args) -> dict | None:
    """Size check and evaluation of the staged target; None if it is too large."""
    for p in target.iterdir():
        p.chmod(0o644)  # safetensors writes 0600
    size = sum(p.stat().st_size for p in target.iterdir())
    log(
        f"target: {size / 1e6:.2f} MB: " + ", ".join(f"{p.name} {p.stat().st_size:,}" for p in sorted(target.iterdir()))
    )
    if size > args.max_target_mb * 1e6:
        log(f"ERROR: target is {size / 1e6:.2f} MB > {args.max_target_mb} MB")
        return None
    ev = evaluate(tk, target, prompts, threads=args.threads)
    log(f"eval: {ev}")
    return ev


def swap_in(staged: Path, final: Path) -> None:
    """Replace final by staged, so a reader of final never sees a half-written model."""
    old = final.parent / f".{final.name}.old"
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        final.rename(old)
    staged.rename(final)
    if old.exists():
        shutil.rmtree(old)


def main(argv=None) -> int:
    args = arg_parser().parse_args(argv)
    offline_env()
    t_all = time.time()
    out = Path(args.out)
    # Build into a staging folder and swap it in at the end, so a server that
    # is reading out/target meanwhile never sees a half-written model.
    final_target = out / "target"
    target = out / ".target.building"
    if target.exists():
        shutil.rmtree(target)

    files = stdlib_files(args.seed)
    log(
        f"python {sys.version.split()[0]}, stdlib {sysconfig.get_paths()['stdlib']}: "
        f"{len(files)} files, {sum(len(t) for _, t in files) / 1e6:.1f} MB of text"
    )

    t = time.time()
    tk = build_tokenizer(files, target)
    ids = check_tokenizer(tk)
    log(f"tokenizer: vocab {len(tk)}, ids {ids}, {time.time() - t:.0f}s")

    n_train = args.max_steps * args.batch_size
    train = make_examples(files, n_train, seed=args.seed + 100, tokenizer=tk)
    lens = sorted(len(ex["ids"]) for ex in train)
    log(f"train examples: {len(train)}, tokens min/median/max {lens[0]}/{lens[len(lens) // 2]}/{lens[-1]}")

    prompts = make_examples(files, args.n_prompts, seed=args.seed + 200, tokenizer=tk)
    out.mkdir(parents=True, exist_ok=True)
    prompts_tmp = out / ".prompts.jsonl.building"
    with open(prompts_tmp, "w", encoding="utf-8") as f:
        for ex in prompts:
            f.write(json.dumps({"messages": [{"role": "user", "content": ex["user"]}]}, ensure_ascii=False) + "\n")
    log(f"prompts: {len(prompts)} ({prompts_tmp.stat().st_size / 1e6:.2f} MB)")

    stats = train_model(tk, train, target, args)
    if finish_target(tk, target, prompts, args) is None:
        return 1
    swap_in(target, final_target)
    os.replace(prompts_tmp, out / "prompts.jsonl")
    log(f"wrote {final_target}/ and {out / 'prompts.jsonl'}")
    log(f"done in {time.time() - t_all:.0f}s: {json.dumps(stats)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
