"""How much a drafter can be accepted when production samples: the bound for greedy drafts, against the served AL.

    .hostenv/bin/python benchmarks/sampled_bound.py --prompts 24 --max-tokens 160      (docs/benchmarks.md)

vLLM's EAGLE-3 (0.26 on GPU, 0.32 on CPU; `speculative_config.draft_sample_method`, default 'greedy') drafts the
drafter's argmax and treats the draft as one-hot in the rejection test: a draft token x is accepted with the target's
probability of x after temperature and top_p (the rejection sampler applies both to the target's logits). So even a
drafter that always drafts the target's own argmax is accepted only as often as the target's sample lands on its
argmax: the target's own confidence caps the AL. With 'probabilistic' drafts the test is min(1, p(x) / q(x)) and a
drafter whose distribution q matches the target's p is always accepted.

This measures that cap on the demo target (transformers, CPU): for each prompt an answer sampled at the setting
(seeded), and at every answer position t a step of k drafts made by a perfect greedy drafter: d1 = the target's
argmax after the prefix, d2 after prefix + d1, ...; draft i is accepted with p(d_i) and only after drafts 1..i-1, so
a step's expected AL is 1 + sum_i prod_{j<=i} p(d_j). Printed per temperature and top_p: the mean over every step
start, beside the bound's first factor (p of the argmax: the per-token acceptance of greedy drafts).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The target's sampling distribution over the last dim after temperature and top_p; one-hot argmax at 0."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    p = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1:
        sorted_p, idx = p.sort(-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # the nucleus: the top tokens until top_p is reached
        sorted_p = sorted_p * keep
        p = torch.zeros_like(p).scatter(-1, idx, sorted_p)
        p = p / p.sum(-1, keepdim=True)
    return p


@torch.no_grad()
def step_al(model, ids: torch.Tensor, start: int, k: int, temperature: float, top_p: float) -> tuple[list, list]:
    """For every answer position t >= start of one sequence [1, n]: the expected AL of a step of k perfect greedy
    drafts there, and p(argmax) at t. One forward over the whole sequence gives every p(. | prefix); the later drafts
    come from the cache cropped back to each prefix (last start first: a crop only shortens), one token at a time."""
    out = model(input_ids=ids, use_cache=True)
    logits, cache = out.logits[0], out.past_key_values  # [n, vocab]
    als, firsts = [], []
    for t in range(ids.shape[1] - 1, start - 1, -1):
        if cache.get_seq_length() > t:  # back to ids[:t] (a negative count: the tokens to drop)
            cache.crop(t - cache.get_seq_length())
        step = logits[t - 1]  # p(. | ids[:t]): the first draft's distribution
        acc, al = 1.0, 1.0
        for i in range(k):
            d = int(step.argmax())
            p_d = float(probs(step, temperature, top_p)[d])
            if i == 0:
                firsts.append(p_d)
            acc *= p_d
            al += acc
            if i + 1 < k:
                step = model(input_ids=torch.tensor([[d]]), past_key_values=cache, use_cache=True).logits[0, -1]
        als.append(al)
    return als, firsts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(ROOT / "demo" / "target"))
    ap.add_argument("--prompts-file", default=str(ROOT / "demo" / "prompts.jsonl"))
    ap.add_argument("--prompts", type=int, default=24, help="the first N prompts of the file")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--k", type=int, default=3, help="draft tokens a step (the demo's num_speculative_tokens)")
    ap.add_argument("--settings", default="0:1,0.6:0.95,0.7:1,0.7:0.95,1.0:1,1.0:0.95", help="temperature:top_p,...")
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(args.target)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    lines = Path(args.prompts_file).read_text().splitlines()[: args.prompts]
    chats = [json.loads(x)["messages"] for x in lines]
    rows = []
    for setting in args.settings.split(","):
        t, top_p = (float(x) for x in setting.split(":"))
        began, als, firsts = time.monotonic(), [], []
        for i, messages in enumerate(chats):
            prompt = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
            prompt = prompt["input_ids"] if not isinstance(prompt, torch.Tensor) else prompt
            gen = dict(do_sample=True, temperature=t, top_p=top_p) if t > 0 else dict(do_sample=False)
            torch.manual_seed(i)
            out = model.generate(prompt, max_new_tokens=args.max_tokens, pad_token_id=tok.eos_token_id, **gen)
            al, first = step_al(model, out, prompt.shape[1], args.k, t, top_p)
            als += al
            firsts += first
        row = {
            "temperature": t,
            "top_p": top_p,
            "k": args.k,
            "bound_al": sum(als) / len(als),
            "p_argmax": sum(firsts) / len(firsts),
            "steps": len(als),
            "seconds": round(time.monotonic() - began, 1),
        }
        rows.append(row)
        print(
            f"temperature {t:g}, top_p {top_p:g}: greedy-draft AL bound {row['bound_al']:.2f} (k {args.k}), "
            f"p(argmax) {row['p_argmax']:.3f} over {row['steps']} step starts ({row['seconds']} s)",
            flush=True,
        )
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
