"""The CPU fast path (fastmath.py) against MLX's own kernels: values and gradients."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlx_swe_rl.models import fastmath


def close(a: mx.array, b: mx.array, atol: float, rtol: float = 1e-5) -> None:
    np.testing.assert_allclose(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)), atol=atol, rtol=rtol)


def test_fast_exp_relative_error_over_the_float32_range():
    x = mx.linspace(-87.0, 88.0, 1_000_001)
    got = np.array(fastmath.fast_exp(x)).astype(np.float64)
    want = np.exp(np.array(x).astype(np.float64))
    assert np.max(np.abs(got - want) / want) < 2e-7  # MLX's own exp: 3.8e-6 on the same grid


def test_fast_exp_special_values():
    got = fastmath.fast_exp(mx.array([0.0, 1.0, -mx.inf, -200.0, 200.0, float("nan")])).tolist()
    assert got[0] == 1.0
    assert got[1] == pytest.approx(np.e, rel=1e-7)
    assert 0 <= got[2] < 1e-37 and 0 <= got[3] < 1e-37  # clamped at -87: tiny, not 0
    assert got[4] > 1e38 and np.isnan(got[5])


def test_fast_exp_keeps_dtype_and_has_exp_gradient():
    x = mx.random.normal((64,), key=mx.random.key(0)) * 4
    assert fastmath.fast_exp(x.astype(mx.bfloat16)).dtype == mx.bfloat16
    grad = mx.grad(lambda v: fastmath.fast_exp(v).sum())(x)
    np.testing.assert_allclose(np.array(grad), np.exp(np.array(x)), rtol=2e-6)


def test_swiglu_and_its_gradients_match_silu():
    gate = mx.random.normal((2, 9, 64), key=mx.random.key(7)) * 5
    up = mx.random.normal((2, 9, 64), key=mx.random.key(8))
    g = mx.random.normal((2, 9, 64), key=mx.random.key(9))
    close(fastmath.swiglu(gate, up), nn.silu(gate) * up, 1e-5)
    ours = mx.grad(lambda a, b: (fastmath.swiglu(a, b) * g).sum(), argnums=(0, 1))(gate, up)
    mlx = mx.grad(lambda a, b: (nn.silu(a) * b * g).sum(), argnums=(0, 1))(gate, up)
    for a, b in zip(ours, mlx):
        close(a, b, 2e-5)


def test_install_swaps_mlx_lm_ops_and_the_model_agrees(tiny_model, monkeypatch):
    import mlx_lm.models.llama as llama
    import mlx_lm.models.qwen2 as qwen2

    model, _ = tiny_model
    tokens = mx.array([[5, 9, 13, 2, 7, 30, 31, 8]])
    calls = []
    real_swiglu = fastmath._swiglu
    monkeypatch.setattr(fastmath, "_swiglu", lambda *a: calls.append(1) or real_swiglu(*a))
    try:
        assert fastmath.install(False) is False and not fastmath.installed()
        assert qwen2.swiglu is not fastmath.swiglu
        slow = model(tokens)
        assert fastmath.install(True) and fastmath.installed()
        assert llama.swiglu is fastmath.swiglu and qwen2.swiglu is fastmath.swiglu
        assert qwen2.scaled_dot_product_attention is fastmath.decode_attention
        assert not calls
        close(model(tokens), slow, 1e-4)
        assert len(calls) == len(model.layers)
    finally:
        fastmath.install()
    monkeypatch.setenv("MLX_SWE_RL_FAST_MATH", "0")
    assert fastmath.wanted() is False
    monkeypatch.setenv("MLX_SWE_RL_FAST_MATH", "1")
    assert fastmath.wanted() is True


def test_patched_names_exactly_the_replaced_mlx_lm_functions():
    try:
        fastmath.install(False)
        assert fastmath.patched() == []
        fastmath.install(True)
        assert fastmath.patched() == [f"mlx_lm.models.{m}.{f}" for m in ("llama", "qwen2")
                                      for f in ("swiglu", "scaled_dot_product_attention")]
    finally:
        fastmath.install()


def test_load_model_applies_the_patches_the_variable_asks_for(tiny_model_dir, monkeypatch):
    """The patches are applied where a model is built (models.specs.load_model), as
    MLX_SWE_RL_FAST_MATH says; `describe` names the state for people."""
    from mlx_swe_rl.models.specs import load_model

    try:
        for setting, expected in (("0", False), ("1", True)):
            monkeypatch.setenv(fastmath.ENV_VAR, setting)
            load_model(str(tiny_model_dir), progress=False)
            assert fastmath.installed() is expected and bool(fastmath.patched()) is expected
            assert fastmath.describe().startswith("on" if expected else "off")
    finally:
        monkeypatch.delenv(fastmath.ENV_VAR)
        fastmath.install()


@pytest.mark.parametrize("mask", [None, "causal", "bool", "additive"])
def test_decode_attention_matches_the_fused_kernel(mask):
    """One query per sequence, grouped-query heads (9 query heads on 3 KV heads), masks as a
    batched cache makes them; values and gradients agree with MLX's fused attention."""
    n, heads, kv_heads, length, dim = 5, 9, 3, 41, 64
    keys = [mx.random.key(i) for i in range(4)]
    q = mx.random.normal((n, heads, 1, dim), key=keys[0])
    k = mx.random.normal((n, kv_heads, length, dim), key=keys[1])
    v = mx.random.normal((n, kv_heads, length, dim), key=keys[2])
    m = {"bool": mx.random.uniform(shape=(n, 1, 1, length), key=keys[3]) > 0.3,
         "additive": mx.random.normal((n, 1, 1, length), key=keys[3])}.get(mask, mask)
    fused_mask = None if isinstance(m, str) else m  # "causal" masks nothing for a single query
    reference = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=fused_mask)
    close(fastmath.decode_attention(q, k, v, None, 0.125, m), reference, 1e-5)

    def loss(attention, q, k, v):
        return (attention(q, k, v) * mx.arange(dim)).sum()

    fast = mx.grad(lambda *a: loss(lambda *b: fastmath.decode_attention(*b, None, 0.125, m), *a), argnums=(0, 1, 2))
    fused = mx.grad(lambda *a: loss(lambda *b: mx.fast.scaled_dot_product_attention(
        *b, scale=0.125, mask=fused_mask), *a), argnums=(0, 1, 2))
    for ours, theirs in zip(fast(q, k, v), fused(q, k, v)):
        close(ours, theirs, 1e-4)


def test_decode_attention_passes_other_shapes_on():
    """Prefill (several queries) goes to mlx-lm's own attention: the same result, bit for bit."""
    from mlx_lm.models.base import scaled_dot_product_attention

    q, k, v = mx.random.normal((2, 9, 7, 64)), mx.random.normal((2, 3, 7, 64)), mx.random.normal((2, 3, 7, 64))
    ours = fastmath.decode_attention(q, k, v, None, 0.125, "causal")
    theirs = scaled_dot_product_attention(q, k, v, cache=None, scale=0.125, mask="causal")
    assert mx.array_equal(ours, theirs)


def test_seeded_sampling_is_unchanged_by_the_fast_path(tiny_model):
    """The decode steps the sampler takes give the same tokens with and without it."""
    from mlx_swe_rl.models.sampling import sample

    model, tokenizer = tiny_model
    prompts = [[5, 9, 13, 2, 7], [30, 31, 8, 4, 4, 4, 4, 4, 9]]
    try:
        fastmath.install(False)
        slow = sample(model, tokenizer, prompts, group_size=3, max_tokens=12, temperature=0.8, seed=3)
        fastmath.install(True)
        fast = sample(model, tokenizer, prompts, group_size=3, max_tokens=12, temperature=0.8, seed=3)
    finally:
        fastmath.install()
    for a, b in zip([s for g in slow.groups for s in g], [s for g in fast.groups for s in g]):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_trainer_log_probs_agree_with_and_without_the_fast_path(tiny_model):
    from mlx_swe_rl.rl.policy import GroupBatch, group_log_probs

    model, _ = tiny_model
    batch = GroupBatch.build(list(range(5, 30)), [[7, 8, 9, 10], [11, 12], [13, 14, 15, 16, 17]])
    try:
        fastmath.install(False)
        slow = group_log_probs(model, batch, with_entropy=True)
        fastmath.install(True)
        fast = group_log_probs(model, batch, with_entropy=True)
    finally:
        fastmath.install()
    for a, b in zip(fast, slow):
        close(a, b, 1e-5)


def test_no_grad_log_probs_on_the_fast_attention_agree(tiny_model):
    """The reference pass (`no_grad_log_probs`, inside `inference()`) gives the log-probs of
    the differentiated forward."""
    from mlx_swe_rl.rl.policy import GroupBatch, group_log_probs
    from mlx_swe_rl.rl.trainer import LossGroup, micro_batches, no_grad_log_probs

    model, _ = tiny_model
    completions = [[7, 8, 9, 10], [11, 12], [13, 14, 15, 16, 17]]
    group = LossGroup(list(range(5, 30)), completions, [[1.0] * len(c) for c in completions], [0.0] * 3,
                      [0.0] * 3, [0.0] * 3)
    calls = []
    real_fast_exp = fastmath.fast_exp
    try:
        fastmath.fast_exp = lambda x: calls.append(x.shape) or real_fast_exp(x)
        fast = no_grad_log_probs(model, micro_batches(group, 2))  # one prompt pass, two micro-batches
        assert any(len(shape) == 5 and shape[-2] > 1 for shape in calls)  # prompt-length queries took it
    finally:
        fastmath.fast_exp = real_fast_exp
    # micro-batches are cut longest first: completions 2 and 0, then 1
    for rows, logp in zip([[2, 0], [1]], fast):
        whole = group_log_probs(model, GroupBatch.build(group.prompt, [completions[i] for i in rows]))[0]
        close(logp, whole, 1e-5)


@pytest.mark.parametrize("mask", ["causal", "bool", "additive", "2d"])
def test_prompt_attention_inside_inference_matches_mlx_lm(mask):
    """Several queries per sequence (a prefill, here after 6 cached tokens) take the fast path
    only inside `inference()`, and agree with mlx-lm's attention there."""
    from mlx_lm.models.base import scaled_dot_product_attention

    n, heads, kv_heads, length, span, dim = 2, 9, 3, 13, 19, 64
    keys = [mx.random.key(i) for i in range(4)]
    q = mx.random.normal((n, heads, length, dim), key=keys[0])
    k = mx.random.normal((n, kv_heads, span, dim), key=keys[1])
    v = mx.random.normal((n, kv_heads, span, dim), key=keys[2])
    m = {"bool": mx.random.uniform(shape=(n, 1, length, span), key=keys[3]) > 0.3,
         "additive": mx.random.normal((n, 1, length, span), key=keys[3]),
         "2d": mx.random.uniform(shape=(length, span), key=keys[3]) > 0.3}.get(mask, mask)
    reference = scaled_dot_product_attention(q, k, v, cache=None, scale=0.125, mask=m)
    calls = []
    real_fast_exp = fastmath.fast_exp
    try:
        fastmath.fast_exp = lambda x: calls.append(1) or real_fast_exp(x)
        with fastmath.inference():
            close(fastmath.decode_attention(q, k, v, None, 0.125, m), reference, 1e-5)
        assert calls
        assert mx.array_equal(fastmath.decode_attention(q, k, v, None, 0.125, m), reference)  # outside: passed on
        assert len(calls) == 1
    finally:
        fastmath.fast_exp = real_fast_exp


def test_prefill_cache_is_unchanged_by_the_fast_path(tiny_model):
    """The sampler's prefill (inside `inference()`) leaves the same keys and values."""
    from mlx_swe_rl.models.sampling import prefill

    model, _ = tiny_model
    prompt = list(range(5, 40))
    try:
        fastmath.install(False)
        slow = prefill(model, prompt)
        fastmath.install(True)
        fast = prefill(model, prompt)
    finally:
        fastmath.install()
    for a, b in zip(slow, fast):
        close(b.state[0], a.state[0], 1e-5)
        close(b.state[1], a.state[1], 1e-5)
