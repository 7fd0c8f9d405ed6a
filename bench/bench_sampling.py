"""Benchmark: our batched sampler against a direct `mlx_lm.batch_generate` on the same prompts.

Workload: the chat prompts of the first N puzzles, G completions each, temperature T, up to
M new tokens, same seed for both. Runs alternate (ours, direct) to share any machine drift;
the median tokens/s of each is reported. Not a test: `python bench/bench_sampling.py`.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import click

from common import (machine, machine_line, measure_ceilings, model_counts, print_table, warn_below_floor,
                    write_result)
from mlx_swe_rl.models.specs import load_model
from mlx_swe_rl.env.prompts import build_messages
from mlx_swe_rl.puzzles.format import load_puzzles
from mlx_swe_rl.models.sampling import encode_chat, make_sampler_fn, sample


@click.command()
@click.option("--model", "model_spec", default="smollm2-135m", show_default=True)
@click.option("--dtype", default="float32", show_default=True)
@click.option("--puzzles", "n_puzzles", default=2, show_default=True)
@click.option("-G", "--group-size", default=8, show_default=True)
@click.option("--max-tokens", default=128, show_default=True)
@click.option("--temperature", default=0.8, show_default=True)
@click.option("--repeats", default=3, show_default=True)
@click.option("--prefill-tokens", default=600, show_default=True, help="Prompt length of the prefill test.")
@click.option("--out", default="outputs/bench_sampling.json", show_default=True, type=click.Path(path_type=Path))
def main(model_spec: str, dtype: str, n_puzzles: int, group_size: int, max_tokens: int, temperature: float,
         repeats: int, prefill_tokens: int, out: Path) -> None:
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

    # Prefill: one long prompt, G completions of one token each, so the prompt dominates.
    long_prompt = long_prompt_tokens(tokenizer, prefill_tokens)
    prefill_s = {}
    for share in (True, False):
        timings = []
        for _ in range(repeats + 1):
            result = sample(model, tokenizer, [long_prompt], group_size=group_size, max_tokens=1,
                            temperature=temperature, seed=0, share_prefix=share)
            timings.append(result.stats.seconds)
        prefill_s[share] = statistics.median(timings[1:])

    info, ceilings, counts = machine(), measure_ceilings(), model_counts(model)
    # Decoding reads every weight once per step for the whole batch; per-token compute is
    # 2 FLOPs per weight. The floor rate is batch / (time of one step at the ceiling).
    batch = len(flat)
    step_floor = ceilings.floor_seconds(counts.forward_flops(batch, batch), counts.total_bytes)
    floor_rate = batch / step_floor
    rows = []
    for name, label in (("ours", "sample, prefix shared"), ("ours_unshared", "sample, no sharing"),
                        ("direct", "mlx_lm.batch_generate")):
        rows.append({"what": label, "tokens": statistics.median(t for t, _ in runs[name]),
                     "seconds": statistics.median(s for _, s in runs[name]), "rate": rates[name],
                     "floor": f"{floor_rate:.0f} tok/s", "vs": rates[name] / floor_rate,
                     "floor_s": statistics.median(t for t, _ in runs[name]) / floor_rate})
    prefill_flops = counts.forward_flops(len(long_prompt), 1)
    for share in (True, False):
        copies = 1 if share else group_size
        floor = ceilings.floor_seconds(copies * prefill_flops, counts.total_bytes)
        rows.append({"what": f"prefill {len(long_prompt)} tok x G={group_size}, {'shared' if share else 'not shared'}",
                     "seconds": prefill_s[share], "floor": f"{floor:.2f} s", "vs": floor / prefill_s[share],
                     "floor_s": floor})
    click.echo(machine_line(info))
    click.echo(f"ceilings: {ceilings.gflops:.0f} GFLOP/s float32 GEMM, {ceilings.bandwidth_gbs:.1f} GB/s streaming")
    click.echo(f"model {model_spec} ({dtype}), {counts.total_bytes / 1e6:.0f} MB of weights; decode workload: "
               f"{len(prompts)} prompts x G={group_size}, <= {max_tokens} new tokens, T={temperature}")
    print_table(rows, [("what", "sampler", ""), ("tokens", "tokens", ".0f"), ("seconds", "seconds", ".2f"),
                       ("rate", "tokens/s", ".1f"), ("floor", "floor", ""), ("vs", "of floor", ".0%")], click.echo)
    click.echo(f"sampler overhead, no sharing vs direct: {gap:+.1%} (target: within 5%); "
               f"prefix sharing vs direct: {rates['ours'] / rates['direct'] - 1:+.1%}; "
               f"prefill shared vs not: {prefill_s[False] / prefill_s[True]:.1f}x faster")
    click.echo("floor: decoding is memory-bound (all weights read per step); prefill is compute-bound")
    warn_below_floor([(r["what"], r["seconds"], r["floor_s"]) for r in rows], click.echo)
    write_result(out, {"model": model_spec, "dtype": dtype, "prompts": len(prompts), "group_size": group_size,
                       "max_tokens": max_tokens, "temperature": temperature, "runs": runs,
                       "tokens_per_second": rates, "gap": gap, "prefill_tokens": len(long_prompt),
                       "prefill_seconds": {"shared": prefill_s[True], "not_shared": prefill_s[False]},
                       "floor_tokens_per_second": floor_rate, "ceilings": ceilings, "machine": info, "rows": rows})


def long_prompt_tokens(tokenizer, n: int) -> list[int]:
    """A chat prompt of exactly `n` tokens: puzzle prompts joined until long enough, then cut."""
    text, puzzles = "", load_puzzles()
    for puzzle in puzzles:
        text += build_messages(puzzle)[-1]["content"] + "\n"
        if len(encode_chat(tokenizer, [{"role": "user", "content": text}])) >= n:
            break
    return encode_chat(tokenizer, [{"role": "user", "content": text}])[:n]


if __name__ == "__main__":
    main()
