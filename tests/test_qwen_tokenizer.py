"""The real Qwen2.5-Coder tokenizer and chat template through the parts that depend on them:
multi-turn bridges, the answer-end stop, answer extraction and the memory preflight. The
tokenizer comes from the GGUF metadata of the built-in model's first part (conftest), so no
weights are needed. Its multi-turn ids are checked beside the other tokenizers' in
tests/test_multi_turn.py."""

from __future__ import annotations

import pytest

from mlx_swe_rl.env.codefix import CodeFixEnv
from mlx_swe_rl.env.prompts import AnswerEnd, answer_closed, extract_code
from mlx_swe_rl.models.chat import ChatFrame, encode_text
from mlx_swe_rl.models.sampling import encode_chat
from mlx_swe_rl.puzzles.format import load_puzzles

def test_qwen_template_is_the_im_start_framing(qwen_tokenizer):
    frame = ChatFrame.of(qwen_tokenizer)
    assert frame.eos_text == "<|im_end|>" and frame.end_of_turn.startswith("<|im_end|>")
    assert frame.user_header == "\n<|im_start|>user\n" or frame.user_header.endswith("<|im_start|>user\n")
    assert frame.user_footer.endswith("<|im_start|>assistant\n")
    ids = encode_chat(qwen_tokenizer, [{"role": "user", "content": "Fix add."}])
    text = qwen_tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    special = {qwen_tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>")}
    assert special <= set(ids)  # framing tokens are single special ids, not BPE pieces


def _first_stop(tokenizer, ids: list[int], rule: AnswerEnd) -> int | None:
    """Where the sampler stops: it asks the rule only after a token whose own text holds a trigger."""
    for i, token in enumerate(ids):
        if any(c in tokenizer.decode([token]) for c in rule.triggers) and rule.done(tokenizer.decode(ids[:i + 1])):
            return i
    return None


@pytest.mark.parametrize("puzzle", load_puzzles(tiers=["easy"])[:6], ids=lambda p: p.id)
def test_answer_end_stops_on_qwens_own_tokens(qwen_tokenizer, puzzle):
    # Qwen merges fences with the newlines around them ("```\n\n"); the stop must still fire on
    # the token that closes the answer, never later, and the stopped text must hold the answer.
    reply = f"Here is the fix.\n```python\n{puzzle.oracle.strip()}\n```\n\nIt now passes the tests."
    ids = encode_text(qwen_tokenizer, reply)
    rule = AnswerEnd(puzzle.entry_point)
    stop = _first_stop(qwen_tokenizer, ids, rule)
    assert stop is not None
    first_closed = next(i for i in range(len(ids)) if answer_closed(qwen_tokenizer.decode(ids[:i + 1]), puzzle.entry_point))
    assert stop == first_closed
    assert extract_code(qwen_tokenizer.decode(ids[:stop + 1]), puzzle.entry_point) == puzzle.oracle.strip()


def test_scored_answer_decoded_from_qwen_tokens(qwen_tokenizer):
    puzzle = load_puzzles(tiers=["easy"])[0]
    reply = f"```python\n{puzzle.oracle.strip()}\n```"
    text = qwen_tokenizer.decode(encode_text(qwen_tokenizer, reply) + list(qwen_tokenizer.eos_token_ids))
    with CodeFixEnv([puzzle]) as env:
        info = env.score([(puzzle.id, text.replace("<|im_end|>", ""))])[0]
    assert info.solved and info.code == puzzle.oracle.strip()


def test_memory_preflight_of_the_full_run_fits_a_16gb_mac(qwen_header_dir):
    # `train --config configs/grpo.yaml --set model.spec=qwen2.5-coder-1.5b --dry-run` reads the
    # same shape and tokenizer; the header directory has them without the weights. On a Mac the
    # config's `dtype: auto` is bfloat16 (auto_dtype: a GPU); this machine would resolve float32.
    from mlx_swe_rl.rl.config import load_config
    from mlx_swe_rl.rl.memory import estimate, plan
    from mlx_swe_rl.rl.trainer import eval_puzzles, training_puzzles

    cfg = load_config("configs/grpo.yaml", [f"model.spec={qwen_header_dir}", "model.dtype=bfloat16"])
    train = training_puzzles(cfg)
    shape, work = plan(cfg, train, eval_puzzles(cfg, train))
    assert shape.vocab == 151936 and shape.layers == 28
    est = estimate(shape, work)
    assert est.peak <= 10e9, {k: round(v / 1e9, 2) for k, v in est.phases.items()}
    # the prompts were measured with Qwen's tokenizer: its system prompt alone is ~30 tokens
    assert work.train_prompt > 100
