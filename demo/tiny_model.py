"""A tiny random-weight llama model written as GGUF at test time (the ``gguf`` package): the
real llama.cpp engine serves it, nothing is downloaded. 8 layers, hidden 512, a SentencePiece
vocabulary of ~1,100 tokens (the 256 byte tokens, three controls, words): on 2 cores it
streams 100 tokens in well under a second. Its answers are noise; their timing is real."""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

LAYERS, HIDDEN, FFN, HEADS = 8, 512, 1024, 8
CONTEXT = 8192
EOS = 2
# The controls and the 256 byte tokens get all-zero output rows: their logit is 0 while the
# words' spread around it, so a greedy answer (temperature 0) never picks them — no early end
# of stream, no half UTF-8 character the server would hold back: every token is one content
# event. (Clients that sample pass logit_bias {EOS: -100} as well.)
NON_WORDS = 3 + 256


def vocab() -> tuple[list[bytes], list[float], list[int]]:
    tokens = [b"<unk>", b"<s>", b"</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [b"<0x%02X>" % i for i in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    letters = "abcdefghijklmnopqrstuvwxyz"
    # every one- to two-letter word and a few longer: ~1,100 tokens in all, no duplicate
    words = [f"\u2581{a}" for a in letters] + [f"\u2581{a}{b}" for a in letters for b in letters]
    words += [f"\u2581{w}" for w in ("the", "and", "you", "that", "with", "for", "not")]
    words += [f"{a}{b}" for a in letters[:6] for b in letters]
    for w in words:
        tokens.append(w.encode())
        types.append(gguf.TokenType.NORMAL)
    scores = [0.0] * 3 + [-1000.0] * 256 + [-float(i) for i in range(len(words))]
    return tokens, scores, [int(t) for t in types]


def write(path: Path, seed: int = 7) -> Path:
    rng = np.random.default_rng(seed)
    tokens, scores, types = vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-random")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(EOS)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)

    def t(name: str, *shape: int, scale: float = 0.02) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    n_vocab = len(tokens)
    t("token_embd.weight", n_vocab, HIDDEN, scale=1.0)
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    out = (rng.standard_normal((n_vocab, HIDDEN)) * 0.02).astype(np.float32)
    out[:NON_WORDS] = 0.0
    w.add_tensor("output.weight", out)
    for i in range(LAYERS):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t(p + name + ".weight", HIDDEN, HIDDEN)
        w.add_tensor(p + "ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        t(p + "ffn_gate.weight", FFN, HIDDEN)
        t(p + "ffn_up.weight", FFN, HIDDEN)
        t(p + "ffn_down.weight", HIDDEN, FFN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


if __name__ == "__main__":
    write(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny.gguf"))
