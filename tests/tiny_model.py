"""Tiny randomly initialised Qwen2-architecture models with a real (small, trained) tokenizer.

Built in about a second, fully offline: a byte-level BPE is trained on the bundled puzzles
(so prompts tokenize into realistic pieces), and the weights come from mlx-lm's own Qwen2
module initialised with a fixed seed.
"""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus() -> list[str]:
    from mlx_swe_rl.env.prompts import SYSTEM_PROMPT
    from mlx_swe_rl.puzzles.format import load_puzzles

    texts = [SYSTEM_PROMPT]
    for p in load_puzzles():
        texts += [p.description, p.buggy, p.oracle, *p.tests]
    return texts


def write_tokenizer(out: Path, vocab_size: int = 512) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "add_bos_token": False,
        "model_max_length": 4096,
    }))


def make_tiny_model(out: Path, *, seed: int = 0, hidden: int = 64, layers: int = 2,
                    vocab_size: int = 512, arch: str = "qwen2") -> Path:
    """Write a tiny mlx-lm model directory (Qwen2, or `arch="llama"`) at `out` and return it."""
    import importlib

    import mlx.core as mx
    from mlx.utils import tree_flatten

    module = importlib.import_module(f"mlx_lm.models.{arch}")

    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(out, vocab_size)
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    n_vocab = max(vocab.values()) + 1
    config = {
        "model_type": arch, "hidden_size": hidden, "num_hidden_layers": layers,
        "intermediate_size": 2 * hidden, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6, "vocab_size": n_vocab, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": True,
        "eos_token_id": vocab["<|im_end|>"],
    }
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out
