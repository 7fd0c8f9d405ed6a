"""Import a llama.cpp GGUF checkpoint into a plain mlx-lm model directory.

MLX reads GGUF natively (``mx.load(path, return_metadata=True)``): Q4_0/Q4_1/Q8_0 tensors arrive
as MLX affine-quantized triples (``name.weight``/``.scales``/``.biases``, group size 32) and other
types as float arrays. What a GGUF lacks is the Hugging Face side: a ``config.json``, HF tensor
names, the standard (non-interleaved) RoPE row order, and a ``tokenizer.json``. This module builds
those from the metadata, so ``mlx_lm.load(out)`` works like on any converted checkpoint:

    import_gguf(Path("SmolLM2-135M-Instruct.Q4_1.gguf"), Path("models/smollm2"))
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import mlx.core as mx

__all__ = ["GGUFError", "import_gguf", "read_gguf_metadata", "hf_tensor_name", "unpermute_rope_rows",
           "gguf_tokenizer_metadata"]

GROUP_SIZE = 32  # every GGUF block format MLX keeps quantized (Q4_0, Q4_1, Q8_0) uses 32-wide blocks
_ARCH_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}

# GGUF per-layer tensor stems -> HF/mlx-lm module paths below `model.layers.N.`
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# Pre-tokenizer split regexes, copied from llama.cpp's llama-vocab.cpp / the models' own
# tokenizer.json files. "smollm" (and "gpt-2") use GPT-2's regex, which ByteLevel(use_regex=True)
# applies itself; SmolLM additionally isolates every digit first.
_GPT2_LIKE = {"gpt-2", "smollm", "starcoder"}
_SPLIT_REGEX = {
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
_SPLIT_REGEX["deepseek-r1-qwen"] = _SPLIT_REGEX["qwen2"]
# tokenizer_config.json name -> GGUF `tokenizer.ggml.{key}_token_id`
_SPECIAL_KEYS = {"bos_token": "bos", "eos_token": "eos", "pad_token": "padding", "unk_token": "unknown"}


class GGUFError(ValueError):
    """A GGUF file this importer cannot handle (not GGUF, unsupported model, missing metadata)."""


def _plain(value: Any) -> Any:
    """MLX hands scalar metadata back as 0-d arrays and numeric lists as arrays: make them Python."""
    if isinstance(value, mx.array):
        return value.item() if value.ndim == 0 else value.tolist()
    return value


def _load(src: Path, tensors: bool) -> tuple[dict[str, mx.array], dict[str, Any]]:
    if not src.is_file():
        raise GGUFError(f"{src}: no such file")
    with open(src, "rb") as f:
        if f.read(4) != b"GGUF":  # check the magic ourselves: mx.load's error for junk is cryptic
            raise GGUFError(f"{src}: not a GGUF file (bad magic bytes)")
    try:
        weights, metadata = mx.load(str(src), return_metadata=True)
    except Exception as e:  # truncated file, tensor type MLX cannot read, ...
        raise GGUFError(f"{src}: MLX could not read this GGUF file: {e}") from e
    return (weights if tensors else {}), {k: _plain(v) for k, v in metadata.items()}


def read_gguf_metadata(src: Path | str) -> dict[str, Any]:
    """Return the GGUF key/value metadata of ``src`` as plain Python values (ints, lists, str)."""
    return _load(Path(src), tensors=False)[1]


def hf_tensor_name(gguf_name: str) -> str:
    """Map a GGUF tensor name to its mlx-lm/HF name, keeping the suffix.

    ``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; the suffix may be
    ``weight``, ``bias`` (a Linear bias, e.g. Qwen2's q/k/v) or ``scales``/``biases`` (MLX's
    quantization parameters). Raises KeyError for names it does not know.
    """
    stem, suffix = gguf_name.rsplit(".", 1)
    if m := re.fullmatch(r"blk\.(\d+)\.(\w+)", stem):
        return f"model.layers.{m[1]}.{_LAYER_NAMES[m[2]]}.{suffix}"
    return f"{_GLOBAL_NAMES[stem]}.{suffix}"


def unpermute_rope_rows(w: mx.array, n_head: int) -> mx.array:
    """Undo llama.cpp's ``permute`` of LLaMA Q/K rows (convert_hf_to_gguf.py).

    llama.cpp rotates adjacent pairs (GPT-J style), so its converter reorders each head's rows
    from HF's halves layout (n_head, 2, d/2) into pairs (n_head, d/2, 2). Applying the inverse
    gives HF order, which mlx-lm's llama uses with ``rope_traditional: false``. Works on any
    array whose first axis is the output rows: weights, biases, and the packed weight, scales
    and biases of a quantized tensor alike (quantization groups run along the input axis).
    """
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _meta(md: dict[str, Any], key: str, src: Path, default: Any = ...) -> Any:
    if key in md:
        return md[key]
    if default is ...:
        raise GGUFError(f"{src}: missing metadata key {key!r}")
    return default


def _build_config(md: dict[str, Any], arch: str, src: Path, tied: bool, vocab: int) -> dict[str, Any]:
    p = f"{arch}."
    n_head = int(_meta(md, p + "attention.head_count", src))
    n_kv = _meta(md, p + "attention.head_count_kv", src, n_head)
    if not isinstance(n_kv, int):  # per-layer KV head counts exist in some GGUFs; not in mlx-lm's llama
        raise GGUFError(f"{src}: per-layer {p}attention.head_count_kv is not supported")
    hidden = int(_meta(md, p + "embedding_length", src))
    cfg: dict[str, Any] = {
        "architectures": [_ARCH_CLASSES[arch]],
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": int(_meta(md, p + "block_count", src)),
        "intermediate_size": int(_meta(md, p + "feed_forward_length", src)),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "rms_norm_eps": float(_meta(md, p + "attention.layer_norm_rms_epsilon", src)),
        "rope_theta": float(_meta(md, p + "rope.freq_base", src, 10000.0)),
        "max_position_embeddings": int(_meta(md, p + "context_length", src)),
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "rope_traditional": False,  # Q/K rows are un-permuted to HF order below
    }
    if (head_dim := md.get(p + "attention.key_length")) and head_dim != hidden // n_head:
        cfg["head_dim"] = int(head_dim)
    scaling = md.get(p + "rope.scaling.type")
    if scaling == "linear":
        cfg["rope_scaling"] = {"type": "linear", "factor": float(md[p + "rope.scaling.factor"])}
    elif scaling not in (None, "none"):
        raise GGUFError(f"{src}: unsupported RoPE scaling {scaling!r}")
    for name in ("bos", "eos", "pad"):
        if (tid := md.get(f"tokenizer.ggml.{'padding' if name == 'pad' else name}_token_id")) is not None:
            cfg[f"{name}_token_id"] = int(tid)
    return cfg


def _build_tokenizer(md: dict[str, Any], src: Path) -> tuple[Any, dict[str, Any]]:
    """Byte-level BPE ``tokenizers.Tokenizer`` and tokenizer_config.json content from the metadata."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers as pt
    from tokenizers import processors

    kind = _meta(md, "tokenizer.ggml.model", src)
    if kind != "gpt2":  # "llama" = SentencePiece; would need its own normalizer/decoder stack
        raise GGUFError(f"{src}: unsupported tokenizer.ggml.model {kind!r} (only 'gpt2' byte-level BPE)")
    tokens: list[str] = _meta(md, "tokenizer.ggml.tokens", src)
    merges = [tuple(m.split(" ", 1)) for m in _meta(md, "tokenizer.ggml.merges", src)]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))

    pre = md.get("tokenizer.ggml.pre", "gpt-2")
    if pre in _GPT2_LIKE:
        tok.pre_tokenizer = pt.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre != "gpt-2":  # SmolLM/StarCoder isolate every digit first (llama.cpp's "\p{N}" split)
            tok.pre_tokenizer = pt.Sequence([pt.Digits(individual_digits=True), tok.pre_tokenizer])
    elif pre in _SPLIT_REGEX:
        tok.pre_tokenizer = pt.Sequence([
            pt.Split(Regex(_SPLIT_REGEX[pre]), behavior="isolated"),
            pt.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        if pre != "llama-bpe":
            tok.normalizer = normalizers.NFC()  # Qwen2's own tokenizer.json normalizes to NFC
    else:
        raise GGUFError(f"{src}: unsupported tokenizer.ggml.pre {pre!r} (supported: "
                        f"{', '.join(sorted(_GPT2_LIKE | set(_SPLIT_REGEX)))})")
    tok.decoder = decoders.ByteLevel()

    # Control tokens (type 3) become special added tokens and user-defined ones (type 4) plain
    # added tokens, so text like "<|im_start|>" is matched whole instead of being BPE-split.
    types = md.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types) if ty == 4])

    def tok_of(key: str) -> str | None:
        tid = md.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[tid] if tid is not None and 0 <= tid < len(tokens) else None

    bos, add_bos = tok_of("bos"), bool(md.get("tokenizer.ggml.add_bos_token", False))
    if add_bos and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokens.index(bos))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": bool(md.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(md.get(f"{md['general.architecture']}.context_length", 2048)),
    }
    for name, key in _SPECIAL_KEYS.items():
        if (t := tok_of(key)) is not None:
            config[name] = t
    if "tokenizer.chat_template" in md:
        config["chat_template"] = md["tokenizer.chat_template"]
    return tok, config


def _pre_tokenizer_name(parts: list[dict[str, Any]], where: Path) -> str:
    """llama.cpp's name for a byte-level BPE pre-tokenizer (tokenizer.json's `pre_tokenizer`,
    as a list of steps); the inverse of the choice in `_build_tokenizer`."""
    kinds = [p.get("type") for p in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True):
        regex = (parts[0].get("pattern") or {}).get("Regex")
        for name, known in _SPLIT_REGEX.items():  # the first name of a regex is its canonical one
            if regex == known:
                return name
    raise GGUFError(f"{where}: byte-level BPE pre-tokenizer {kinds} has no llama.cpp name here "
                    f"(known: {', '.join(sorted(_GPT2_LIKE | set(_SPLIT_REGEX)))})")


def gguf_tokenizer_metadata(model_dir: Path) -> dict[str, Any] | None:
    """GGUF tokenizer metadata for the byte-level BPE tokenizer of an mlx-lm model directory,
    the inverse of what `import_gguf` reads: "gpt2" tokens, merges, token types, llama.cpp's
    pre-tokenizer name, special token ids and the chat template (MLX arrays where GGUF wants
    numbers). None for tokenizers that are not byte-level BPE (SentencePiece vocabularies).

    mlx-lm's GGUF writer labels every vocabulary SentencePiece ("llama") and writes no merges,
    so a byte-level BPE model (SmolLM2, Llama 3) would tokenize differently when read back.
    """
    path = Path(model_dir) / "tokenizer.json"
    data = json.loads(path.read_text())
    model, pre = data.get("model") or {}, data.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if model.get("type") != "BPE" or "ByteLevel" not in [p.get("type") for p in parts]:
        return None
    name = _pre_tokenizer_name(parts, path)
    ids = dict(model.get("vocab") or {})
    added = {a["content"]: a for a in data.get("added_tokens") or []}
    ids.update({content: a["id"] for content, a in added.items()})
    tokens = [f"[PAD{i}]" for i in range(max(ids.values()) + 1)]  # holes: unused ids
    types = [5] * len(tokens)
    for token, i in ids.items():
        tokens[i] = token
        types[i] = (3 if added[token].get("special") else 4) if token in added else 1
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    config_path = Path(model_dir) / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    template = config.get("chat_template")
    if template is None and (Path(model_dir) / "chat_template.jinja").is_file():
        template = (Path(model_dir) / "chat_template.jinja").read_text()
    md: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": name, "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32), "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.add_bos_token": mx.array(bool(config.get("add_bos_token", False))),
    }
    for name_, key in _SPECIAL_KEYS.items():
        token = config.get(name_)
        token = token.get("content") if isinstance(token, dict) else token
        if token in ids:
            md[f"tokenizer.ggml.{key}_token_id"] = mx.array(ids[token], dtype=mx.uint32)
    if isinstance(template, str):
        md["tokenizer.chat_template"] = template
    return md


def import_gguf(src: Path, out: Path, *, dequantize: bool = False, dtype: str | None = None,
                progress: bool = True) -> Path:
    """Convert the GGUF file ``src`` into an mlx-lm model directory ``out`` and return ``out``.

    Supports ``llama`` and ``qwen2`` architectures with a byte-level BPE ("gpt2") tokenizer.
    Q4_0/Q4_1/Q8_0 tensors stay quantized (``config.json`` gets mlx-lm's ``quantization``
    entry) unless ``dequantize`` is true; other GGUF types arrive from MLX as floats.
    ``dtype`` ("float32", "float16", "bfloat16") casts every float tensor, including the
    scales/biases of quantized ones; when dequantizing it defaults to "float32".
    The directory is built next to ``out`` and renamed into place, so ``out`` is never
    half-written; an existing non-empty ``out`` is an error. Raises GGUFError for files
    this importer cannot handle.
    """
    src, out = Path(src), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GGUFError(f"{out}: output path already exists and is not an empty directory")
    weights, md = _load(src, tensors=True)
    arch = _meta(md, "general.architecture", src)
    if arch not in _ARCH_CLASSES:
        raise GGUFError(f"{src}: unsupported architecture {arch!r} (supported: {', '.join(_ARCH_CLASSES)})")
    if dequantize and dtype is None:
        dtype = "float32"
    cast = getattr(mx, dtype, None) if dtype else None
    if dtype and not isinstance(cast, mx.Dtype):
        raise ValueError(f"unknown dtype {dtype!r} (use float32, float16 or bfloat16)")
    if "token_embd.weight" not in weights:
        raise GGUFError(f"{src}: no token_embd.weight tensor")
    tied = "output.weight" not in weights
    # embedding rows, not len(tokens): the model's shape is what must match (padded vocabularies)
    config = _build_config(md, arch, src, tied, weights["token_embd.weight"].shape[0])
    tokenizer, tok_config = _build_tokenizer(md, src)

    names = sorted(k for k in weights if k.endswith((".weight", ".bias")))
    unknown = [k for k in weights if not k.endswith((".weight", ".bias", ".scales", ".biases"))]
    if unknown or "rope_freqs.weight" in weights:  # rope_freqs = Llama-3.1 RoPE factors: no HF config form
        raise GGUFError(f"{src}: unsupported tensors {(unknown or ['rope_freqs.weight'])[:3]}")
    out_w: dict[str, mx.array] = {}
    quant: dict[str, Any] = {}
    if progress:
        from tqdm import tqdm
        names = tqdm(names, desc=f"importing {src.name}", unit="tensor")
    for name in names:
        stem = name.rsplit(".", 1)[0]
        try:
            hf = hf_tensor_name(name)
        except KeyError:
            raise GGUFError(f"{src}: unknown tensor {name!r} for architecture {arch!r}") from None
        hf_stem = hf.rsplit(".", 1)[0]
        if name.endswith(".bias"):
            parts = {"bias": weights[name]}
        else:  # a quantized weight comes with its .scales/.biases siblings
            parts = {s: weights[f"{stem}.{s}"] for s in ("weight", "scales", "biases")
                     if f"{stem}.{s}" in weights}
        bits = None
        if "scales" in parts:  # packed uint32 words per row * 32 bits / inputs per row
            bits = parts["weight"].shape[-1] * 32 // (parts["scales"].shape[-1] * GROUP_SIZE)
        if bits and dequantize:
            # mx.dequantize computes in the scales' dtype: upcast the float16 scales first, or
            # every weight picks up float16 rounding (measured: 0.08 max logit error vs 1e-4).
            f32 = {k: parts[k].astype(mx.float32) for k in ("scales", "biases")}
            parts = {"weight": mx.dequantize(parts["weight"], f32["scales"], f32["biases"],
                                             group_size=GROUP_SIZE, bits=bits)}
            bits = None
        if arch == "llama" and re.search(r"\.attn_[qk]$", stem):
            heads = config["num_attention_heads"] if stem.endswith("q") else config["num_key_value_heads"]
            parts = {k: unpermute_rope_rows(v, heads) for k, v in parts.items()}
        for suffix, arr in parts.items():
            if cast is not None and mx.issubdtype(arr.dtype, mx.floating):
                arr = arr.astype(cast)
            out_w[f"{hf_stem}.{suffix}"] = arr
        if bits:
            quant[hf_stem] = {"group_size": GROUP_SIZE, "bits": bits}
        mx.eval(list(parts.values()))  # materialize per tensor, keeping peak memory low
    if quant:
        # Top level: the most common bit width; layers that differ get a per-layer entry, the form
        # mlx-lm's class_predicate reads. Float layers need none: they have no `.scales` tensor.
        common = max({q["bits"] for q in quant.values()}, key=[q["bits"] for q in quant.values()].count)
        config["quantization"] = {"group_size": GROUP_SIZE, "bits": common,
                                  **{k: q for k, q in quant.items() if q["bits"] != common}}
        config["quantization_config"] = config["quantization"]
    if cast is not None:
        config["torch_dtype"] = dtype

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        mx.save_safetensors(str(tmp / "model.safetensors"), out_w, metadata={"format": "mlx"})
        tokenizer.save(str(tmp / "tokenizer.json"))
        special = {k: v for k, v in tok_config.items() if k in _SPECIAL_KEYS}
        gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
        if (eot := md.get("tokenizer.ggml.eot_token_id")) is not None and eot != gen.get("eos_token_id"):
            gen["eos_token_id"] = [gen["eos_token_id"], int(eot)] if "eos_token_id" in gen else int(eot)
        for fname, content in (("config.json", config), ("tokenizer_config.json", tok_config),
                               ("special_tokens_map.json", special), ("generation_config.json", gen)):
            text = json.dumps(content, indent=2, ensure_ascii=False) + "\n"
            (tmp / fname).write_text(text, encoding="utf-8")
        try:
            os.replace(tmp, out)  # atomic; rename(2) replaces an empty directory, not a full one
        except OSError as e:
            if out.is_dir() and any(out.iterdir()):  # another process imported to `out` meanwhile
                raise GGUFError(f"{out}: output directory was created by another process meanwhile") from e
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
