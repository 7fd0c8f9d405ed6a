"""Benchmark W2: peak memory of one GRPO optimizer step at Qwen2.5-Coder-1.5B-Instruct's size.

A randomly initialised Qwen2 model with exactly the 1.5B shape (hidden 1536, 28 layers, 12
heads, 2 KV heads, intermediate 8960, vocab 151936, tied embeddings) in bfloat16; one prompt of
256 random tokens with G = 8 fixed random completions of 384 tokens (no sampling); one call of
the trainer's `run_updates` with beta > 0 (reference forward, micro-batched forward/backward
with gradient accumulation, clipping, AdamW). Reported: resident memory after building and
the step's peak (MLX's allocator, weights included) for LoRA + KL and full fine-tuning + KL.
Targets (issue W2): LoRA <= 6 GB, full <= 20 GB, growing with the micro-batch, not with G.

Caveat, `--upcast-matmul` (auto: on for the CPU): MLX's CPU backend multiplies bfloat16
matrices ~40x slower than float32, so every nn.Linear and the tied LM head then compute in
float32 from bf16 operands and return bf16. Autodiff stores what a bf16 run stores; the extra
is transient float32 slices of weights and results (estimate printed, ~0.1-0.4 GB), so the peak
is an upper bound for a true bf16 run. Not a test: `python bench/bench_memory.py`.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import click
import numpy as np

from common import machine, machine_line, peak_memory  # first: it loads OpenBLAS, which must precede mlx.core

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
import mlx_lm.models.qwen2 as qwen2  # noqa: E402
from mlx_lm.models.qwen2 import Model, ModelArgs  # noqa: E402

from mlx_swe_rl.models import fastmath
from mlx_swe_rl.rl.config import Config, load_config
from mlx_swe_rl.rl.policy import prepare_policy
from mlx_swe_rl.rl.trainer import LossGroup, Policy, make_optimizer, run_updates

TARGETS_GB = {"lora": 6.0, "full": 20.0}
F32 = mx.float32
# Weights are upcast in slices of their output rows of at most this many float32 bytes: MLX's
# CPU scheduler allocates a dozen or so ops ahead of the computation, so a whole float32 copy of
# the 151936 x 1536 LM head (0.93 GB) would sit next to its bf16 one, often twice over.
CHUNK_BYTES = 8 * 2**20
IN_FLIGHT = 12  # ops allocated ahead, measured: LM head upcast vs native bf16 peaks, 16-64 rows


def qwen_args(layers: int) -> ModelArgs:
    return ModelArgs(model_type="qwen2", hidden_size=1536, num_hidden_layers=layers, intermediate_size=8960,
                     num_attention_heads=12, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=151936,
                     max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True)


# --- float32 matmuls on bf16 operands ----------------------------------------------------------

def _chunks(w: mx.array) -> list[slice]:
    n = max(1, math.ceil(w.shape[0] * w.shape[1] * 4 / CHUNK_BYTES))
    step = math.ceil(w.shape[0] / n)
    return [slice(i, min(i + step, w.shape[0])) for i in range(0, w.shape[0], step)]


def _upcast(w: mx.array, after: mx.array) -> mx.array:
    # Without the dependency MLX may cast a weight (it only needs the resident bf16 one) long
    # before its matmul runs, e.g. every layer's backward copy during the forward pass.
    return mx.depends(w, after).astype(F32)


def _forward(x: mx.array, w: mx.array, b: mx.array | None = None) -> mx.array:
    x32, parts = x.astype(F32), []
    for c in _chunks(w):
        wc = _upcast(w[c], parts[-1] if parts else x32)
        parts.append((x32 @ wc.T if b is None else mx.addmm(b[c].astype(F32), x32, wc.T)).astype(x.dtype))
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1)


def _backward(x: mx.array, w: mx.array, g: mx.array) -> tuple[mx.array, mx.array]:
    x32 = x.astype(F32).reshape(-1, x.shape[-1])
    g2 = g.reshape(-1, g.shape[-1])
    dx, dw = mx.zeros(x32.shape, F32), mx.zeros(w.shape, w.dtype)
    for c in _chunks(w):
        gc = g2[:, c].astype(F32)
        dx = dx + gc @ _upcast(w[c], dx)
        dw[c] = (gc.T @ x32).astype(w.dtype)
    return dx.astype(x.dtype).reshape(x.shape), dw


# custom_function: autodiff keeps only the primals (bf16 x, w), not the float32 copies, and
# the vjp recomputes them. x @ w.T (+ b) in float32, returned in x's dtype.
upcast_matmul = mx.custom_function(lambda x, w: _forward(x, w))
upcast_matmul.vjp(lambda primals, g, _: _backward(*primals, g))
upcast_linear = mx.custom_function(lambda x, w, b: _forward(x, w, b))
upcast_linear.vjp(lambda primals, g, _: (*_backward(primals[0], primals[1], g),
                                         g.astype(F32).reshape(-1, g.shape[-1]).sum(axis=0).astype(primals[2].dtype)))


@contextlib.contextmanager
def upcast_matmuls(on: bool) -> Iterator[None]:
    """Route nn.Linear (LoRALinear's `.linear` included) and Embedding.as_linear through the
    float32 custom functions while active. Float32 operands (LoRA's A/B) keep the plain path; attention computes in float32 too."""
    linear_call, as_linear, sdpa = nn.Linear.__call__, nn.Embedding.as_linear, qwen2.scaled_dot_product_attention
    if not on:
        yield
        return

    def call(self: nn.Linear, x: mx.array) -> mx.array:
        w = self["weight"]
        if x.dtype != w.dtype or w.dtype == F32:
            return linear_call(self, x)
        return upcast_linear(x, w, self["bias"]) if "bias" in self else upcast_matmul(x, w)

    def head(self: nn.Embedding, x: mx.array) -> mx.array:
        w = self.weight
        return as_linear(self, x) if x.dtype != w.dtype or w.dtype == F32 else upcast_matmul(x, w)

    def attention(queries: mx.array, keys: mx.array, values: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        # Attention's L x S products in bf16 are as slow as the matmuls; its stored q/k/v are
        # a few MB per layer, so float32 copies barely move the peak.
        out = sdpa(queries.astype(F32), keys.astype(F32), values.astype(F32), *args, **kwargs)
        return out.astype(queries.dtype)

    nn.Linear.__call__, nn.Embedding.as_linear, qwen2.scaled_dot_product_attention = call, head, attention
    try:
        yield
    finally:
        nn.Linear.__call__, nn.Embedding.as_linear, qwen2.scaled_dot_product_attention = linear_call, as_linear, sdpa


def upcast_overhead_bytes(rows: int, hidden: int, vocab: int, weight_grad: bool) -> int:
    """Estimated bytes a true bf16 run would not allocate, at the LM head (the largest matmul):
    IN_FLIGHT float32 weight slices with their result (and weight-gradient) slices, the bf16
    logit slices concatenated into the logits, float32 activations and input gradient."""
    cols = math.ceil(vocab / max(1, math.ceil(vocab * hidden * 4 / CHUNK_BYTES)))
    per_op = 4 * (cols * hidden * (1 + weight_grad) + rows * cols)
    return IN_FLIGHT * per_op + 2 * rows * vocab + 2 * 4 * rows * hidden


# --- one measured run --------------------------------------------------------------------------

def nbytes(tree: Any) -> int:
    return sum(v.nbytes for _, v in tree_flatten(tree))


def random_model(layers: int, dtype: mx.Dtype, seed: int) -> nn.Module:
    mx.random.seed(seed)  # the same seed for policy and reference: the same initial weights
    model = Model(qwen_args(layers))
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def measure(mode: str, micro_batch: int, layers: int, group: int, prompt_tokens: int, completion_tokens: int,
            dtype: str, upcast: bool) -> dict[str, Any]:
    cfg: Config = load_config(None, [f"finetune.mode={mode}", f"train.micro_batch_size={micro_batch}",
                                     f"model.dtype={dtype}", "grpo.beta=0.04", "grpo.num_iterations=1",
                                     f"sampling.group_size={group}", f"sampling.max_tokens={completion_tokens}",
                                     "finetune.lora.rank=8", "finetune.lora.num_layers=-1", "optim.lr=1e-5"])
    start = time.perf_counter()
    model, reference = random_model(layers, getattr(mx, dtype), seed=0), None
    if mode == "full":  # as frozen_reference: a second copy, frozen, eval mode
        reference = random_model(layers, getattr(mx, dtype), seed=0).freeze()
        reference.eval()
    prepare_policy(model, cfg.finetune)
    mx.eval(model.parameters())
    policy, optimizer = Policy(model, None, cfg, reference), make_optimizer(cfg)
    weights, trainable = nbytes(model.parameters()), nbytes(model.trainable_parameters())
    ref_bytes = nbytes(reference.parameters()) if reference is not None else 0
    build_s = time.perf_counter() - start

    rng = np.random.default_rng(0)
    vocab = qwen_args(1).vocab_size
    prompt = rng.integers(0, vocab, prompt_tokens).tolist()
    loss_group = LossGroup(prompt, [rng.integers(0, vocab, completion_tokens).tolist() for _ in range(group)],
                           [1.0 if i % 2 == 0 else -1.0 for i in range(group)],
                           [1.0 / (group * completion_tokens)] * group)
    mx.clear_cache()
    resident = mx.get_active_memory()
    mx.reset_peak_memory()  # the figure: the step's peak, resident weights included
    start = time.perf_counter()
    with upcast_matmuls(upcast):
        stats = run_updates(policy, optimizer, [loss_group])
    wall = time.perf_counter() - start
    peak = mx.get_peak_memory()
    # Must stay resident: weights (+ frozen copy), then gradients and AdamW m, v of what trains.
    floor = weights + ref_bytes + 3 * trainable
    rows = min(micro_batch, group) * completion_tokens
    return {"mode": mode, "micro_batch": micro_batch, "layers": layers, "group_size": group,
            "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "dtype": dtype,
            "upcast_matmul": upcast, "resident_gb": resident / 1e9, "peak_gb": peak / 1e9,
            "floor_gb": floor / 1e9, "weights_gb": weights / 1e9, "reference_gb": ref_bytes / 1e9,
            "trainable_gb": trainable / 1e9, "after_step_gb": mx.get_active_memory() / 1e9,
            "upcast_overhead_gb": upcast_overhead_bytes(rows, 1536, vocab, mode == "full") / 1e9 if upcast else 0.0,
            "target_gb": TARGETS_GB[mode], "met": peak / 1e9 <= TARGETS_GB[mode], "wall_s": wall,
            "build_s": build_s, "loss": stats.get("loss"), "kl": stats.get("kl"), "grad_norm": stats.get("grad_norm"),
            "process_peak_rss_gb": peak_memory()["process_peak_rss_gb"]}


# --- CLI ---------------------------------------------------------------------------------------

def machine_info() -> dict[str, Any]:
    # The memory limit matters: above it MLX stops allocating ahead and waits for running ops.
    return {**machine(), "memory_limit_gb": mx.get_memory_limit() / 1e9}


def print_table(rows: list[dict[str, Any]]) -> None:
    r0, m = rows[0], machine_info()
    click.echo(f"\nW2: random Qwen2.5-Coder-1.5B shape, {r0['layers']} layers, {r0['dtype']}, G={r0['group_size']}, "
               f"prompt {r0['prompt_tokens']} + completions {r0['completion_tokens']} tokens, beta=0.04, LoRA r=8 all "
               f"layers\n{machine_line(m)}, memory limit {m['memory_limit_gb']:.1f} GB")
    click.echo(f"{'mode':<5} {'micro':>5} {'resident GB':>11} {'peak GB':>8} {'floor GB':>9} {'target GB':>9} "
               f"{'met?':>4} {'wall s':>7} {'RSS GB':>7}")
    for r in rows:
        click.echo(f"{r['mode']:<5} {r['micro_batch']:>5} {r['resident_gb']:>11.2f} {r['peak_gb']:>8.2f} "
                   f"{r['floor_gb']:>9.2f} {r['target_gb']:>9.1f} {'yes' if r['met'] else 'no':>4} {r['wall_s']:>7.1f} "
                   f"{r['process_peak_rss_gb']:>7.2f}")
    click.echo("peak GB: MLX's allocator (the target's measure); RSS GB: the process's peak resident set "
               "(what peers report; includes Python, the random init and MLX's cache)")
    for r in rows:
        click.echo(f"floor {r['mode']}: weights {r['weights_gb']:.2f} + reference {r['reference_gb']:.2f} + 3 x "
                   f"trainable {r['trainable_gb']:.3f} (grads, AdamW m, v) = {r['floor_gb']:.2f} GB; "
                   f"peak - floor = {r['peak_gb'] - r['floor_gb']:.2f} GB")
    if any(r["upcast_matmul"] for r in rows):
        worst = max(r["upcast_overhead_gb"] for r in rows)
        click.echo(f"upcast-matmul on: bf16 matmuls ran in float32; up to ~{worst:.2f} GB of the peak is transient "
                   "float32 copies a true bf16 run would not make (the peaks are upper bounds)")
    if rows[0]["layers"] != 28:
        click.echo("note: reduced layer count; not the W2 figure")


@click.command()
@click.option("--mode", type=click.Choice(["lora", "full", "both"]), default="both", show_default=True)
@click.option("--micro-batch", default=1, show_default=True, help="train.micro_batch_size")
@click.option("--layers", default=28, show_default=True, help="Transformer blocks (28 = the real model).")
@click.option("--group-size", default=8, show_default=True)
@click.option("--prompt-tokens", default=256, show_default=True)
@click.option("--completion-tokens", default=384, show_default=True)
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16", show_default=True)
@click.option("--upcast-matmul", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="auto: on when the default device is the CPU and the dtype is not float32.")
@click.option("--out", default="outputs/bench_memory.json", show_default=True, type=click.Path(path_type=Path))
@click.option("--child", is_flag=True, hidden=True, help="Run by --mode both: write the JSON, print nothing.")
def main(mode: str, micro_batch: int, layers: int, group_size: int, prompt_tokens: int, completion_tokens: int,
         dtype: str, upcast_matmul: str, out: Path, child: bool) -> None:
    fastmath.install()  # as load_model does for a real checkpoint (and the machine line reports it)
    if mode == "both":
        # One process per mode: a peak is per process, and the first run's freed buffers
        # would otherwise sit in MLX's cache.
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            for one in ("lora", "full"):
                child_out = Path(tmp) / f"{one}.json"
                subprocess.run([sys.executable, __file__, *sys.argv[1:], "--mode", one, "--out", str(child_out),
                                "--child"], check=True)
                rows += json.loads(child_out.read_text())["rows"]
    else:
        upcast = upcast_matmul == "on" or (upcast_matmul == "auto" and mx.default_device() == mx.cpu
                                           and dtype != "float32")
        rows = [measure(mode, micro_batch, layers, group_size, prompt_tokens, completion_tokens, dtype, upcast)]
    if not child:
        print_table(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"workload": "W2", "machine": machine_info(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
