"""GGUF tensor decoding for every type llama.cpp's reference can decode, against that reference.

Files are written with the `gguf` package (llama.cpp's own writer) from random blocks, so every
bit pattern a block can hold is exercised, not only what a quantizer would produce. MLX 0.32's
own reader (`mx.load`) fails this for Q4_K (wrong values) and Q5_0 (cannot read the file).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from mlx_swe_rl.models import gguf as importer  # noqa: E402
from mlx_swe_rl.models.gguf import GGUFError, decode_tensor, import_gguf, read_gguf  # noqa: E402

UNDECODABLE = {T.Q8_1, T.Q8_K, T.I8, T.I16, T.I32, T.I64, T.F64, T.Q1_0}  # the reference has no decoder
TYPES = [t for t in T if t not in UNDECODABLE]


def random_rows(qtype: T, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Raw GGUF rows of random blocks whose values are finite and moderate: a block whose random
    scale fields decode to inf/nan or huge values is redrawn with every byte below 0x3C, which
    makes each float16 field in it a finite number under 1."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    with np.errstate(all="ignore"):
        values = dequantize(raw.copy(), qtype).reshape(raw.shape[0], -1)
        bad = ~np.isfinite(values).all(axis=1) | (np.abs(values).max(axis=1) > 1e4)
        raw[bad] = rng.integers(0, 0x3C, size=(int(bad.sum()), size), dtype=np.uint8)
        assert np.isfinite(dequantize(raw.copy(), qtype)).all()
    return raw.reshape(rows, -1)


def write_tensors(path: Path, tensors: dict[str, tuple[T, np.ndarray]], arch: str = "test",
                  metadata: dict | None = None, arrays: dict | None = None) -> None:
    """A GGUF of raw tensors; `metadata` maps keys to (value, GGUFValueType[, item type]),
    `arrays` keys to lists whose item type the writer infers."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in (metadata or {}).items():
        writer.add_key_value(key, *value)
    for key, values in (arrays or {}).items():
        writer.add_array(key, values)
    for name, (qtype, raw) in tensors.items():
        writer.add_tensor(name, raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def every_type(tmp_path_factory) -> tuple[Path, dict[str, tuple[T, np.ndarray]]]:
    tensors = {}
    for i, qtype in enumerate(TYPES):
        if qtype == T.F32:
            raw = np.random.default_rng(i).standard_normal((3, 512)).astype(np.float32)
        elif qtype == T.F16:
            raw = np.random.default_rng(i).standard_normal((3, 512)).astype(np.float16)
        else:
            raw = random_rows(qtype, 3, 512, seed=i)
        tensors[f"t.{qtype.name.lower()}"] = (qtype, raw)
    path = tmp_path_factory.mktemp("types") / "types.gguf"
    write_tensors(path, tensors)
    return path, tensors


def _reference(qtype: T, raw: np.ndarray) -> np.ndarray:
    return raw.astype(np.float32) if qtype in (T.F32, T.F16) else dequantize(raw, qtype)


@pytest.mark.parametrize("keep_quantized", [True, False])
def test_every_type_decodes_like_the_reference(every_type, keep_quantized):
    path, tensors = every_type
    file = read_gguf(path)
    assert set(file.tensors) == set(tensors)
    for name, (qtype, raw) in tensors.items():
        info = file.tensors[name]
        assert info.type == qtype and info.shape == (3, 512), name
        parts = decode_tensor(file, info, keep_quantized=keep_quantized, float_dtype=np.float32)
        expected = _reference(qtype, raw)
        if "scales" in parts:  # Q4_0 / Q4_1 / Q8_0 kept in MLX's affine format
            assert qtype in (T.Q4_0, T.Q4_1, T.Q8_0) and keep_quantized
            bits = {T.Q8_0: 8}.get(qtype, 4)
            got = mx.dequantize(parts["weight"], parts["scales"].astype(mx.float32),
                                parts["biases"].astype(mx.float32), group_size=32, bits=bits)
        else:
            got = parts["weight"].astype(mx.float32)
        err = np.abs(np.array(got) - expected).max()
        assert err <= 1e-6 * max(1.0, np.abs(expected).max()), f"{name}: max error {err}"
        importer.check_tensor(file, info, parts)  # the import's own check agrees


def test_metadata_reads_from_a_file_cut_after_its_header(every_type, tmp_path):
    path, _ = every_type
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 4])  # tensor data missing, as in the first part of a split file
    assert importer.read_gguf_metadata(cut)["general.architecture"] == "test"
    with pytest.raises(GGUFError, match="truncated"):
        read_gguf(cut)


# --- a whole model whose tensors are K-quants, Q5_x and IQ types ---------------------------------

def _tiny_qwen2(path: Path, types: dict[str, T]) -> dict[str, np.ndarray]:
    """A 2-layer Qwen2 GGUF (dims multiples of 256, so every block format fits) with the given
    type per tensor stem; returns the reference's float weights by GGUF name."""
    from tokenizers.pre_tokenizers import ByteLevel

    tokens = sorted(ByteLevel.alphabet()) + ["Ġh", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    V, dim, heads, kv, ffn = len(tokens), 256, 4, 2, 512
    shapes = {"token_embd": (V, dim), "output": (V, dim), "output_norm": (dim,)}
    for i in range(2):
        shapes.update({f"blk.{i}.attn_q": (dim, dim), f"blk.{i}.attn_k": (kv * 64, dim),
                       f"blk.{i}.attn_v": (kv * 64, dim), f"blk.{i}.attn_output": (dim, dim),
                       f"blk.{i}.ffn_gate": (ffn, dim), f"blk.{i}.ffn_up": (ffn, dim),
                       f"blk.{i}.ffn_down": (dim, ffn), f"blk.{i}.attn_norm": (dim,), f"blk.{i}.ffn_norm": (dim,)})
    tensors, reference = {}, {}
    rng = np.random.default_rng(1)
    for n, (stem, shape) in enumerate(shapes.items()):
        qtype = types.get(stem, T.F32)
        if qtype == T.F32:
            raw = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            raw = random_rows(qtype, shape[0], shape[1], seed=100 + n)
        tensors[f"{stem}.weight"] = (qtype, raw)
        reference[f"{stem}.weight"] = _reference(qtype, raw).reshape(shape)
    for i in range(2):
        for p, rows in (("q", dim), ("k", kv * 64), ("v", kv * 64)):
            bias = (0.1 * rng.standard_normal(rows)).astype(np.float32)
            tensors[f"blk.{i}.attn_{p}.bias"] = (T.F32, bias)
            reference[f"blk.{i}.attn_{p}.bias"] = bias
    S, U32, F32, I32 = (gguf.GGUFValueType.STRING, gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32,
                        gguf.GGUFValueType.INT32)
    md = {"qwen2.embedding_length": (dim, U32), "qwen2.block_count": (2, U32),
          "qwen2.attention.head_count": (heads, U32), "qwen2.attention.head_count_kv": (kv, U32),
          "qwen2.feed_forward_length": (ffn, U32), "qwen2.context_length": (256, U32),
          "qwen2.attention.layer_norm_rms_epsilon": (1e-6, F32), "qwen2.rope.freq_base": (1e6, F32),
          "tokenizer.ggml.model": ("gpt2", S), "tokenizer.ggml.pre": ("qwen2", S),
          "tokenizer.ggml.eos_token_id": (V - 1, U32),
          "tokenizer.ggml.token_type": ([1] * (V - 3) + [3] * 3, gguf.GGUFValueType.ARRAY, I32)}
    write_tensors(path, tensors, "qwen2", md, {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": ["Ġ h"]})
    return reference


MODEL_TYPES = {"token_embd": T.Q4_K, "output": T.Q6_K,
               "blk.0.attn_q": T.Q5_0, "blk.0.attn_k": T.Q5_1, "blk.0.attn_v": T.Q8_0, "blk.0.attn_output": T.Q4_K,
               "blk.0.ffn_gate": T.Q2_K, "blk.0.ffn_up": T.Q3_K, "blk.0.ffn_down": T.Q5_K,
               "blk.1.attn_q": T.IQ4_NL, "blk.1.attn_k": T.IQ4_XS, "blk.1.attn_v": T.Q4_0,
               "blk.1.attn_output": T.Q4_1, "blk.1.ffn_gate": T.IQ2_XS, "blk.1.ffn_up": T.IQ3_S,
               "blk.1.ffn_down": T.BF16}


@pytest.mark.parametrize("dequantize_all", [True, False])
def test_import_of_k_quants_and_q5_matches_the_reference(tmp_path, dequantize_all):
    reference = _tiny_qwen2(tmp_path / "m.gguf", MODEL_TYPES)
    out = import_gguf(tmp_path / "m.gguf", tmp_path / "out", dequantize=dequantize_all, progress=False)
    saved = mx.load(str(out / "model.safetensors"))
    for name, expected in reference.items():
        hf = importer.hf_tensor_name(name)
        stem = hf.rsplit(".", 1)[0]
        if name.endswith(".weight") and f"{stem}.scales" in saved:
            bits = 8 if MODEL_TYPES[name.rsplit(".", 1)[0]] == T.Q8_0 else 4
            got = mx.dequantize(saved[f"{stem}.weight"], saved[f"{stem}.scales"].astype(mx.float32),
                                saved[f"{stem}.biases"].astype(mx.float32), group_size=32, bits=bits)
        else:
            got = saved[hf].astype(mx.float32)
        tol = 1e-6 if dequantize_all else 1e-3  # float16 storage when not dequantizing
        err = np.abs(np.array(got) - expected).max()
        assert err <= tol * max(1.0, np.abs(expected).max()), f"{name}: max error {err}"
    cfg = json.loads((out / "config.json").read_text())
    assert ("quantization" in cfg) is (not dequantize_all)


def test_a_decoder_that_disagrees_with_the_reference_refuses_the_import(tmp_path, monkeypatch):
    _tiny_qwen2(tmp_path / "m.gguf", {"token_embd": T.Q4_0, "blk.0.attn_q": T.Q4_K})
    real = importer.decode_tensor

    def off_by_a_little(file, info, keep_quantized, float_dtype=np.float16):
        parts = real(file, info, keep_quantized, float_dtype)
        if info.name == "blk.0.attn_q.weight":
            parts["weight"] = parts["weight"] * 1.05
        return parts

    monkeypatch.setattr(importer, "decode_tensor", off_by_a_little)
    with pytest.raises(GGUFError) as info:
        import_gguf(tmp_path / "m.gguf", tmp_path / "out", dequantize=True, progress=False)
    message = str(info.value)
    assert "\n" not in message
    assert "blk.0.attn_q.weight (Q4_K) decodes wrongly" in message and "max error" in message
    assert not (tmp_path / "out").exists()


def test_header_dir_from_the_first_part_alone(tmp_path):
    from mlx_lm.utils import load_tokenizer

    from mlx_swe_rl.models.gguf import write_header_dir

    _tiny_qwen2(tmp_path / "m.gguf", {"token_embd": T.Q4_K})
    data = (tmp_path / "m.gguf").read_bytes()
    (tmp_path / "part01").write_bytes(data[: len(data) // 3])  # the header and a little data
    out = write_header_dir(tmp_path / "part01", tmp_path / "header")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["num_hidden_layers"] == 2 and cfg["vocab_size"] == 260
    assert not list(out.glob("*.safetensors"))
    tok = load_tokenizer(out)
    assert tok.encode(" h<|im_end|>") == [tok.convert_tokens_to_ids("Ġh"), tok.eos_token_id]
