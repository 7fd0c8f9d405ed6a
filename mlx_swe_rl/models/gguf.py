"""Import a llama.cpp GGUF checkpoint into a plain mlx-lm model directory.

The file is read here (header, metadata, tensor table; tensor data memory-mapped), not with
``mx.load``: MLX 0.32's GGUF reader decodes Q4_K wrongly without a word (max error 1.9 on weights
of mean magnitude 0.017) and cannot read Q5_0 at all, so a model imported through it can be word
salad. Each tensor is decoded one of three ways:

- float types (F32, F16) are viewed as they are;
- Q4_0, Q4_1 and Q8_0 stay quantized, repacked into MLX's affine format (group size 32, the same
  block size), which is exact: ``w = scale * q + bias`` holds block for block;
- every other type (the K-quants, Q5_x, the IQ types, BF16, ...) is dequantized with llama.cpp's
  own reference, the ``gguf`` package's ``gguf.quants.dequantize``.

Then a sample of every tensor's rows is decoded again by the reference and compared: a tensor
that disagrees refuses the import, naming the tensor, its type and the error. What a GGUF lacks
is the Hugging Face side: a ``config.json``, HF tensor names, the standard (non-interleaved) RoPE
row order, and a ``tokenizer.json``. This module builds those from the metadata, so
``mlx_lm.load(out)`` works like on any converted checkpoint:

    import_gguf(Path("SmolLM2-135M-Instruct.Q4_1.gguf"), Path("models/smollm2"))
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import mlx.core as mx
import numpy as np

from ..runfiles import staged_directory

__all__ = ["GGUFError", "import_gguf", "read_gguf_metadata", "read_gguf", "decode_tensor", "hf_tensor_name",
           "unpermute_rope_rows", "gguf_tokenizer_metadata", "write_tokenizer",
           "write_header_dir"]

GROUP_SIZE = 32  # the block size of the GGUF formats kept quantized (Q4_0, Q4_1, Q8_0), and MLX's group
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


# --- reading the file ----------------------------------------------------------------------------

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
_F32, _F16 = 0, 1
_REPACKED = {2: ("Q4_0", 4), 3: ("Q4_1", 4), 8: ("Q8_0", 8)}  # GGML type -> (name, MLX bits)


@dataclass(frozen=True)
class TensorInfo:
    """One entry of a GGUF tensor table: GGUF dims (innermost first), GGML type, data offset."""

    name: str
    dims: tuple[int, ...]
    type: int
    offset: int  # from the start of the file

    @property
    def shape(self) -> tuple[int, ...]:
        """The numpy/MLX shape: outermost first."""
        return tuple(reversed(self.dims))

    def type_name(self) -> str:
        from gguf import GGMLQuantizationType

        try:
            return GGMLQuantizationType(self.type).name
        except ValueError:
            return f"type {self.type}"

    def nbytes(self) -> int:
        block, size = _block(self.type)
        return int(np.prod(self.dims, dtype=np.int64)) // block * size


def _block(ggml_type: int) -> tuple[int, int]:
    """(elements per block, bytes per block) of a GGML type, from the reference's table."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise GGUFError(f"unknown GGML tensor type {ggml_type}") from None


@dataclass
class GGUFFile:
    """What `read_gguf` found: the metadata as plain Python values and the tensor table."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]

    def raw(self, info: TensorInfo) -> np.ndarray:
        """The tensor's bytes, memory-mapped, one row (the innermost dimension) per line."""
        rows = int(np.prod(info.shape[:-1], dtype=np.int64)) if len(info.shape) > 1 else 1
        data = np.memmap(self.path, dtype=np.uint8, mode="r", offset=info.offset, shape=(info.nbytes(),))
        return data.reshape(rows, -1)


def _read(f: BinaryIO, n: int, src: Path) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise GGUFError(f"{src}: truncated GGUF file (ends inside its header)")
    return data


def _string(f: BinaryIO, src: Path) -> str:
    (n,) = struct.unpack("<Q", _read(f, 8, src))
    return _read(f, n, src).decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int, src: Path) -> Any:
    if kind == _STRING:
        return _string(f, src)
    if kind == _ARRAY:
        item, count = struct.unpack("<IQ", _read(f, 12, src))
        if item == _STRING:
            return [_string(f, src) for _ in range(count)]
        if item in _NUMPY:
            dtype = np.dtype(_NUMPY[item])
            return np.frombuffer(_read(f, dtype.itemsize * count, src), dtype=dtype).tolist()
        return [_value(f, item, src) for _ in range(count)]  # arrays of arrays
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, _read(f, struct.calcsize(fmt), src))[0]
    raise GGUFError(f"{src}: unknown GGUF metadata value type {kind}")


def read_gguf(src: Path | str, tensors: bool = True, data: bool = True) -> GGUFFile:
    """Parse a GGUF file's header: its metadata (plain ints, floats, strings and lists) and,
    with `tensors`, its tensor table. Without `data` the file may end after its header (the
    first part of a split download holds it): nothing checks that the tensors' bytes are there."""
    src = Path(src)
    if not src.is_file():
        raise GGUFError(f"{src}: no such file")
    with open(src, "rb") as f:
        if f.read(4) != b"GGUF":
            raise GGUFError(f"{src}: not a GGUF file (bad magic bytes)")
        version, n_tensors, n_kv = struct.unpack("<IQQ", _read(f, 20, src))
        if version < 2:
            raise GGUFError(f"{src}: GGUF version {version} is too old (2 or later)")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = _string(f, src)
            (kind,) = struct.unpack("<I", _read(f, 4, src))
            metadata[key] = _value(f, kind, src)
        table: dict[str, TensorInfo] = {}
        if tensors:
            infos = []
            for _ in range(n_tensors):
                name = _string(f, src)
                (n_dims,) = struct.unpack("<I", _read(f, 4, src))
                dims = struct.unpack(f"<{n_dims}Q", _read(f, 8 * n_dims, src))
                kind, offset = struct.unpack("<IQ", _read(f, 12, src))
                infos.append((name, dims, kind, offset))
            align = int(metadata.get("general.alignment", 32))
            start = -(-f.tell() // align) * align
            size = src.stat().st_size
            for name, dims, kind, offset in infos:
                info = TensorInfo(name, tuple(int(d) for d in dims), kind, start + offset)
                if data and info.offset + info.nbytes() > size:
                    raise GGUFError(f"{src}: truncated GGUF file (tensor {name} runs past its end)")
                table[name] = info
    return GGUFFile(src, metadata, table)


def read_gguf_metadata(src: Path | str) -> dict[str, Any]:
    """Return the GGUF key/value metadata of ``src`` as plain Python values (ints, lists, str)."""
    return read_gguf(src, tensors=False).metadata


# --- decoding tensors --------------------------------------------------------------------------

def reference_dequantize(raw: np.ndarray, ggml_type: int) -> np.ndarray:
    """llama.cpp's own decoding of GGUF rows (`gguf.quants.dequantize`), as float32."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    try:
        return np.asarray(dequantize(np.ascontiguousarray(raw), GGMLQuantizationType(ggml_type)), dtype=np.float32)
    except NotImplementedError as e:
        raise GGUFError(f"the reference cannot decode GGML type {GGMLQuantizationType(ggml_type).name}: {e}") from e


def _pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned `bits`-bit values (rows, n) into MLX's packing: little-endian within uint32 words."""
    per_word = 32 // bits
    v = values.astype(np.uint32).reshape(values.shape[0], -1, per_word)
    shifts = (np.arange(per_word, dtype=np.uint32) * bits)
    return np.bitwise_or.reduce(v << shifts, axis=-1)


def _repack(raw: np.ndarray, ggml_type: int) -> dict[str, np.ndarray]:
    """Q4_0 / Q4_1 / Q8_0 rows as MLX affine-quantized (weight, scales, biases), exactly:
    Q4_0 is d * (q - 8), Q4_1 is d * q + m, Q8_0 is d * q with q signed (stored here as q + 128)."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, _block(ggml_type)[1])
    d = blocks[..., :2].copy().view(np.float16)[..., 0]
    if ggml_type == 8:  # Q8_0: fp16 d, 32 int8
        q = blocks[..., 2:].copy().view(np.int8).astype(np.int16) + 128
        scales, biases = d, (-128 * d.astype(np.float32)).astype(np.float16)
    else:
        data = blocks[..., 2:] if ggml_type == 2 else blocks[..., 4:]
        q = np.concatenate([data & 0x0F, data >> 4], axis=-1)  # elements 0-15 low nibbles, 16-31 high
        if ggml_type == 2:  # Q4_0: fp16 d, 16 bytes
            scales, biases = d, (-8 * d.astype(np.float32)).astype(np.float16)
        else:  # Q4_1: fp16 d, fp16 m, 16 bytes
            scales, biases = d, blocks[..., 2:4].copy().view(np.float16)[..., 0]
    bits = _REPACKED[ggml_type][1]
    return {"weight": _pack(q.reshape(rows, -1), bits), "scales": scales, "biases": biases}


def decode_tensor(file: GGUFFile, info: TensorInfo, keep_quantized: bool,
                  float_dtype: np.dtype = np.float16) -> dict[str, mx.array]:
    """One tensor as MLX arrays: {"weight"} (float) or {"weight", "scales", "biases"} (quantized,
    `keep_quantized` and a type MLX's affine format holds exactly). Types the reference decodes
    arrive as `float_dtype`; F32 and F16 tensors keep their own dtype."""
    raw = file.raw(info)
    shape = info.shape
    if info.type == _F32:
        arr = raw.view(np.float32).reshape(shape)
    elif info.type == _F16:
        arr = raw.view(np.float16).reshape(shape)
    elif keep_quantized and info.type in _REPACKED:
        parts = _repack(raw, info.type)
        lead = shape[:-1]
        return {k: mx.array(v.reshape(*lead, -1)) for k, v in parts.items()}
    else:
        arr = reference_dequantize(raw, info.type).reshape(shape).astype(float_dtype, copy=False)
    return {"weight": mx.array(arr)}


def _as_float(parts: dict[str, mx.array]) -> mx.array:
    if "scales" not in parts:
        return parts["weight"].astype(mx.float32)
    bits = parts["weight"].shape[-1] * 32 // (parts["scales"].shape[-1] * GROUP_SIZE)
    return mx.dequantize(parts["weight"], parts["scales"].astype(mx.float32), parts["biases"].astype(mx.float32),
                         group_size=GROUP_SIZE, bits=bits)


CHECK_ROWS = 8  # rows of every tensor decoded twice: by the import and by the reference
CHECK_TOLERANCE = 2e-3  # of the sample's largest magnitude: float16 storage rounds at 4.9e-4


def check_tensor(file: GGUFFile, info: TensorInfo, parts: dict[str, mx.array]) -> None:
    """Compare a sample of the decoded tensor's rows with the reference's decoding of the same
    rows; raise GGUFError (one line: tensor, type, error) when they disagree."""
    raw = file.raw(info)
    rows = raw.shape[0]
    idx = np.unique(np.linspace(0, rows - 1, min(rows, CHECK_ROWS)).astype(np.int64))
    expected = reference_dequantize(raw[idx], info.type)
    flat = {k: v.reshape(rows, -1) for k, v in parts.items()}
    got = np.array(_as_float({k: v[mx.array(idx)] for k, v in flat.items()}))
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    error = float(np.abs(got - expected).max()) if expected.size else 0.0
    if got.shape != expected.shape or not np.isfinite(error) or error > CHECK_TOLERANCE * scale + 1e-7:
        raise GGUFError(f"{file.path}: tensor {info.name} ({info.type_name()}) decodes wrongly: max error "
                        f"{error:.3g} against llama.cpp's reference, on values up to {scale:.3g}; import refused")


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


def _write_json(path: Path, content: Any) -> None:
    path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_tokenizer(md: dict[str, Any], src: Path, directory: Path, built: tuple[Any, dict[str, Any]] | None = None) -> None:
    """Write the tokenizer files of GGUF metadata `md` into `directory`: tokenizer.json,
    tokenizer_config.json (with the chat template), special_tokens_map.json and the
    generation_config.json that names the stop tokens. `built` is `_build_tokenizer`'s result
    when the caller already has it."""
    tokenizer, tok_config = built or _build_tokenizer(md, src)
    tokenizer.save(str(directory / "tokenizer.json"))
    gen = {name: int(tid) for name, key in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding"))
           if (tid := md.get(f"tokenizer.ggml.{key}_token_id")) is not None}
    if (eot := md.get("tokenizer.ggml.eot_token_id")) is not None and eot != gen.get("eos_token_id"):
        gen["eos_token_id"] = [gen["eos_token_id"], int(eot)] if "eos_token_id" in gen else int(eot)
    _write_json(directory / "tokenizer_config.json", tok_config)
    _write_json(directory / "special_tokens_map.json", {k: v for k, v in tok_config.items() if k in _SPECIAL_KEYS})
    _write_json(directory / "generation_config.json", gen)


def _model_config(file: GGUFFile) -> tuple[str, dict[str, Any]]:
    """The architecture and mlx-lm config.json of a parsed GGUF."""
    md, infos, src = file.metadata, file.tensors, file.path
    arch = _meta(md, "general.architecture", src)
    if arch not in _ARCH_CLASSES:
        raise GGUFError(f"{src}: unsupported architecture {arch!r} (supported: {', '.join(_ARCH_CLASSES)})")
    if "token_embd.weight" not in infos:
        raise GGUFError(f"{src}: no token_embd.weight tensor")
    tied = "output.weight" not in infos
    # embedding rows, not len(tokens): the model's shape is what must match (padded vocabularies)
    return arch, _build_config(md, arch, src, tied, infos["token_embd.weight"].shape[0])


def write_header_dir(src: Path, out: Path) -> Path:
    """A model directory without weights: the config.json and tokenizer files of GGUF `src`,
    which may be only the file's first part. Enough for tokenizing, chat templates and the memory
    preflight (which reads shapes), without the weights' gigabytes."""
    file = read_gguf(src, data=False)
    _, config = _model_config(file)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", config)
    write_tokenizer(file.metadata, Path(src), out)
    return out


def import_gguf(src: Path, out: Path, *, dequantize: bool = False, dtype: str | None = None,
                progress: bool = True) -> Path:
    """Convert the GGUF file ``src`` into an mlx-lm model directory ``out`` and return ``out``.

    Supports ``llama`` and ``qwen2`` architectures with a byte-level BPE ("gpt2") tokenizer.
    Q4_0/Q4_1/Q8_0 tensors stay quantized (``config.json`` gets mlx-lm's ``quantization``
    entry) unless ``dequantize`` is true; other GGUF types are dequantized by llama.cpp's
    reference into float16 (float32 when dequantizing). Every tensor is checked against the
    reference on a sample of its rows before anything is written (`check_tensor`).
    ``dtype`` ("float32", "float16", "bfloat16") casts every float tensor, including the
    scales/biases of quantized ones; when dequantizing it defaults to "float32".
    The directory is built next to ``out`` and renamed into place, so ``out`` is never
    half-written; an existing non-empty ``out`` is an error. Raises GGUFError for files
    this importer cannot handle.
    """
    src, out = Path(src), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GGUFError(f"{out}: output path already exists and is not an empty directory")
    file = read_gguf(src)
    md, infos = file.metadata, file.tensors
    arch, config = _model_config(file)
    if dequantize and dtype is None:
        dtype = "float32"
    cast = getattr(mx, dtype, None) if dtype else None
    if dtype and not isinstance(cast, mx.Dtype):
        raise ValueError(f"unknown dtype {dtype!r} (use float32, float16 or bfloat16)")
    tokenizer = _build_tokenizer(md, src)  # (tokenizers.Tokenizer, tokenizer_config.json)
    unknown = [k for k in infos if not k.endswith((".weight", ".bias"))]
    if unknown or "rope_freqs.weight" in infos:  # rope_freqs = Llama-3.1 RoPE factors: no HF config form
        raise GGUFError(f"{src}: unsupported tensors {(unknown or ['rope_freqs.weight'])[:3]}")
    float_dtype = np.float32 if dequantize or dtype == "float32" else np.float16
    out_w: dict[str, mx.array] = {}
    quant: dict[str, Any] = {}
    names: Any = sorted(infos)
    if progress:
        from tqdm import tqdm
        names = tqdm(names, desc=f"importing {src.name}", unit="tensor")
    for name in names:
        info = infos[name]
        try:
            hf = hf_tensor_name(name)
        except KeyError:
            raise GGUFError(f"{src}: unknown tensor {name!r} for architecture {arch!r}") from None
        hf_stem = hf.rsplit(".", 1)[0]
        parts = decode_tensor(file, info, keep_quantized=not dequantize, float_dtype=float_dtype)
        check_tensor(file, info, parts)
        if name.endswith(".bias"):
            parts = {"bias": parts["weight"]}
        bits = None
        if "scales" in parts:  # packed uint32 words per row * 32 bits / inputs per row
            bits = parts["weight"].shape[-1] * 32 // (parts["scales"].shape[-1] * GROUP_SIZE)
        stem = name.rsplit(".", 1)[0]
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

    try:
        with staged_directory(out) as staging:
            mx.save_safetensors(str(staging / "model.safetensors"), out_w, metadata={"format": "mlx"})
            _write_json(staging / "config.json", config)
            write_tokenizer(md, src, staging, tokenizer)
    except OSError as e:
        if out.is_dir() and any(out.iterdir()):  # another process imported to `out` meanwhile
            raise GGUFError(f"{out}: output directory was created by another process meanwhile") from e
        raise
    return out
