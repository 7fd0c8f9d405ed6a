"""Benchmark: the eval workload of the sampler (greedy, one completion per puzzle), against its floor.

Workload: the chat prompts of the bundled puzzles (112-335 tokens with SmolLM2's template),
greedy, at most `--max-tokens` new tokens, `--batch` sequences decoded together: what
`mlx-swe-rl eval` does. Prints tokens/s, the prefill and decode seconds, and the floor: every
prompt's forward at the GEMM ceiling, plus a decode that keeps the batch full and reads all
weights once per step and each sequence's KV cache once per token. Not a test:
`python bench/bench_eval_sampling.py`.

It only uses APIs that older trees have too, so a before/after on the same machine is
`PYTHONPATH=<other checkout> python bench/bench_eval_sampling.py --label before`.
"""

from __future__ import annotations

import inspect
import math
import statistics
from pathlib import Path

import click

from common import machine, machine_line, measure_ceilings, model_counts, print_table, warn_below_floor, write_result
import mlx_swe_rl
from mlx_swe_rl.env.prompts import build_messages
from mlx_swe_rl.models.sampling import encode_chat, sample
from mlx_swe_rl.models.specs import load_model
from mlx_swe_rl.puzzles.format import load_puzzles


@click.command()
@click.option("--model", "model_spec", default="smollm2-135m", show_default=True)
@click.option("--puzzles", "n_puzzles", default=0, show_default=True, help="First N bundled puzzles (0: all).")
@click.option("--batch", default=32, show_default=True, help="Sequences decoded together.")
@click.option("--max-tokens", default=256, show_default=True)
@click.option("--repeats", default=1, show_default=True, help="Timed runs (median), after a short warm-up.")
@click.option("--label", default="", help="Names this run in the output (e.g. the tree measured).")
@click.option("--stop-after-answer", is_flag=True, help="End completions at the answer's closing fence, as eval does "
                                                         "by default since the answer-end stop.")
@click.option("--out", default="outputs/bench/eval_sampling.json", show_default=True, type=click.Path(path_type=Path))
def main(model_spec: str, n_puzzles: int, batch: int, max_tokens: int, repeats: int, label: str,
         stop_after_answer: bool, out: Path) -> None:
    model, tokenizer = load_model(model_spec, dtype="float32")
    puzzles = load_puzzles()[:n_puzzles or None]
    prompts = [encode_chat(tokenizer, build_messages(p)) for p in puzzles]
    # Trees without the option always computed log-probabilities; eval does not need them.
    extra = {"logprobs": False} if "logprobs" in inspect.signature(sample).parameters else {}
    if stop_after_answer:  # only on trees that have it
        from mlx_swe_rl.env.prompts import AnswerEnd

        extra["stop"] = [AnswerEnd(p.entry_point) for p in puzzles]

    def run():
        return sample(model, tokenizer, prompts, max_tokens=max_tokens, temperature=0.0, batch_size=batch, **extra)

    sample(model, tokenizer, prompts[:2], max_tokens=8, temperature=0.0,
           **{k: v[:2] if k == "stop" else v for k, v in extra.items()})  # warm-up
    runs = [run() for _ in range(repeats)]
    seconds = statistics.median(r.stats.seconds for r in runs)
    result = min(runs, key=lambda r: abs(r.stats.seconds - seconds))
    stats = result.stats
    lengths = [(len(prompts[s.prompt_index]), s.num_tokens) for g in result.groups for s in g]

    info, ceilings, counts = machine(), measure_ceilings(), model_counts(model)
    generated = sum(n for _, n in lengths)
    prefill_floor = ceilings.floor_seconds(sum(counts.forward_flops(p - 1, 0) for p, _ in lengths),
                                           len(lengths) * counts.total_bytes)  # one prefill per prompt (G = 1)
    steps = max(math.ceil(generated / batch), max(n for _, n in lengths))
    kv_reads = counts.kv_bytes_per_token * sum(n * p + n * (n - 1) / 2 for p, n in lengths)
    decode_floor = ceilings.floor_seconds(counts.forward_flops(generated, generated),
                                          steps * counts.total_bytes + kv_reads)
    prefill_s = getattr(stats, "prefill_seconds", None)  # older trees do not split it out
    rows = [{"what": "whole run", "seconds": stats.seconds, "floor_s": prefill_floor + decode_floor}]
    if prefill_s is not None:
        rows += [{"what": "prefill", "seconds": prefill_s, "floor_s": prefill_floor},
                 {"what": "decode", "seconds": stats.seconds - prefill_s, "floor_s": decode_floor}]
    for row in rows:
        row["of_floor"] = row["floor_s"] / row["seconds"]
    tok_s, floor_tok_s = generated / stats.seconds, generated / (prefill_floor + decode_floor)
    click.echo(machine_line(info))
    click.echo(f"ceilings: {ceilings.gflops:.0f} GFLOP/s float32 GEMM, {ceilings.bandwidth_gbs:.1f} GB/s streaming; "
               f"tree {Path(mlx_swe_rl.__file__).parent.parent}{f' ({label})' if label else ''}")
    click.echo(f"eval workload: {len(prompts)} prompts ({min(p for p, _ in lengths)}-{max(p for p, _ in lengths)} "
               f"tokens), greedy, <= {max_tokens} new tokens, batch {batch}"
               f"{', ending at the answer' if stop_after_answer else ''}; median of {repeats}")
    print_table(rows, [("what", "phase", ""), ("seconds", "seconds", ".1f"), ("floor_s", "floor s", ".1f"),
                       ("of_floor", "of floor", ".0%")], click.echo)
    click.echo(f"{generated} tokens: {tok_s:.1f} tokens/s (floor {floor_tok_s:.0f}: prefill at the GEMM ceiling, "
               f"a full batch every step, each weight and KV entry read once per step)")
    warn_below_floor([(r["what"], r["seconds"], r["floor_s"]) for r in rows], click.echo)
    write_result(out, {"model": model_spec, "label": label, "prompts": len(prompts), "batch": batch,
                       "stop_after_answer": stop_after_answer,
                       "max_tokens": max_tokens, "runs_seconds": [r.stats.seconds for r in runs],
                       "generated_tokens": generated, "tokens_per_second": tok_s, "seconds": stats.seconds,
                       "prefill_seconds": prefill_s, "floor_seconds": {"prefill": prefill_floor, "decode": decode_floor},
                       "floor_tokens_per_second": floor_tok_s, "ceilings": ceilings, "machine": info})


if __name__ == "__main__":
    main()
