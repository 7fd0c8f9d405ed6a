"""Benchmark: our batched sampler against a direct `mlx_lm.batch_generate` on the same prompts.

Workload: the chat prompts of the first N puzzles, G completions each, temperature T, up to
M new tokens, same seed for both. Runs alternate (ours, direct) to share any machine drift;
the median tokens/s of each is reported. Not a test: `python bench/bench_sampling.py`.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import click

from mlx_swe_rl.blas import blas_in_use
from mlx_swe_rl.models import load_model
from mlx_swe_rl.prompts import build_messages
from mlx_swe_rl.puzzles import load_puzzles
from mlx_swe_rl.sampling import encode_chat, make_sampler_fn, sample


@click.command()
@click.option("--model", "model_spec", default="smollm2-135m", show_default=True)
@click.option("--dtype", default="float32", show_default=True)
@click.option("--puzzles", "n_puzzles", default=2, show_default=True)
@click.option("-G", "--group-size", default=8, show_default=True)
@click.option("--max-tokens", default=128, show_default=True)
@click.option("--temperature", default=0.8, show_default=True)
@click.option("--repeats", default=3, show_default=True)
@click.option("--out", default="outputs/bench_sampling.json", show_default=True, type=click.Path(path_type=Path))
def main(model_spec: str, dtype: str, n_puzzles: int, group_size: int, max_tokens: int, temperature: float,
         repeats: int, out: Path) -> None:
    import mlx.core as mx
    from mlx_lm import batch_generate

    model, tokenizer = load_model(model_spec, dtype=dtype)
    prompts = [encode_chat(tokenizer, build_messages(p)) for p in load_puzzles()[:n_puzzles]]
    flat = [p for p in prompts for _ in range(group_size)]

    def ours(share_prefix: bool = True) -> tuple[int, float]:
        result = sample(model, tokenizer, prompts, group_size=group_size, max_tokens=max_tokens,
                        temperature=temperature, seed=0, share_prefix=share_prefix)
        return result.stats.generated_tokens, result.stats.seconds

    def ours_unshared() -> tuple[int, float]:
        return ours(share_prefix=False)

    def direct() -> tuple[int, float]:
        mx.random.seed(0)
        start = time.perf_counter()
        response = batch_generate(model, tokenizer, flat, max_tokens=max_tokens,
                                  sampler=make_sampler_fn(temperature), return_token_ids=True,
                                  return_logprobs=True)
        seconds = time.perf_counter() - start
        # batch_generate drops each stopping EOS; count it as generated, as our sampler does.
        stopped = sum(len(ids) < max_tokens for ids in response.token_ids)
        return sum(len(ids) for ids in response.token_ids) + stopped, seconds

    variants = {"ours": ours, "ours_unshared": ours_unshared, "direct": direct}
    for run in variants.values():
        run()  # warm-up
    runs: dict[str, list[tuple[int, float]]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, run in variants.items():
            runs[name].append(run())
    rates = {k: statistics.median(t / s for t, s in v) for k, v in runs.items()}
    gap = rates["ours_unshared"] / rates["direct"] - 1
    click.echo(f"model {model_spec} ({dtype}), {mx.__version__=}, device {mx.default_device()}, BLAS {blas_in_use()}")
    click.echo(f"workload: {len(prompts)} prompts x G={group_size}, <= {max_tokens} new tokens, T={temperature}")
    click.echo(f"{'sampler':<24}  {'tokens':>6}  {'seconds (median)':>16}  {'tokens/s':>8}")
    for name, label in (("ours", "sample (prefix shared)"), ("ours_unshared", "sample (no sharing)"),
                        ("direct", "mlx_lm.batch_generate")):
        tokens = statistics.median(t for t, _ in runs[name])
        seconds = statistics.median(s for _, s in runs[name])
        click.echo(f"{label:<24}  {tokens:>6.0f}  {seconds:>16.2f}  {rates[name]:>8.1f}")
    click.echo(f"sampler overhead, no sharing vs direct: {gap:+.1%} (target: within 5%); "
               f"prefix sharing vs direct: {rates['ours'] / rates['direct'] - 1:+.1%}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": model_spec, "dtype": dtype, "prompts": len(prompts),
                               "group_size": group_size, "max_tokens": max_tokens, "temperature": temperature,
                               "runs": runs, "tokens_per_second": rates, "gap": gap,
                               "mlx": mx.__version__, "blas": blas_in_use()}, indent=1))


if __name__ == "__main__":
    main()
