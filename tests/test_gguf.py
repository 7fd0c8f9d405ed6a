"""GGUF import (mlx_swe_rl/gguf.py), checked against an independent reference.

tests/data/smollm2_gguf_reference.json was recorded by scripts/record_gguf_reference.py with
Hugging Face transformers + PyTorch (its own GGUF dequantizer, Q/K un-permutation and tokenizer),
so agreement here is not the importer agreeing with itself. Measured on SmolLM2-135M-Instruct
Q4_1 (max abs logit difference to the float32 PyTorch reference, over the 21 watched token ids at
every prompt position and the reference top-50 at the last position; logits range about +-30):
  dequantize=True (float32):           1.1e-4   -> tolerance 2e-3
  quantized, dtype="float32" scales:   8e-5     (not tested here, to keep the test fast)
  quantized, default (float16 scales): 2.1e-2   -> tolerance 5e-2 (the quantized embedding
                                                   returns float16 activations)
Greedy continuations (24 tokens, all three prompts) were identical in every configuration. The
reference's smallest top-1/top-2 margin is 0.0044 (chat prompt, step 13), far above the
dequantized error; the quantized check stops at the first step whose margin is under 2x its
tolerance. MLX's CPU quantized matmul is slow (~0.2 s per token here), so the quantized model is
run on one prompt only; the exact dequantize(quantized) == dequantized weight check covers the rest.
The same JSON carries a tiny random Qwen2 GGUF written by the `gguf` package with transformers'
logits for it (Qwen2 names, q/k/v biases, no RoPE permutation, Q4_0 + Q8_0 mixed, qwen2 regex).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlx_swe_rl.models.gguf import GGUFError, hf_tensor_name, import_gguf, read_gguf_metadata, unpermute_rope_rows

REF = json.loads((Path(__file__).parent / "data" / "smollm2_gguf_reference.json").read_text(encoding="utf-8"))
TOL_DEQUANT, TOL_QUANT = 2e-3, 5e-2


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF the reference was recorded from."""
    if env := os.environ.get("MLX_SWE_RL_SMOLLM2_GGUF"):  # a local copy, for development
        path = Path(env)
    else:
        try:
            from mlx_swe_rl.models.specs import builtin_gguf
        except ImportError as e:
            pytest.skip(f"mlx_swe_rl.models.builtin_gguf is not available: {e}")
        path = Path(builtin_gguf("smollm2-135m"))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == REF["gguf_sha256"], "not the reference's GGUF"
    return path


@pytest.fixture(scope="session")
def dirs(smollm2_gguf, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf")
    return {
        "q": import_gguf(smollm2_gguf, root / "q", progress=False),
        "f32": import_gguf(smollm2_gguf, root / "f32", dequantize=True, progress=False),
    }


def _load(path: Path):
    import mlx_lm

    return mlx_lm.load(str(path))


@pytest.fixture(scope="session")
def f32_model(dirs):
    return _load(dirs["f32"])


def _run(model, ids: list[int], steps: int = 24) -> tuple[np.ndarray, list[int]]:
    """Prompt logits (T, V) and a greedy continuation of `steps` tokens (KV cache, no EOS stop)."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array([ids]), cache=cache)[0].astype(mx.float32)
    out, nxt = [], logits[-1]
    for i in range(steps):
        out.append(int(mx.argmax(nxt).item()))
        if i + 1 < steps:
            nxt = model(mx.array([[out[-1]]]), cache=cache)[0, -1]
    return np.array(logits), out


def _max_logit_diff(logits: np.ndarray, rec: dict) -> float:
    watch = np.abs(logits[:, REF["watch_ids"]] - np.array(rec["watch_logits"])).max()
    top = np.abs(logits[-1, rec["last_top_ids"]] - np.array(rec["last_top_logits"])).max()
    return float(max(watch, top))


@pytest.fixture(scope="session")
def f32_runs(f32_model):
    model, _ = f32_model
    return {name: _run(model, rec["ids"]) for name, rec in REF["prompts"].items()}


# --- SmolLM2 against the transformers reference ------------------------------------------------

@pytest.mark.parametrize("prompt", list(REF["prompts"]))
def test_tokenizer_matches_reference(f32_model, prompt):
    _, tok = f32_model
    rec = REF["prompts"][prompt]
    assert tok.encode(rec["text"]) == rec["ids"]
    assert tok.decode(rec["ids"]) == rec["text"]


def test_digits_split_like_llama_cpp(f32_model):
    # pre "smollm": llama.cpp (and SmolLM2's own tokenizer.json) isolate digits before the GPT-2
    # split, so "\n    1" is "\n    " + "1". transformers' GGUF tokenizer has no "smollm" entry
    # and splits "\n   " + " 1" instead: a known divergence on its side, recorded in the JSON.
    _, tok = f32_model
    div = REF["divergent"]
    expected = tok.convert_tokens_to_ids(["x", "Ġ=", "Ġ[", "ĊĠĠĠĠ", "1", ",", "ĊĠĠĠĠ", "2", "]"])
    assert tok.encode(div["text"]) == expected != div["transformers_ids"]


def test_chat_template_and_special_tokens(f32_model, dirs):
    _, tok = f32_model
    rendered = tok.apply_chat_template(REF["chat_messages"], add_generation_prompt=True, tokenize=False)
    assert rendered == REF["prompts"]["chat_bugfix"]["text"]
    assert tok.eos_token == REF["eos_token"] == "<|im_end|>"
    assert tok.eos_token_id == REF["eos_token_id"] and tok.eos_token_ids == {REF["eos_token_id"]}
    assert tok.bos_token == REF["bos_token"] and tok.pad_token == REF["pad_token"]
    cfg = json.loads((dirs["q"] / "config.json").read_text())
    assert cfg["eos_token_id"] == REF["eos_token_id"] and cfg["tie_word_embeddings"] is True
    assert cfg["rope_traditional"] is False and cfg["vocab_size"] == 49152
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]) == (9, 3, 30)


@pytest.mark.parametrize("prompt", list(REF["prompts"]))
def test_dequantized_logits_and_greedy_match_reference(f32_runs, prompt):
    rec = REF["prompts"][prompt]
    logits, greedy = f32_runs[prompt]
    assert _max_logit_diff(logits, rec) <= TOL_DEQUANT
    assert int(logits[-1].argmax()) == rec["last_top_ids"][0]
    assert greedy == rec["greedy"]


def test_quantized_logits_and_greedy_match_reference(dirs):
    model, tok = _load(dirs["q"])
    rec = REF["prompts"]["code"]
    logits, greedy = _run(model, rec["ids"])
    assert _max_logit_diff(logits, rec) <= TOL_QUANT
    # identical up to the first near-tie the quantization error could flip (all 24 when measured)
    margins = rec["greedy_margins"]
    n = next((i for i, m in enumerate(margins) if m < 2 * TOL_QUANT), len(margins)) + 1
    assert greedy[:n] == rec["greedy"][:n]


def test_quantized_dir_layout(dirs):
    cfg = json.loads((dirs["q"] / "config.json").read_text())
    # this file is Q4_1 with a Q8_0 token embedding: per-layer entry for the odd one out
    assert cfg["quantization"] == {"group_size": 32, "bits": 4,
                                   "model.embed_tokens": {"group_size": 32, "bits": 8}}
    assert "quantization" not in json.loads((dirs["f32"] / "config.json").read_text())
    q = mx.load(str(dirs["q"] / "model.safetensors"))
    f = mx.load(str(dirs["f32"] / "model.safetensors"))
    assert {k for k in q if not k.endswith((".scales", ".biases"))} == set(f)
    assert all(v.dtype == mx.float32 for v in f.values())
    # the quantized tensors (permuted Q/K included) dequantize to exactly the float import
    for name in ("model.embed_tokens", "model.layers.0.self_attn.q_proj", "model.layers.29.self_attn.k_proj",
                 "model.layers.7.mlp.down_proj"):
        bits = 8 if name == "model.embed_tokens" else 4
        w = mx.dequantize(q[f"{name}.weight"], q[f"{name}.scales"].astype(mx.float32),
                          q[f"{name}.biases"].astype(mx.float32), group_size=32, bits=bits)
        assert mx.array_equal(w, f[f"{name}.weight"]).item(), name
    names = {p.name for p in dirs["q"].iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not [p for p in dirs["q"].parent.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_read_gguf_metadata(smollm2_gguf):
    md = read_gguf_metadata(smollm2_gguf)
    assert md["general.architecture"] == "llama" and md["llama.block_count"] == 30
    assert md["tokenizer.ggml.pre"] == "smollm" and len(md["tokenizer.ggml.tokens"]) == 49152


# --- a tiny random Qwen2 GGUF written by the `gguf` package, against transformers ----------------

@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory) -> Path:
    import base64
    import gzip

    path = tmp_path_factory.mktemp("qwen2") / "tiny-qwen2.gguf"
    path.write_bytes(gzip.decompress(base64.b64decode(REF["tiny_qwen2"]["gguf_gzip_base64"])))
    return path


@pytest.mark.parametrize("dequantize,dtype", [(False, None), (True, None), (False, "float32")])
def test_tiny_qwen2_matches_transformers(tiny_qwen2, tmp_path, dequantize, dtype):
    # Q8_0 attention with float biases, Q4_0 MLP, Q8_0 untied output, float16 embedding.
    # Measured max abs logit diff (logits up to ~10): 2.7e-5 both quantized and dequantized.
    import mlx_lm

    ref = REF["tiny_qwen2"]
    out = import_gguf(tiny_qwen2, tmp_path / "out", dequantize=dequantize, dtype=dtype, progress=False)
    model, tok = mlx_lm.load(str(out))
    assert [tok.encode(t) for t in ref["texts"]] == ref["ids"]
    logits = np.array(model(mx.array([ref["input_ids"]]))[0].astype(mx.float32))
    assert np.abs(logits - np.array(ref["logits"])).max() <= 1e-3
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["tie_word_embeddings"] is False
    dtypes = {v.dtype for v in mx.load(str(out / "model.safetensors")).values()}
    # as stored: float32 norms/biases, float16 embedding and scales; otherwise all float32
    assert dtypes - {mx.uint32} == ({mx.float32, mx.float16} if dtype is None and not dequantize
                                    else {mx.float32})
    if not dequantize:
        layer = {"group_size": 32, "bits": 4}
        assert cfg["quantization"] == {"group_size": 32, "bits": 8,
                                       **{f"model.layers.{i}.mlp.{p}_proj": layer
                                          for i in range(2) for p in ("gate", "up", "down")}}


# --- name mapping and RoPE un-permutation (no model file needed) -------------------------------

def test_hf_tensor_name():
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("token_embd.scales") == "model.embed_tokens.scales"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    assert hf_tensor_name("output_norm.weight") == "model.norm.weight"
    assert hf_tensor_name("blk.12.attn_q.bias") == "model.layers.12.self_attn.q_proj.bias"
    assert hf_tensor_name("blk.0.attn_output.biases") == "model.layers.0.self_attn.o_proj.biases"
    assert hf_tensor_name("blk.3.ffn_gate.weight") == "model.layers.3.mlp.gate_proj.weight"
    assert hf_tensor_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert hf_tensor_name("blk.3.attn_norm.weight") == "model.layers.3.input_layernorm.weight"
    with pytest.raises(KeyError):
        hf_tensor_name("blk.0.ssm_conv1d.weight")


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Verbatim logic of LlamaModel.permute in llama.cpp's convert_hf_to_gguf.py."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_rope_rows():
    # one head, head_dim 4: HF rows [r0 r1 | r2 r3] (halves) are stored as pairs [r0 r2 r1 r3]
    stored = np.array([[0.0], [2.0], [1.0], [3.0]])
    assert unpermute_rope_rows(mx.array(stored), 1).tolist() == [[0.0], [1.0], [2.0], [3.0]]
    hf = np.arange(3 * 8 * 5, dtype=np.float32).reshape(24, 5)  # 3 heads, head_dim 8
    assert np.array_equal(np.array(unpermute_rope_rows(mx.array(_llama_cpp_permute(hf, 3)), 3)), hf)
    bias = np.arange(24, dtype=np.float32)  # 1-D (a bias) works too
    assert np.array_equal(np.array(unpermute_rope_rows(mx.array(_llama_cpp_permute(bias, 3)), 3)), bias)


# --- synthetic GGUFs written with mx.save_gguf --------------------------------------------------

def _byte_tokens() -> list[str]:
    from tokenizers.pre_tokenizers import ByteLevel

    return sorted(ByteLevel.alphabet())


def _tiny_gguf(path: Path, arch: str, *, pre: str = "qwen2", tied: bool = False, extra: dict | None = None,
               hf_weights: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """A 1-layer float model in GGUF naming; returns the HF-layout weights it stands for."""
    rng = np.random.default_rng(0)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = _byte_tokens() + ["Ġh", "12", "ĊĊ", "'s"] + specials
    dim, heads, kv, hd, ffn, V = 16, 2, 1, 8, 32, len(tokens)
    hf = {
        "model.embed_tokens.weight": rng.standard_normal((V, dim)),
        "model.norm.weight": 1 + 0.1 * rng.standard_normal(dim),
        "model.layers.0.input_layernorm.weight": 1 + 0.1 * rng.standard_normal(dim),
        "model.layers.0.post_attention_layernorm.weight": 1 + 0.1 * rng.standard_normal(dim),
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((heads * hd, dim)) * 0.3,
        "model.layers.0.self_attn.k_proj.weight": rng.standard_normal((kv * hd, dim)) * 0.3,
        "model.layers.0.self_attn.v_proj.weight": rng.standard_normal((kv * hd, dim)) * 0.3,
        "model.layers.0.self_attn.o_proj.weight": rng.standard_normal((dim, heads * hd)) * 0.3,
        "model.layers.0.mlp.gate_proj.weight": rng.standard_normal((ffn, dim)) * 0.3,
        "model.layers.0.mlp.up_proj.weight": rng.standard_normal((ffn, dim)) * 0.3,
        "model.layers.0.mlp.down_proj.weight": rng.standard_normal((dim, ffn)) * 0.3,
    }
    if arch == "qwen2":
        for p, n in (("q", heads), ("k", kv), ("v", kv)):
            hf[f"model.layers.0.self_attn.{p}_proj.bias"] = rng.standard_normal(n * hd)
    if not tied:
        hf["lm_head.weight"] = rng.standard_normal((V, dim))
    hf = {k: v.astype(np.float32) for k, v in hf.items()}
    gguf_names = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
                  "model.layers.0.input_layernorm": "blk.0.attn_norm",
                  "model.layers.0.post_attention_layernorm": "blk.0.ffn_norm"}
    gguf_names.update({f"model.layers.0.self_attn.{p}_proj": f"blk.0.attn_{g}"
                       for p, g in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output"))})
    gguf_names.update({f"model.layers.0.mlp.{p}_proj": f"blk.0.ffn_{p}" for p in ("gate", "up", "down")})
    tensors = {}
    for k, v in hf.items():
        stem, suffix = k.rsplit(".", 1)
        if arch == "llama" and stem.endswith(("q_proj", "k_proj")):  # what llama.cpp's converter does
            v = _llama_cpp_permute(v, heads if stem.endswith("q_proj") else kv)
        tensors[f"{gguf_names[stem]}.{suffix}"] = mx.array(v)
    u32 = lambda x: mx.array(x, dtype=mx.uint32)  # noqa: E731
    md = {
        "general.architecture": arch, f"{arch}.embedding_length": u32(dim), f"{arch}.block_count": u32(1),
        f"{arch}.attention.head_count": u32(heads), f"{arch}.attention.head_count_kv": u32(kv),
        f"{arch}.feed_forward_length": u32(ffn), f"{arch}.context_length": u32(128),
        f"{arch}.attention.layer_norm_rms_epsilon": mx.array(1e-6, dtype=mx.float32),
        f"{arch}.rope.freq_base": mx.array(10000.0, dtype=mx.float32),
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": ["Ġ h", "1 2", "Ċ Ċ", "' s"],
        "tokenizer.ggml.token_type": mx.array([1] * (V - 3) + [3] * 3, dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": u32(V - 2), "tokenizer.ggml.eos_token_id": u32(V - 1),
        "tokenizer.chat_template":
            "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}",
        **(extra or {}),
    }
    mx.save_gguf(str(path), tensors, {k: v for k, v in md.items() if v is not None})
    return hf


@pytest.mark.parametrize("arch,tied", [("qwen2", False), ("llama", True)])
def test_synthetic_import_maps_names_biases_and_rope_order(tmp_path, arch, tied):
    import mlx_lm
    from mlx.utils import tree_flatten

    hf = _tiny_gguf(tmp_path / "m.gguf", arch, tied=tied)
    out = import_gguf(tmp_path / "m.gguf", tmp_path / "out", progress=False)
    model, tok = mlx_lm.load(str(out))
    params = dict(tree_flatten(model.parameters()))
    assert set(params) == set(hf) - ({"lm_head.weight"} if tied else set())
    for k, v in params.items():  # Q/K back in HF order for llama; qwen2 (NeoX RoPE) untouched
        assert np.array_equal(np.array(v), hf[k]), k
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == arch and cfg["tie_word_embeddings"] is tied
    model(mx.array([[1, 2, 3]]))  # runs
    assert tok.encode("<|im_start|>hi<|im_end|>") == [len(hf["model.embed_tokens.weight"]) - 2,
                                                      tok.convert_tokens_to_ids("h"),
                                                      tok.convert_tokens_to_ids("i"), tok.eos_token_id]


@pytest.mark.parametrize("pre,expected", [
    ("qwen2", ["1", "2", "3", "Ġh", "'s", "ĊĊ"]),        # \p{N} alone: the "1 2" merge never applies
    ("smollm", ["1", "2", "3", "Ġh", "'s", "ĊĊ"]),       # digits isolated before the GPT-2 split
    ("llama-bpe", ["12", "3", "Ġh", "'s", "ĊĊ"]),        # \p{N}{1,3}: "123" stays together
])
def test_pre_tokenizers(tmp_path, pre, expected):
    from tokenizers import Tokenizer

    _tiny_gguf(tmp_path / "m.gguf", "qwen2", pre=pre)
    out = import_gguf(tmp_path / "m.gguf", tmp_path / "out", progress=False)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.encode("123 h's\n\n", add_special_tokens=False).tokens == expected


def test_errors(tmp_path):
    junk = tmp_path / "notes.gguf"
    junk.write_text("hello")
    with pytest.raises(GGUFError, match=r"notes\.gguf.*not a GGUF"):
        import_gguf(junk, tmp_path / "o1", progress=False)
    with pytest.raises(GGUFError, match=r"missing\.gguf.*no such file"):
        read_gguf_metadata(tmp_path / "missing.gguf")
    mx.save_gguf(str(tmp_path / "bert.gguf"), {"x.weight": mx.zeros(2)}, {"general.architecture": "bert"})
    with pytest.raises(GGUFError, match=r"bert\.gguf.*unsupported architecture 'bert'"):
        import_gguf(tmp_path / "bert.gguf", tmp_path / "o2", progress=False)
    _tiny_gguf(tmp_path / "nohead.gguf", "llama", extra={"llama.attention.head_count": None})
    with pytest.raises(GGUFError, match=r"nohead\.gguf.*missing metadata key 'llama.attention.head_count'"):
        import_gguf(tmp_path / "nohead.gguf", tmp_path / "o3", progress=False)
    _tiny_gguf(tmp_path / "pre.gguf", "qwen2", pre="mystery-pre")
    with pytest.raises(GGUFError, match=r"pre\.gguf.*tokenizer.ggml.pre 'mystery-pre'"):
        import_gguf(tmp_path / "pre.gguf", tmp_path / "o4", progress=False)
    _tiny_gguf(tmp_path / "spm.gguf", "llama", extra={"tokenizer.ggml.model": "llama"})
    with pytest.raises(GGUFError, match=r"spm\.gguf.*tokenizer.ggml.model 'llama'"):
        import_gguf(tmp_path / "spm.gguf", tmp_path / "o5", progress=False)
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # no output or temp dir left behind
    # an existing non-empty output directory is refused and left alone
    _tiny_gguf(tmp_path / "ok.gguf", "qwen2")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("x")
    with pytest.raises(GGUFError, match="already exists"):
        import_gguf(tmp_path / "ok.gguf", tmp_path / "taken", progress=False)
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["keep.txt"]
