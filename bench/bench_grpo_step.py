"""One GRPO step of a training config (default: configs/grpo.yaml on the built-in
Qwen2.5-Coder-1.5B, `qwen2.5-coder-1.5b`, float32 on a CPU), by phase. Not a test:

    python bench/bench_grpo_step.py [--set KEY=VALUE ...] [--micro-batches 2,4,8]

The step runs on the config's first `train.puzzles_per_step` training puzzles (by id, so every
process draws the same rollouts from the same seed) and prints sampling (with its prompt
prefill), scoring, the reference forward, the policy's forward/backward and the optimizer, and
the MLX peak beside the memory preflight's estimate. With --micro-batches, the step's update is
then timed again from the same starting weights at each micro-batch size, alternated in this
process (`--rounds` times): the same rollouts, so only the update's batching differs.

It runs against whatever mlx_swe_rl is on the path (PYTHONPATH=OTHER_TREE for a before/after of
two trees as whole processes) and reads only the step record's keys that both trees write.
"""

from __future__ import annotations

from mlx_swe_rl.blas import blas_in_use  # noqa: F401  (first: loads OpenBLAS before MLX)

import copy
import tempfile
import time
from pathlib import Path

import click
import mlx.core as mx
from mlx.utils import tree_flatten

from common import machine, machine_line, print_table, write_result
from mlx_swe_rl.rl.config import load_config
from mlx_swe_rl.rl.trainer import build_policy, loss_inputs, make_optimizer, run_step, run_updates, training_puzzles


def phases_of(record: dict) -> dict[str, float | None]:
    """The step record's phases in seconds (None where this tree does not record one)."""
    update = record["update_s"]
    optimizer = record.get("optimizer_s")
    return {
        "sampling": record["sample_s"],
        "  of which prompt prefill": record.get("prefill_s"),
        "scoring": record["score_s"],
        "reference forward": record["reference_s"],
        "policy forward/backward": update - record["reference_s"] - (optimizer or 0.0),
        "optimizer": optimizer,
        "update (reference + fwd/bwd + optimizer)": update,
        "whole step": record["step_s"],
    }


def preflight(cfg, puzzles: list) -> dict[str, float]:
    """The memory preflight's estimate (GB) of each phase of a run of `cfg` on `puzzles`
    (`rl.memory`: an upper bound, every completion at the token limit)."""
    from mlx_swe_rl.rl.memory import estimate, plan

    shape, work = plan(cfg, puzzles, [])
    return {phase: value / 1e9 for phase, value in estimate(shape, work).phases.items()}


@click.command()
@click.option("--config", "config_path", default="configs/grpo.yaml", show_default=True,
              type=click.Path(path_type=Path, exists=True))
@click.option("--set", "overrides", multiple=True, help="KEY=VALUE, as `train --set`.")
@click.option("--micro-batches", default="", help="Comma-separated micro-batch sizes to time the update at.")
@click.option("--rounds", default=1, show_default=True, help="Alternations of the --micro-batches sizes.")
@click.option("--out", default="outputs/bench_grpo_step.json", show_default=True, type=click.Path(path_type=Path))
def main(config_path: Path, overrides: tuple[str, ...], micro_batches: str, rounds: int, out: Path) -> None:
    cfg = load_config(config_path, ["model.spec=qwen2.5-coder-1.5b", *overrides,
                                    f"output_dir={tempfile.mkdtemp()}"])
    puzzles = sorted(training_puzzles(cfg), key=lambda p: p.id)[:cfg.train.puzzles_per_step]
    policy = build_policy(cfg)
    optimizer = make_optimizer(cfg)
    start_weights = dict(tree_flatten(policy.model.trainable_parameters()))
    start_weights = {k: mx.array(v) for k, v in start_weights.items()}
    from mlx_swe_rl.env.codefix import CodeFixEnv
    from mlx_swe_rl.sandbox.scorer import Scorer

    style = cfg.prompt.style() if hasattr(cfg.prompt, "style") else None
    with Scorer() as scorer, CodeFixEnv(puzzles, scorer, cfg.reward, cfg.prompt.format,
                                        **({"style": style} if style else {})) as env:
        record, rollouts = run_step(policy, optimizer, env, puzzles, 1)
    record = record.to_json() if hasattr(record, "to_json") else record  # a StepRecord since issue 48: its JSON line
    info = machine()
    click.echo(f"\none step of {config_path} on {cfg.model.spec} ({cfg.model.dtype}); {machine_line(info)}")
    click.echo(f"puzzles: {', '.join(p.id for p in puzzles)}; G={cfg.sampling.group_size}, <= "
               f"{cfg.sampling.max_tokens} new tokens, micro-batch {cfg.train.micro_batch_size}, "
               f"LoRA layers {cfg.finetune.lora.num_layers}, beta {cfg.grpo.beta}"
               + (f", prompt {style.template}/{style.system}" if style else ""))
    click.echo(f"sampled {record['sampled_tokens']} tokens ({record['completion_len']:.1f} per completion), "
               f"reward {record['reward_mean']:.3f}, {record['groups_kept']} of {record['groups_sampled']} groups "
               "in the loss")
    phases = phases_of(record)
    print_table([{"phase": k, "s": v} for k, v in phases.items() if v is not None],
                [("phase", "phase", ""), ("s", "seconds", ".1f")], click.echo)
    estimate = preflight(cfg, puzzles)
    click.echo(f"MLX peak {record['peak_memory_gb']:.2f} GB; the preflight's estimates (every completion at the "
               "limit): " + ", ".join(f"{k} {v:.2f} GB" for k, v in estimate.items()))

    sweep: dict[int, list[dict[str, float]]] = {}
    sizes = [int(s) for s in micro_batches.split(",") if s.strip()]
    groups, _ = loss_inputs(rollouts, cfg)
    for _ in range(rounds if sizes else 0):
        for size in sizes:
            policy.model.update(_unflatten(start_weights))
            timed = copy.deepcopy(cfg)
            timed.train.micro_batch_size = size
            policy.config = timed
            mx.clear_cache()
            mx.reset_peak_memory()
            begin = time.perf_counter()
            stats = run_updates(policy, make_optimizer(timed), groups)
            sweep.setdefault(size, []).append({"update_s": time.perf_counter() - begin,
                                               "reference_s": stats["reference_s"],
                                               "peak_memory_gb": mx.get_peak_memory() / 1e9,
                                               "loss": stats["loss"], "kl": stats.get("kl")})
            click.echo(f"micro-batch {size}: update {sweep[size][-1]['update_s']:.1f}s (reference "
                       f"{stats['reference_s']:.1f}s), MLX peak {sweep[size][-1]['peak_memory_gb']:.2f} GB, "
                       f"loss {stats['loss']:.6f}")
    write_result(out, {"config": str(config_path), "overrides": list(overrides), "model": cfg.model.spec,
                       "dtype": cfg.model.dtype, "puzzles": [p.id for p in puzzles], "phases_s": phases,
                       "peak_memory_gb": record["peak_memory_gb"], "preflight_gb": estimate, "record": record,
                       "micro_batch_sweep": {str(k): v for k, v in sweep.items()}, "machine": info}, click.echo)


def _unflatten(flat: dict[str, mx.array]) -> dict:
    from mlx.utils import tree_unflatten

    return tree_unflatten(list(flat.items()))


if __name__ == "__main__":
    main()
