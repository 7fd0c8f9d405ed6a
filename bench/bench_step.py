"""Benchmark W1: one GRPO step on the reference workload, split into its phases.

SmolLM2-135M-Instruct in float32, the puzzle with the shortest prompt, G = 8, at most 128
new tokens, temperature 0.8, LoRA rank 8 on all layers, beta 0.04 (the reference forward
runs), mu = 1. One warm-up step, then the median of the timed steps. Not a test:
`python bench/bench_step.py`.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import click

from common import (Ceilings, ModelCounts, machine, machine_line, measure_ceilings, model_counts, print_table,
                    warn_below_floor, write_result)
from mlx_swe_rl.rl.config import load_config
from mlx_swe_rl.env.codefix import CodeFixEnv
from mlx_swe_rl.env.prompts import build_messages
from mlx_swe_rl.puzzles.format import load_puzzles
from mlx_swe_rl.models.sampling import encode_chat
from mlx_swe_rl.sandbox.scorer import Scorer
from mlx_swe_rl.rl.trainer import build_policy, make_optimizer, run_step

# W1's targets: 1.9x ahead of TRL 1.16's 34-35 s measured back to back (issue "Throughput").
TARGETS = {"step_s": 18, "peak_memory_gb": 2}


@click.command()
@click.option("--model", "model_spec", default="smollm2-135m", show_default=True)
@click.option("--steps", default=3, show_default=True, help="Timed steps after one warm-up.")
@click.option("--full-completions", is_flag=True, help="Completions run to EOS or the limit (before the answer-end stop).")
@click.option("--out", default="outputs/bench_step.json", show_default=True, type=click.Path(path_type=Path))
def main(model_spec: str, steps: int, full_completions: bool, out: Path) -> None:
    cfg = load_config(None, [f"model.spec={model_spec}", "model.dtype=float32", "sampling.group_size=8",
                             f"sampling.stop_after_answer={'false' if full_completions else 'true'}",
                             "sampling.max_tokens=128", "sampling.temperature=0.8", "finetune.mode=lora",
                             "finetune.lora.rank=8", "finetune.lora.num_layers=-1", "grpo.beta=0.04",
                             "grpo.num_iterations=1", "train.micro_batch_size=8", "optim.lr=1e-5",
                             f"output_dir={tempfile.mkdtemp()}"])
    policy = build_policy(cfg)
    optimizer = make_optimizer(cfg)
    puzzles = load_puzzles()
    lengths_of = {p.id: len(encode_chat(policy.tokenizer, build_messages(p))) for p in puzzles}
    puzzle = min(puzzles, key=lambda p: lengths_of[p.id])
    records, lengths = [], []
    with Scorer() as scorer, CodeFixEnv([puzzle], scorer) as env:
        for step in range(1, steps + 2):
            record, rollouts = run_step(policy, optimizer, env, [puzzle], step)
            record = record.to_json() if hasattr(record, "to_json") else record  # a StepRecord since issue 48
            records.append(record)
            lengths.append([r.sample.num_tokens for group in rollouts.groups for r in group])
            click.echo(f"step {step}{' (warm-up)' if step == 1 else ''}: {record['step_s']:.1f}s, "
                       f"{record['completion_len']:.0f} tokens/completion, reward {record['reward_mean']:.2f}")
    timed, timed_lengths = records[1:], lengths[1:]
    phases = {
        "sampling": [r["sample_s"] for r in timed],
        "scoring": [r["score_s"] for r in timed],
        "log-probs + reference": [r["reference_s"] for r in timed],
        "forward/backward + update": [r["update_s"] - r["reference_s"] for r in timed],
        "whole step": [r["step_s"] for r in timed],
    }
    floors = phase_floors(model_counts(policy.model), measure_ceilings(), lengths[1:], prompt_tokens=lengths_of[puzzle.id])
    peak = max(r["peak_memory_gb"] for r in timed)
    info = machine()
    click.echo(f"\nW1 on {model_spec} (float32); {machine_line(info)}")
    click.echo(f"prompt: {puzzle.id} ({lengths_of[puzzle.id]} tokens), G=8, <= 128 new tokens, T=0.8, "
               f"LoRA r=8 all layers, beta=0.04, mu=1; median of {len(timed)} steps after a warm-up")
    rows = [{"phase": name, "median": statistics.median(values), "floor": floors.get(name),
             "x": statistics.median(values) / floors[name] if floors.get(name) else None}
            for name, values in phases.items()]
    rows.append({"phase": "peak memory (GB, MLX)", "median": peak})
    print_table(rows, [("phase", "phase", ""), ("median", "median s", ".2f"), ("floor", "floor s", ".2f"),
                       ("x", "x floor", ".1f")], click.echo)
    click.echo("floors: sampling = decode steps x max(weights / streaming rate, FLOPs / GEMM peak); "
               "forwards = 2 FLOPs per weight per token / GEMM peak; backward (frozen weights: input "
               "gradients only) = one more forward")
    warn_below_floor([(f"phase '{r['phase']}'", r["median"], r["floor"]) for r in rows if r.get("floor")], click.echo)
    step = phases_median(phases)["whole step"]
    met = step <= TARGETS["step_s"] and peak <= TARGETS["peak_memory_gb"]
    click.echo(f"targets (issue Throughput): step <= {TARGETS['step_s']} s, peak memory <= "
               f"{TARGETS['peak_memory_gb']} GB: {'met' if met else 'not met'}")
    write_result(out, {"model": model_spec, "prompt": puzzle.id, "prompt_tokens": lengths_of[puzzle.id],
                       "phases_median_s": phases_median(phases), "floors_s": floors, "peak_memory_gb": peak,
                       "targets": TARGETS, "met": met, "records": records,
                       "completion_tokens": timed_lengths, "machine": info})


def phases_median(phases: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in phases.items()}


def phase_floors(counts: ModelCounts, ceilings: Ceilings, lengths: list[list[int]], prompt_tokens: int
                 ) -> dict[str, float]:
    """The median over timed steps of each phase's floor, from that step's completion lengths."""
    per_step = []
    for step_lengths in lengths:
        group = len(step_lengths)
        decode = max(step_lengths) * ceilings.floor_seconds(counts.forward_flops(group, group), counts.total_bytes)
        prefill = counts.forward_flops(prompt_tokens, 0) / (ceilings.gflops * 1e9)
        real = sum(step_lengths)
        forward = counts.forward_flops(prompt_tokens + real, real) / (ceilings.gflops * 1e9)
        per_step.append({"sampling": prefill + decode, "log-probs + reference": forward,
                         "forward/backward + update": 2 * forward})
    floors = {k: statistics.median(s[k] for s in per_step) for k in per_step[0]}
    floors["whole step"] = sum(floors.values())
    return floors


if __name__ == "__main__":
    main()
