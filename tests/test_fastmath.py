"""The CPU fast path (fastmath.py) against MLX's own kernels: values and gradients."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlx_swe_rl import fastmath


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


def test_softmax_matches_mlx_and_masks_exactly():
    x = mx.random.normal((3, 5, 40), key=mx.random.key(1)) * 6
    x = mx.where(mx.random.uniform(shape=x.shape, key=mx.random.key(2)) < 0.3, -mx.inf, x)
    x[1, 2] = -mx.inf  # a fully masked row
    got = fastmath.softmax(x)
    want = mx.softmax(x, axis=-1)
    assert (mx.where(x == -mx.inf, got, 0) == 0).all().item()
    assert (got[1, 2] == 0).all().item()
    keep = mx.array(np.isfinite(np.array(x)).any(-1))[..., None]
    close(mx.where(keep, got, 0), mx.where(keep, want, 0), 1e-6)
    g = mx.random.normal(x.shape, key=mx.random.key(3))
    y = mx.random.normal((3, 5, 40), key=mx.random.key(4))
    close(mx.grad(lambda v: (fastmath.softmax(v) * g).sum())(y),
          mx.grad(lambda v: (mx.softmax(v, axis=-1) * g).sum())(y), 1e-6)


def test_logsumexp_and_its_gradient_match_mlx():
    x = mx.random.normal((4, 7, 300), key=mx.random.key(5)) * 10
    close(fastmath.fast_logsumexp(x), mx.logsumexp(x, axis=-1), 2e-5)
    g = mx.random.normal((4, 7), key=mx.random.key(6))
    close(mx.grad(lambda v: (fastmath.fast_logsumexp(v) * g).sum())(x),
          mx.grad(lambda v: (mx.logsumexp(v, axis=-1) * g).sum())(x), 1e-6)


def test_swiglu_and_its_gradients_match_silu():
    gate = mx.random.normal((2, 9, 64), key=mx.random.key(7)) * 5
    up = mx.random.normal((2, 9, 64), key=mx.random.key(8))
    g = mx.random.normal((2, 9, 64), key=mx.random.key(9))
    close(fastmath.swiglu(gate, up), nn.silu(gate) * up, 1e-5)
    ours = mx.grad(lambda a, b: (fastmath.swiglu(a, b) * g).sum(), argnums=(0, 1))(gate, up)
    mlx = mx.grad(lambda a, b: (nn.silu(a) * b * g).sum(), argnums=(0, 1))(gate, up)
    for a, b in zip(ours, mlx):
        close(a, b, 2e-5)


def _qkv(batch: int, heads: int, kv_heads: int, length: int, span: int, seed: int) -> list[mx.array]:
    keys = mx.random.split(mx.random.key(seed), 3)
    return [mx.random.normal((batch, h, n, 16), key=k)
            for h, n, k in zip((heads, kv_heads, kv_heads), (length, span, span), keys)]


@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool", "additive"])
def test_attention_matches_mlx_sdpa(mask_kind: str):
    q, k, v = _qkv(2, 4, 2, 5, 9, seed=10)  # grouped heads, queries after a 4-token prefix
    bool_mask = mx.random.uniform(shape=(2, 1, 5, 9), key=mx.random.key(11)) < 0.7
    bool_mask[..., -1] = True  # every query sees at least one key
    mask = {"none": None, "causal": "causal", "bool": bool_mask,
            "additive": mx.where(bool_mask, 0.0, -1e9)}[mask_kind]
    close(fastmath.attention(q, k, v, scale=0.25, mask=mask),
          mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask), 1e-5)

    def loss(attend):
        return lambda a, b, c: (attend(a, b, c, scale=0.25, mask=mask) ** 2).sum()

    ours = mx.grad(loss(fastmath.attention), argnums=(0, 1, 2))(q, k, v)
    mlx = mx.grad(loss(mx.fast.scaled_dot_product_attention), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(ours, mlx):
        close(a, b, 1e-4)


def test_attention_bfloat16_computes_in_float32():
    q, k, v = (a.astype(mx.bfloat16) for a in _qkv(1, 2, 1, 4, 4, seed=12))
    out = fastmath.attention(q, k, v, scale=0.25, mask="causal")
    assert out.dtype == mx.bfloat16
    want = mx.fast.scaled_dot_product_attention(*(a.astype(mx.float32) for a in (q, k, v)), scale=0.25, mask="causal")
    close(out, want, 1e-2)


def test_install_swaps_mlx_lm_ops_and_the_model_agrees(tiny_model, monkeypatch):
    import mlx_lm.models.llama as llama
    import mlx_lm.models.qwen2 as qwen2

    model, _ = tiny_model
    tokens = mx.array([[5, 9, 13, 2, 7, 30, 31, 8]])
    monkeypatch.setattr(fastmath, "MIN_FAST_SCORES", 0)  # a problem this small would use MLX's own
    calls = []
    real_attention = fastmath.attention
    monkeypatch.setattr(fastmath, "attention", lambda *a, **k: calls.append(1) or real_attention(*a, **k))
    try:
        assert fastmath.install(False) is False and not fastmath.installed()
        assert qwen2.swiglu is not fastmath.swiglu
        slow = model(tokens)
        assert fastmath.install(True) and fastmath.installed()
        assert llama.swiglu is fastmath.swiglu and qwen2.swiglu is fastmath.swiglu
        assert not calls
        close(model(tokens), slow, 1e-4)
        assert len(calls) == len(model.layers)
    finally:
        fastmath.install()
    monkeypatch.setenv("MLX_SWE_RL_FAST_MATH", "0")
    assert fastmath.wanted() is False
    monkeypatch.setenv("MLX_SWE_RL_FAST_MATH", "1")
    assert fastmath.wanted() is True
