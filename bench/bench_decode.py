"""Benchmark: where one batched decode step goes, at batch 8/32/64/128, against its floor.

A decode step runs the model on one new token per sequence over a KV cache of `--context`
tokens, then normalises the logits and samples. Each part is timed on its own (median of
`--repeats`), with the decode attention of `models/fastmath.py` and with MLX's fused kernel
alternately, and the floor of the step is printed: every weight and the whole KV cache read
once, or the FLOPs at the measured GEMM ceiling, whichever is slower. Then the real sampler
(`models.sampling.sample`) runs an eval-like workload both ways.
Not a test: `python bench/bench_decode.py`.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable

import click

from common import (machine, machine_line, measure_ceilings, model_counts, print_table, warn_below_floor,
                    write_result)
from mlx_swe_rl.env.prompts import build_messages
from mlx_swe_rl.models import fastmath
from mlx_swe_rl.models.sampling import encode_chat, sample
from mlx_swe_rl.models.specs import load_model
from mlx_swe_rl.puzzles.format import load_puzzles


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def _attention(fast: bool) -> None:
    """Switch only the attention (the fast SwiGLU stays as `install()` left it)."""
    import importlib

    from mlx_lm.models.base import scaled_dot_product_attention

    for name in fastmath.PATCHED_MODULES:
        setattr(importlib.import_module(name), "scaled_dot_product_attention",
                fastmath.decode_attention if fast else scaled_dot_product_attention)


def step_parts(model: Any, batch: int, context: int, repeats: int) -> dict[str, float]:
    """Milliseconds of the blocks, the LM head, the log-softmax and the categorical draw of
    one decode step at this batch size and context length."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    one = make_prompt_cache(model)
    model(mx.random.randint(0, 1000, (1, context)), cache=one)
    cache = make_prompt_cache(model)
    for c, b in zip(cache, one):  # the same prompt cache for every row, without `batch` prefills
        c.keys, c.values = (mx.repeat(t[..., :context, :], batch, axis=0) for t in b.state[:2])
        c.offset = context
    mx.eval([c.keys for c in cache] + [c.values for c in cache])
    token = mx.random.randint(0, 1000, (batch, 1))

    def run(fn: Callable[[], Any]) -> Callable[[], None]:
        def step() -> None:
            mx.eval(fn())
            for c in cache:
                c.offset -= 1  # the next call overwrites the same slot: the context stays fixed
        return step

    whole = _median_ms(run(lambda: model(token, cache=cache)), repeats)
    body = _median_ms(run(lambda: model.model(token, cache=cache)), repeats)
    logits = model(token, cache=cache)[:, -1, :]
    mx.eval(logits)
    for c in cache:
        c.offset -= 1
    normalise = _median_ms(lambda: mx.eval(logits - mx.logsumexp(logits, axis=-1, keepdims=True)), repeats)
    draw = _median_ms(lambda: mx.eval(mx.random.categorical(logits * 1.25)), repeats)
    return {"body_ms": body, "head_ms": whole - body, "logsumexp_ms": normalise, "categorical_ms": draw,
            "step_ms": whole + normalise + draw}


@click.command()
@click.option("--model", "model_spec", default="smollm2-135m", show_default=True)
@click.option("--batches", default="8,32,64,128", show_default=True)
@click.option("--context", default=256, show_default=True, help="KV-cache length of the decode steps.")
@click.option("--repeats", default=5, show_default=True)
@click.option("--puzzles", "n_puzzles", default=32, show_default=True, help="Prompts of the sampler workload.")
@click.option("--max-tokens", default=128, show_default=True)
@click.option("--out", default="outputs/bench/decode.json", show_default=True, type=click.Path(path_type=Path))
def main(model_spec: str, batches: str, context: int, repeats: int, n_puzzles: int, max_tokens: int,
         out: Path) -> None:
    model, tokenizer = load_model(model_spec)
    info, ceilings, counts = machine(), measure_ceilings(), model_counts(model)
    kv_bytes_per_row = counts.kv_bytes_per_token * context
    rows = []
    for batch in (int(b) for b in batches.split(",")):
        floor_ms = 1000 * ceilings.floor_seconds(counts.forward_flops(batch, batch),
                                                 counts.total_bytes + batch * kv_bytes_per_row)
        for fast in (True, False):
            _attention(fast)
            parts = step_parts(model, batch, context, repeats)
            rows.append({"batch": batch, "attention": "fast_exp" if fast else "MLX fused", **parts,
                         "tok_s": batch / parts["step_ms"] * 1000, "floor_ms": floor_ms,
                         "of_floor": floor_ms / parts["step_ms"]})
    prompts = [encode_chat(tokenizer, build_messages(p)) for p in load_puzzles()[:n_puzzles]]
    workload = []
    for fast in (True, False, True, False):  # alternated, so drift hits both
        _attention(fast)
        result = sample(model, tokenizer, prompts, max_tokens=max_tokens, temperature=0.0, batch_size=len(prompts))
        workload.append({"attention": "fast_exp" if fast else "MLX fused", "tokens": result.stats.generated_tokens,
                         "seconds": result.stats.seconds, "tok_s": result.stats.tokens_per_second})
    _attention(fastmath.installed())
    click.echo(machine_line(info))
    click.echo(f"ceilings: {ceilings.gflops:.0f} GFLOP/s float32 GEMM, {ceilings.bandwidth_gbs:.1f} GB/s streaming; "
               f"model {model_spec}, {counts.total_bytes / 1e6:.0f} MB of weights; KV cache "
               f"{kv_bytes_per_row / 1e6:.1f} MB per sequence at {context} tokens")
    print_table(rows, [("batch", "batch", "d"), ("attention", "attention", ""), ("body_ms", "blocks ms", ".0f"),
                       ("head_ms", "head ms", ".0f"), ("logsumexp_ms", "logsumexp ms", ".0f"),
                       ("categorical_ms", "categorical ms", ".0f"), ("step_ms", "step ms", ".0f"),
                       ("tok_s", "tok/s", ".0f"), ("floor_ms", "floor ms", ".0f"), ("of_floor", "of floor", ".0%")],
                click.echo)
    click.echo(f"\nsampler, greedy, {len(prompts)} puzzle prompts in one batch, <= {max_tokens} new tokens:")
    print_table(workload, [("attention", "attention", ""), ("tokens", "tokens", "d"), ("seconds", "seconds", ".1f"),
                           ("tok_s", "tok/s", ".1f")], click.echo)
    warn_below_floor([(f"decode step at batch {r['batch']} ({r['attention']})", r["step_ms"] / 1000, r["floor_ms"] / 1000)
                      for r in rows], click.echo)
    write_result(out, {"machine": info, "ceilings": ceilings, "context": context, "steps": rows,
                       "sampler": workload})
    click.echo(f"wrote {out}")


if __name__ == "__main__":
    main()
