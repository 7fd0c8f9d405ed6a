"""exp and SwiGLU built from MLX ops that run fast on x86 CPUs.

Why this exists: MLX's x86-64 CPU wheels compute `exp` (and `sigmoid`, `softmax`,
`logsumexp`, which use it) through a polynomial written with `fma`; built without FMA
instructions, each `fma` becomes a call into libm's software emulation. Measured on a Xeon
(MLX 0.32.4): `mx.exp` 25 ns per float32 element, numpy's exp 0.7 ns. The SiLU of every MLP
is the biggest user (bench/NOTES.md has the measurements).

`fast_exp` computes the same function with plain multiplies and adds that `mx.compile` fuses
into three vectorised loops (about 3 ns per element): n = round(x log2 e), r = x - n ln 2
(Cody-Waite, two steps), exp(r) by Cephes' expf polynomial, and 2^n added straight into the
float's exponent bits. Relative error < 1e-7 on [-87, 88]; inputs below -87 give ~1e-38
rather than 0, inputs above 88 give exp(88).

`install()` points mlx-lm's Llama and Qwen2 MLPs at `swiglu` here, and their attention at
`decode_attention` (which handles decode steps, and prompt prefills inside `inference()`,
itself and passes everything else on). So the code that runs is not all in mlx-lm's
architecture files: `models.specs.load_model` installs it as it builds a model, and says so
(`patched()` names the functions replaced; `mlx-swe-rl info`, the training log, config.yaml's
header and every result file's metadata show them). It is on by default only where it pays
(the CPU device on x86-64); on Apple Silicon and GPUs MLX's own kernels are used.
`MLX_SWE_RL_FAST_MATH=1` / `=0` (`ENV_VAR`) forces it on or off. Attention over training-length queries
that are differentiated, and the vocabulary log-softmax, were tried too and lost to MLX's
single fused primitives (slower, or several times the memory), so they are left alone; see
bench/NOTES.md.
"""

from __future__ import annotations

import os
import platform
from contextlib import contextmanager
from typing import Any, Iterator

import mlx.core as mx

LOG2E = 1.4426950408889634
LN2_HI = 0.693359375  # ln 2 split so n * LN2_HI is exact for |n| < 2^11
LN2_LO = -2.12194440e-4
ROUNDER = 12582912.0  # 1.5 * 2^23: adding it rounds to an integer kept in the low mantissa bits
# exp(r) = 1 + r + r^2 (C0 + C1 r + ... + C5 r^5) on |r| <= ln(2) / 2 (Cephes expf)
C0, C1, C2, C3, C4, C5 = 5.0000001201e-1, 1.6666665459e-1, 4.1665795894e-2, 8.3334519073e-3, \
    1.3981999507e-3, 1.9875691500e-4


@mx.compile
def _reduce(x: mx.array) -> tuple[mx.array, mx.array]:
    x = mx.clip(x, -87.0, 88.0)
    y = x * LOG2E + ROUNDER
    n = y - ROUNDER
    r = (x - n * LN2_HI) - n * LN2_LO
    return y, r


@mx.compile
def _poly(r: mx.array) -> mx.array:
    # Estrin's scheme: shallow enough for one fused loop (MLX fuses at most 11 levels).
    r2 = r * r
    p = (C0 + C1 * r) + r2 * (C2 + C3 * r) + (r2 * r2) * (C4 + C5 * r)
    return (r2 * p + r) + 1.0


@mx.compile
def _scale_bits(y_bits: mx.array, p_bits: mx.array) -> mx.array:
    # y's low mantissa bits hold n; shifted by 23 they add n to p's exponent: p * 2^n.
    return p_bits + (y_bits << 23)


def _fast_exp_f32(x: mx.array) -> mx.array:
    y, r = _reduce(x)
    p = _poly(r)
    return _scale_bits(y.view(mx.int32), p.view(mx.int32)).view(mx.float32)


@mx.custom_function
def fast_exp(x: mx.array) -> mx.array:
    """exp(x), computed in float32 and returned in x's dtype."""
    return _fast_exp_f32(x.astype(mx.float32)).astype(x.dtype)


@fast_exp.vjp
def _fast_exp_vjp(x: mx.array, cotangent: mx.array, output: mx.array) -> mx.array:
    return cotangent * output


def _sigmoid(x: mx.array) -> mx.array:
    return 1.0 / (1.0 + _fast_exp_f32(-x))


@mx.custom_function
def _swiglu(gate: mx.array, up: mx.array) -> mx.array:
    g = gate.astype(mx.float32)
    return (g * _sigmoid(g) * up.astype(mx.float32)).astype(gate.dtype)


@_swiglu.vjp
def _swiglu_vjp(primals: Any, cotangent: mx.array, output: mx.array) -> tuple[mx.array, mx.array]:
    gate, up = primals
    # Recompute sigmoid rather than keep it: one more exp is cheaper than a stored activation.
    g, u, c = gate.astype(mx.float32), up.astype(mx.float32), cotangent.astype(mx.float32)
    s = _sigmoid(g)
    d_gate = c * u * s * (1.0 + g * (1.0 - s))
    return d_gate.astype(gate.dtype), (c * g * s).astype(up.dtype)


def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up, the gated MLP activation of Llama and Qwen2."""
    return _swiglu(gate, up)


_inference = 0  # depth of open `inference()` blocks


@contextmanager
def inference() -> Iterator[None]:
    """Forward passes built inside this block are never differentiated, so `decode_attention`
    may also take their multi-query attention (a prompt's prefill): there the composite is
    2-2.5x faster than MLX's fused kernel, but its backward at training shapes is slower and
    stores the scores."""
    global _inference
    _inference += 1
    try:
        yield
    finally:
        _inference -= 1


def decode_attention(queries: mx.array, keys: mx.array, values: mx.array, cache: Any, scale: float,
                     mask: Any, sinks: Any = None) -> mx.array:
    """mlx-lm's `scaled_dot_product_attention` for decode steps (one query per sequence) and,
    inside `inference()`, for whole prompts: grouped-query attention as two batched matmuls
    and a softmax on `fast_exp`. MLX's fused CPU kernel spends most of its time in its exp
    (measured at batch 64 and a 256-token cache: 5.9 ms per layer fused, 3.1 ms this way; a
    181-token prefill: 3.6 vs 1.4 ms). Training-length queries, quantized caches, sinks,
    head-dependent masks and other dtypes take mlx-lm's path."""
    from mlx_lm.models.base import create_causal_mask, scaled_dot_product_attention

    n, heads, length, dim = queries.shape
    kv_heads, span = keys.shape[1], keys.shape[2]
    mask_ok = mask is None or isinstance(mask, str) or mask.ndim == 2 or (mask.ndim == 4 and mask.shape[1] == 1)
    if ((length != 1 and not _inference) or sinks is not None or hasattr(cache, "bits") or not mask_ok
            or queries.dtype != mx.float32 or keys.dtype != mx.float32):
        return scaled_dot_product_attention(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
    group = heads // kv_heads  # the query heads that share a KV head, batched together
    q = queries.reshape(n, kv_heads, group * length, dim)
    scores = ((q @ keys.swapaxes(-1, -2)) * scale).reshape(n, kv_heads, group, length, span)
    if isinstance(mask, str):
        if length > 1:  # causal: query i sits at position span - length + i of the keys
            mask = create_causal_mask(length, offset=span - length)
        else:
            mask = None  # a single query sees every key
    if mask is not None:
        mask = mask[:, :, None] if mask.ndim == 4 else mask  # [n, 1, L, S] -> [n, 1, 1, L, S]: all heads
        scores = mx.where(mask, scores, -1e30) if mask.dtype == mx.bool_ else scores + mask
    weights = fast_exp(scores - scores.max(axis=-1, keepdims=True))
    weights = weights / weights.sum(axis=-1, keepdims=True)
    return (weights.reshape(n, kv_heads, group * length, span) @ values).reshape(n, heads, length, dim)


# --- wiring into mlx-lm ------------------------------------------------------------------------

PATCHED_MODULES = ("mlx_lm.models.llama", "mlx_lm.models.qwen2")
REPLACEMENTS = {"swiglu": swiglu, "scaled_dot_product_attention": decode_attention}
_originals: dict[tuple[str, str], Any] = {}  # (module name, attribute) -> mlx-lm's own function


ENV_VAR = "MLX_SWE_RL_FAST_MATH"


def wanted() -> bool:
    """Whether the fast path should be used: `MLX_SWE_RL_FAST_MATH` if set, else the CPU on x86-64."""
    setting = os.environ.get(ENV_VAR, "").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return False
    if setting in ("1", "true", "yes", "on"):
        return True
    return mx.default_device() == mx.cpu and platform.machine().lower() in ("x86_64", "amd64")


def install(enable: bool | None = None) -> bool:
    """Use the fast SwiGLU and decode attention in mlx-lm's Llama and Qwen2 models (`enable`
    None: `wanted()`); with `enable` False, restore mlx-lm's own. Returns whether the fast path
    is now installed."""
    import importlib

    enable = wanted() if enable is None else enable
    for name in PATCHED_MODULES:
        module = importlib.import_module(name)
        for attr, fast in REPLACEMENTS.items():
            _originals.setdefault((name, attr), getattr(module, attr))
            setattr(module, attr, fast if enable else _originals[(name, attr)])
    return enable


def installed() -> bool:
    """Whether mlx-lm's Llama blocks currently use this module's ops."""
    import mlx_lm.models.llama as llama

    return llama.swiglu is swiglu


def patched() -> list[str]:
    """The mlx-lm functions this module's ops replace right now ("module.function"), in a fixed
    order; empty when mlx-lm runs its own."""
    import importlib

    return [f"{name}.{attr}" for name in PATCHED_MODULES for attr, fast in REPLACEMENTS.items()
            if getattr(importlib.import_module(name), attr) is fast]


def describe(enabled: bool | None = None) -> str:
    """One line for people: whether the fast path is (`enabled` None: would be, by `wanted()`)
    in use, what it replaces and how to switch it."""
    enabled = wanted() if enabled is None else enabled
    why = f"{ENV_VAR} set" if os.environ.get(ENV_VAR, "").strip() else "default for this device"
    if not enabled:
        return f"off ({why}; {ENV_VAR}=1 forces it on)"
    replaced = ", ".join(REPLACEMENTS)
    modules = ", ".join(name.rsplit(".", 1)[1] for name in PATCHED_MODULES)
    return (f"on ({why}; {ENV_VAR}=0 turns it off): mlx-lm's {replaced} in {modules} replaced by "
            "mlx_swe_rl/models/fastmath.py")
