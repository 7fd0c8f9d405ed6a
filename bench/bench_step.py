"""Benchmark W1: one GRPO step on the reference workload, split into its phases.

SmolLM2-135M-Instruct in float32, the puzzle with the shortest prompt, G = 8, at most 128
new tokens, temperature 0.8, LoRA rank 8 on all layers, beta 0.04 (the reference forward
runs), mu = 1. One warm-up step, then the median of the timed steps. Not a test:
`python bench/bench_step.py`.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

import click

from mlx_swe_rl.blas import blas_in_use
from mlx_swe_rl.config import load_config
from mlx_swe_rl.env import CodeFixEnv
from mlx_swe_rl.prompts import build_messages
from mlx_swe_rl.puzzles import load_puzzles
from mlx_swe_rl.sampling import encode_chat
from mlx_swe_rl.scoring import Scorer
from mlx_swe_rl.trainer import build_policy, make_optimizer, run_step


@click.command()
@click.option("--model", "model_spec", default="smollm2-135m", show_default=True)
@click.option("--steps", default=3, show_default=True, help="Timed steps after one warm-up.")
@click.option("--out", default="outputs/bench_step.json", show_default=True, type=click.Path(path_type=Path))
def main(model_spec: str, steps: int, out: Path) -> None:
    import mlx.core as mx

    cfg = load_config(None, [f"model.spec={model_spec}", "model.dtype=float32", "sampling.group_size=8",
                             "sampling.max_tokens=128", "sampling.temperature=0.8", "finetune.mode=lora",
                             "finetune.lora.rank=8", "finetune.lora.num_layers=-1", "grpo.beta=0.04",
                             "grpo.num_iterations=1", "train.micro_batch_size=8", "optim.lr=1e-5",
                             f"output_dir={tempfile.mkdtemp()}"])
    policy = build_policy(cfg)
    optimizer = make_optimizer(cfg)
    puzzles = load_puzzles()
    lengths = {p.id: len(encode_chat(policy.tokenizer, build_messages(p))) for p in puzzles}
    puzzle = min(puzzles, key=lambda p: lengths[p.id])
    records = []
    with Scorer() as scorer, CodeFixEnv([puzzle], scorer) as env:
        for step in range(1, steps + 2):
            record, _ = run_step(policy, optimizer, env, [puzzle], step)
            records.append(record)
            click.echo(f"step {step}{' (warm-up)' if step == 1 else ''}: {record['step_s']:.1f}s, "
                       f"{record['completion_len']:.0f} tokens/completion, reward {record['reward_mean']:.2f}")
    timed = records[1:]
    phases = {
        "sampling": [r["sample_s"] for r in timed],
        "scoring": [r["score_s"] for r in timed],
        "log-probs + reference": [r["reference_s"] for r in timed],
        "forward/backward + update": [r["update_s"] - r["reference_s"] for r in timed],
        "whole step": [r["step_s"] for r in timed],
    }
    peak = max(r["peak_memory_gb"] for r in timed)
    click.echo(f"\nW1 on {model_spec} (float32), MLX {mx.__version__}, {mx.default_device()}, BLAS {blas_in_use()}")
    click.echo(f"prompt: {puzzle.id} ({lengths[puzzle.id]} tokens), G=8, <= 128 new tokens, T=0.8, "
               f"LoRA r=8 all layers, beta=0.04, mu=1; median of {len(timed)} steps after a warm-up")
    click.echo(f"{'phase':<27}  {'median s':>8}")
    for name, values in phases.items():
        click.echo(f"{name:<27}  {statistics.median(values):>8.2f}")
    click.echo(f"{'peak memory (MLX)':<27}  {peak:>7.2f} GB")
    click.echo("targets (issue W1): step <= 25 s, peak memory <= 2 GB")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": model_spec, "prompt": puzzle.id, "prompt_tokens": lengths[puzzle.id],
                               "phases_median_s": {k: statistics.median(v) for k, v in phases.items()},
                               "peak_memory_gb": peak, "records": records, "mlx": mx.__version__,
                               "blas": blas_in_use()}, indent=1))


if __name__ == "__main__":
    main()
