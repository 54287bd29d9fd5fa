#!/usr/bin/env python3
"""Write tiny llama-architecture GGUF models for a real llama.cpp `llama-server` (issue #16), offline.

Two sources, both local (nothing is downloaded):

* ``--from-hf`` (default when it exists): convert the tiny Hugging Face Llama models that
  scripts/setup-vllm-cpu.sh builds (``$CACHE/models/tiny-llama`` and ``tiny-llama-draft``; briefly trained
  to repeat spans, byte-level BPE tokenizer of 1024 tokens). The draft shares the target's vocabulary,
  so ``--model-draft`` works, and both learned to copy, so drafts get accepted some of the time.
* ``--random``: random weights and a vocabulary built here (4 special tokens + the 256 byte-level
  symbols + a few merges learned from a small generated corpus). Output is gibberish, but the server
  loads it, drafts and verifies: enough to see the metric families and the per-request timings.

Needs only ``gguf`` and ``numpy`` (scripts/setup-llama-cpp.sh puts both in its venv). The safetensors
files are read directly (header + raw little-endian data), so neither torch nor safetensors is needed.

    python scripts/make_tiny_gguf.py --out-dir ~/.cache/specdecode-exporter/models
    python scripts/make_tiny_gguf.py --out-dir DIR --random

Writes ``DIR/tiny-llama.gguf`` (target) and ``DIR/tiny-llama-draft.gguf`` (draft, same vocab).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import struct
import sys
from collections import Counter
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - message for people running it with the wrong python
    sys.exit("needs the gguf package (pip install gguf); scripts/setup-llama-cpp.sh installs it")

SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
DEFAULT_CACHE = Path(
    os.environ.get("SPECDECODE_LLAMA_HOME")
    or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdecode-exporter"
)

# A minimal chat template without special tokens, so /v1/chat/completions works with --jinja (the
# default in current llama-server builds); llama-server can also be started with --chat-template chatml.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


# ---------------------------------------------------------------------------------------------------
# byte-level BPE helpers (GPT-2's reversible byte -> printable-unicode map)


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins GPT-2 style byte-level BPE uses for bytes 0..255, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def build_random_vocab(n_merges: int, seed: int) -> tuple[list[str], list[str]]:
    """4 specials + 256 byte symbols + `n_merges` merges learned greedily from a generated corpus."""
    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ren", "to", "sa", "vel", "dor", "pi", "nu", "ga", "ter", "shi", "mo"]
    words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 3))) for _ in range(200)]
    text = " ".join(rng.choice(words) for _ in range(5000))
    sym = byte_symbols()
    # GPT-2 pre-tokenization keeps the leading space with the word: " word" -> "Ġword"
    pieces = Counter("".join(sym[b] for b in (" " + w).encode()) for w in text.split())
    seqs = {p: list(p) for p in pieces}
    tokens = SPECIAL + sym
    merges: list[str] = []
    for _ in range(n_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for p, n in pieces.items():
            s = seqs[p]
            for a, b in itertools.pairwise(s):
                pairs[(a, b)] += n
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        for p, s in seqs.items():
            i, out = 0, []
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[p] = out
    return tokens, merges


# ---------------------------------------------------------------------------------------------------
# reading a Hugging Face Llama


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    out: dict[str, np.ndarray] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        buf = raw[base + start : base + end]
        dtype = meta["dtype"]
        if dtype == "F32":
            arr = np.frombuffer(buf, dtype="<f4")
        elif dtype == "F16":
            arr = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif dtype == "BF16":
            arr = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: unsupported dtype {dtype} for {name}")
        out[name] = arr.reshape(meta["shape"]).astype(np.float32)
    return out


def read_hf_vocab(model_dir: Path) -> tuple[list[str], list[str], list[int]]:
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    model = tok["model"]
    if model.get("type") != "BPE":
        raise SystemExit(f"{model_dir}: tokenizer is {model.get('type')}, expected byte-level BPE")
    vocab: dict[str, int] = dict(model["vocab"])
    for added in tok.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    tokens = [""] * (max(vocab.values()) + 1)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    special_ids = [a["id"] for a in tok.get("added_tokens", []) if a.get("special")]
    return tokens, merges, special_ids


def rope_reorder(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF Llama stores q/k rows as [first halves | second halves] per head (rotate_half layout);
    GGML's llama rope pairs adjacent rows. Interleave the two halves of every head."""
    rows, cols = w.shape
    head_dim = rows // n_head
    return w.reshape(n_head, 2, head_dim // 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def hf_to_tensors(model_dir: Path) -> tuple[dict, dict[str, np.ndarray]]:
    cfg = json.loads((model_dir / "config.json").read_text())
    st = read_safetensors(model_dir / "model.safetensors")
    n_head, n_kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    t: dict[str, np.ndarray] = {
        "token_embd.weight": st["model.embed_tokens.weight"],
        "output_norm.weight": st["model.norm.weight"],
        "output.weight": st.get("lm_head.weight", st["model.embed_tokens.weight"]),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[f"blk.{i}.attn_norm.weight"] = st[p + "input_layernorm.weight"]
        t[f"blk.{i}.attn_q.weight"] = rope_reorder(st[p + "self_attn.q_proj.weight"], n_head)
        t[f"blk.{i}.attn_k.weight"] = rope_reorder(st[p + "self_attn.k_proj.weight"], n_kv)
        t[f"blk.{i}.attn_v.weight"] = st[p + "self_attn.v_proj.weight"]
        t[f"blk.{i}.attn_output.weight"] = st[p + "self_attn.o_proj.weight"]
        t[f"blk.{i}.ffn_norm.weight"] = st[p + "post_attention_layernorm.weight"]
        t[f"blk.{i}.ffn_gate.weight"] = st[p + "mlp.gate_proj.weight"]
        t[f"blk.{i}.ffn_up.weight"] = st[p + "mlp.up_proj.weight"]
        t[f"blk.{i}.ffn_down.weight"] = st[p + "mlp.down_proj.weight"]
    hp = {
        "n_vocab": cfg["vocab_size"],
        "n_embd": cfg["hidden_size"],
        "n_layer": cfg["num_hidden_layers"],
        "n_ff": cfg["intermediate_size"],
        "n_head": n_head,
        "n_kv": n_kv,
        "n_ctx": cfg.get("max_position_embeddings", 512),
        "eps": cfg.get("rms_norm_eps", 1e-5),
        "rope_theta": (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0)),
        "bos": cfg.get("bos_token_id", 1),
        "eos": cfg.get("eos_token_id", 2),
        "pad": cfg.get("pad_token_id", 3),
    }
    return hp, t


def random_tensors(n_vocab: int, n_embd: int, n_layer: int, n_head: int, n_ff: int, seed: int):
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    t = {
        "token_embd.weight": w(n_vocab, n_embd),
        "output_norm.weight": np.ones(n_embd, np.float32),
        "output.weight": w(n_vocab, n_embd),
    }
    for i in range(n_layer):
        t[f"blk.{i}.attn_norm.weight"] = np.ones(n_embd, np.float32)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t[f"blk.{i}.{name}.weight"] = w(n_embd, n_embd)
        t[f"blk.{i}.ffn_norm.weight"] = np.ones(n_embd, np.float32)
        t[f"blk.{i}.ffn_gate.weight"] = w(n_ff, n_embd)
        t[f"blk.{i}.ffn_up.weight"] = w(n_ff, n_embd)
        t[f"blk.{i}.ffn_down.weight"] = w(n_embd, n_ff)
    hp = {
        "n_vocab": n_vocab,
        "n_embd": n_embd,
        "n_layer": n_layer,
        "n_ff": n_ff,
        "n_head": n_head,
        "n_kv": n_head,
        "n_ctx": 512,
        "eps": 1e-5,
        "rope_theta": 10000.0,
        "bos": 1,
        "eos": 2,
        "pad": 3,
    }
    return hp, t


# ---------------------------------------------------------------------------------------------------


def write_gguf(
    path: Path,
    name: str,
    hp: dict,
    tensors: dict[str, np.ndarray],
    tokens: list[str],
    merges: list[str],
    special_ids: list[int],
) -> None:
    if len(tokens) != hp["n_vocab"]:
        raise SystemExit(f"{name}: {len(tokens)} tokens but the model has vocab_size {hp['n_vocab']}")
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(hp["n_ctx"])
    w.add_embedding_length(hp["n_embd"])
    w.add_block_count(hp["n_layer"])
    w.add_feed_forward_length(hp["n_ff"])
    w.add_head_count(hp["n_head"])
    w.add_head_count_kv(hp["n_kv"])
    w.add_layer_norm_rms_eps(hp["eps"])
    w.add_rope_freq_base(hp["rope_theta"])
    w.add_rope_dimension_count(hp["n_embd"] // hp["n_head"])
    w.add_vocab_size(hp["n_vocab"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    types = [gguf.TokenType.NORMAL] * len(tokens)
    for i in special_ids:
        types[i] = gguf.TokenType.CONTROL
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(hp["bos"])
    w.add_eos_token_id(hp["eos"])
    w.add_unk_token_id(0)
    w.add_pad_token_id(hp["pad"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    for tname, arr in tensors.items():
        w.add_tensor(tname, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {path} ({path.stat().st_size} bytes, {len(tensors)} tensors, vocab {len(tokens)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_CACHE / "models")
    ap.add_argument(
        "--from-hf",
        type=Path,
        default=DEFAULT_CACHE / "models" / "tiny-llama",
        help="HF target dir (its draft is the sibling DIR-draft); default: the vLLM test model",
    )
    ap.add_argument("--random", action="store_true", help="random weights + a vocab built here, no HF model")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    target, draft = args.out_dir / "tiny-llama.gguf", args.out_dir / "tiny-llama-draft.gguf"

    hf_draft = args.from_hf.with_name(args.from_hf.name + "-draft")
    if (
        not args.random
        and (args.from_hf / "model.safetensors").is_file()
        and (hf_draft / "model.safetensors").is_file()
    ):
        tokens, merges, special_ids = read_hf_vocab(args.from_hf)
        d_tokens, d_merges, _ = read_hf_vocab(hf_draft)
        if (d_tokens, d_merges) != (tokens, merges):
            raise SystemExit(f"{hf_draft} has a different vocabulary from {args.from_hf}")
        hp, t = hf_to_tensors(args.from_hf)
        write_gguf(target, "tiny-llama", hp, t, tokens, merges, special_ids)
        hp, t = hf_to_tensors(hf_draft)
        write_gguf(draft, "tiny-llama-draft", hp, t, tokens, merges, special_ids)
        return

    if not args.random:
        print(f"no HF model at {args.from_hf} (+ -draft); writing random-weight models instead", file=sys.stderr)
    tokens, merges = build_random_vocab(n_merges=124, seed=args.seed)
    special_ids = list(range(len(SPECIAL)))
    hp, t = random_tensors(len(tokens), n_embd=64, n_layer=2, n_head=2, n_ff=128, seed=args.seed)
    write_gguf(target, "tiny-llama-random", hp, t, tokens, merges, special_ids)
    hp, t = random_tensors(len(tokens), n_embd=32, n_layer=1, n_head=1, n_ff=64, seed=args.seed + 1)
    write_gguf(draft, "tiny-llama-random-draft", hp, t, tokens, merges, special_ids)


if __name__ == "__main__":
    main()
