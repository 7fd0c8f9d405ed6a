"""The update phase of one GRPO step alone: the reference forward, the policy's forward/backward
and the optimizer, on fixed completions. Not a test:

    python bench/bench_update.py [--config configs/grpo.yaml] [--set KEY=VALUE ...] [--lengths 384,200,...]

The step's groups are the config's first `train.puzzles_per_step` training puzzles (by id) with
their real chat prompts, each followed by `sampling.group_size` completions of seeded random
token ids, with lengths cycling through `--lengths` (default: the `sampling.max_tokens` limit for
all, the preflight's worst case) and advantages +1 / -1, so every group enters the loss. No
sampling and no scoring, so a before/after of a change to the update (e.g.
`finetune.lora.num_layers`, `train.micro_batch_size`, or another tree on PYTHONPATH) times only
what it changes. It prints the update's seconds (reference forward, forward/backward and
optimizer), the MLX peak and the memory preflight's estimate of the update.

The completions are not text the model would write: the figures are of the arithmetic, not of
the loss values.
"""

from __future__ import annotations

from mlx_swe_rl.blas import blas_in_use  # noqa: F401  (first: loads OpenBLAS before MLX)

import random
import tempfile
import time
from pathlib import Path

import click
import mlx.core as mx

from common import machine, machine_line, write_result
from mlx_swe_rl.env.prompts import build_messages
from mlx_swe_rl.models.sampling import encode_chat
from mlx_swe_rl.rl.config import load_config
from mlx_swe_rl.rl.trainer import LossGroup, build_policy, make_optimizer, run_updates, training_puzzles


def fixed_groups(tokenizer, puzzles: list, style, group_size: int, lengths: list[int], vocab: int,
                 seed: int = 0) -> list[LossGroup]:
    """One LossGroup per puzzle: its chat prompt, `group_size` random completions with lengths
    cycling through `lengths`, advantages alternating +1 / -1 and seq-mean-token-mean weights."""
    rng = random.Random(seed)
    groups = []
    for puzzle in puzzles:
        prompt = encode_chat(tokenizer, build_messages(puzzle, style))
        sizes = [lengths[i % len(lengths)] for i in range(group_size)]
        completions = [[rng.randrange(vocab) for _ in range(n)] for n in sizes]
        groups.append(LossGroup(prompt, completions, [[1.0] * n for n in sizes],
                                [1.0 if i % 2 == 0 else -1.0 for i in range(group_size)],
                                [1.0 / (len(puzzles) * group_size * n) for n in sizes],
                                [1.0 / (len(puzzles) * group_size)] * group_size))
    return groups


@click.command()
@click.option("--config", "config_path", default="configs/grpo.yaml", show_default=True,
              type=click.Path(path_type=Path, exists=True))
@click.option("--set", "overrides", multiple=True, help="KEY=VALUE, as `train --set`.")
@click.option("--lengths", default="", help="Comma-separated completion lengths, cycled over each group "
              "(default: all at sampling.max_tokens).")
@click.option("--repeats", default=2, show_default=True, help="Updates timed after one warm-up update.")
@click.option("--out", default="outputs/bench_update.json", show_default=True, type=click.Path(path_type=Path))
def main(config_path: Path, overrides: tuple[str, ...], lengths: str, repeats: int, out: Path) -> None:
    cfg = load_config(config_path, ["model.spec=qwen2.5-coder-1.5b", *overrides, f"output_dir={tempfile.mkdtemp()}"])
    puzzles = sorted(training_puzzles(cfg), key=lambda p: p.id)[:cfg.train.puzzles_per_step]
    sizes = [int(s) for s in lengths.split(",") if s.strip()] or [cfg.sampling.max_tokens]
    policy = build_policy(cfg)
    vocab = policy.model.model.embed_tokens.weight.shape[0]
    groups = fixed_groups(policy.tokenizer, puzzles, cfg.prompt.style(), cfg.sampling.group_size, sizes, vocab)
    optimizer = make_optimizer(cfg)
    runs = []
    for i in range(repeats + 1):  # the first is the warm-up (and allocates AdamW's state)
        mx.clear_cache()
        mx.reset_peak_memory()
        start = time.perf_counter()
        stats = run_updates(policy, optimizer, groups)
        seconds = time.perf_counter() - start
        if i:
            runs.append({"update_s": seconds, "reference_s": stats["reference_s"],
                         "optimizer_s": stats.get("optimizer_s", 0.0), "peak_memory_gb": mx.get_peak_memory() / 1e9})
    best = min(runs, key=lambda r: r["update_s"])
    from mlx_swe_rl.rl.memory import estimate, plan

    shape, work = plan(cfg, puzzles, [])
    estimated = estimate(shape, work).phases["update"] / 1e9
    info = machine()
    prompts = [len(encode_chat(policy.tokenizer, build_messages(p, cfg.prompt.style()))) for p in puzzles]
    click.echo(f"\nthe update of {config_path} on {cfg.model.spec} ({cfg.model.dtype}); {machine_line(info)}")
    click.echo(f"{len(groups)} groups (prompts of {', '.join(map(str, prompts))} tokens) x G = "
               f"{cfg.sampling.group_size}, completion lengths {sizes}; micro-batch {cfg.train.micro_batch_size}, "
               f"LoRA layers {cfg.finetune.lora.num_layers}, beta {cfg.grpo.beta}")
    for r in runs:
        click.echo(f"update {r['update_s']:.1f}s: reference forward {r['reference_s']:.1f}s, forward/backward "
                   f"{r['update_s'] - r['reference_s'] - r['optimizer_s']:.1f}s, optimizer {r['optimizer_s']:.1f}s; "
                   f"MLX peak {r['peak_memory_gb']:.2f} GB")
    click.echo(f"best {best['update_s']:.1f}s; MLX peak {max(r['peak_memory_gb'] for r in runs):.2f} GB against the "
               f"preflight's {estimated:.2f} GB for the update")
    write_result(out, {"config": str(config_path), "overrides": list(overrides), "model": cfg.model.spec,
                       "dtype": cfg.model.dtype, "puzzles": [p.id for p in puzzles], "prompt_tokens": prompts,
                       "lengths": sizes, "runs": runs, "best": best, "preflight_update_gb": estimated,
                       "machine": info}, click.echo)


if __name__ == "__main__":
    main()
