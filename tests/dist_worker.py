"""One training process for tests/test_distributed.py.

    mlx.launch --backend ring -n 2 python tests/dist_worker.py --model DIR --out DIR --run NAME:KEY=VALUE,...
    python tests/dist_worker.py ...        # the same runs on one rank, without a launcher

Rollouts are fixed: `collect_rollouts` is replaced by a function of the puzzle ids alone
(token ids, rewards, truncation), so a 1-rank and a 2-rank run see the same data whatever the
sampler would have drawn, and their updates must agree. Each `--run` is one `train` call, run
in order in this process; its KEY=VALUEs are config overrides or worker options (`OPTIONS`).
Rank 0 trains into `--out`, other ranks are given `OUT-rankR`, which must never appear (they
must not touch a run directory). `--dump DIR` writes each rank's final trainable weights and
history there. `--crash-rank/--crash-step` make that rank exit with `--crash-code` when it
reaches the step; `--hang-rank/--hang-step` make it sleep instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import mlx_swe_rl.rl.trainer as trainer  # noqa: E402  (imports mlx after the BLAS preload)
from mlx_swe_rl.rl import distributed as dist  # noqa: E402
from mlx_swe_rl.rl.rollouts import Episode, RolloutBatch  # noqa: E402
from mlx_swe_rl.env.verdict import Verdict  # noqa: E402
from mlx_swe_rl.models.sampling import Sample, SampleStats, encode_chat  # noqa: E402



class PromptEnv:
    """Prompts only: the fixed rollouts need no scorer."""

    def prompt_for(self, puzzle_id: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": puzzle_id.replace("_", " ")}]

    def stop_rule(self, puzzle_id: str) -> None:  # completions run to EOS or the limit
        return None

    def score(self, items):  # pragma: no cover - the fixed rollouts never score
        raise AssertionError("fixed rollouts are not scored")


def fixed_rollouts(model, tokenizer, env, puzzles, plan, **_):
    """G completions per puzzle that depend on the puzzle id only: random token ids of random
    length (some truncated), rewards in {0, 0.5, 1}; one puzzle in three gets equal rewards
    (a zero-variance group)."""
    group_size, max_tokens = plan.group_size, plan.max_tokens
    prompts = [encode_chat(tokenizer, env.prompt_for(p.id)) for p in puzzles]
    groups = []
    for p in puzzles:
        key = zlib.crc32(p.id.encode())
        rng = np.random.default_rng(key)
        group = []
        for _ in range(group_size):
            n = int(rng.integers(1, max_tokens + 1))
            ids = [int(i) for i in rng.integers(3, 500, size=n)]
            reward = 0.5 if key % 3 == 0 else float(rng.integers(0, 3)) / 2
            sample = Sample(0, ids, tokenizer.decode(ids), [0.0] * n, "length" if n == max_tokens else "eos")
            group.append(Episode.single(sample, Verdict(p.id, reward, reward == 1.0, None, None, {}, int(reward == 1.0), 1)))
        groups.append(group)
    generated = sum(r.sample.num_tokens for g in groups for r in g)
    stats = SampleStats(generated_tokens=generated, seconds=0.01, completions=len(puzzles) * group_size)
    return RolloutBatch(list(puzzles), prompts, groups, stats, 0.0)


def inject_faults(args) -> None:
    original = trainer.run_step

    def run_step(policy, optimizer, env, puzzles, step, *rest, **kwargs):
        if step == args.crash_step and dist.rank() == args.crash_rank:
            print(f"rank {dist.rank()}: crashing at step {step} (test)", file=sys.stderr, flush=True)
            sys.exit(args.crash_code)
        if step == args.hang_step and dist.rank() == args.hang_rank:
            print(f"rank {dist.rank()}: hanging at step {step} (test)", file=sys.stderr, flush=True)
            time.sleep(10**6)
        return original(policy, optimizer, env, puzzles, step, *rest, **kwargs)

    trainer.run_step = run_step


def dump(directory: Path, name: str, policy_params, history) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    directory.mkdir(parents=True, exist_ok=True)
    r = dist.rank()
    mx.save_safetensors(str(directory / f"{name}.rank{r}.safetensors"), dict(tree_flatten(policy_params)))
    (directory / f"{name}.rank{r}.json").write_text(json.dumps([h.to_json() for h in history]))


OPTIONS = ("optimizer", "env", "stop_after", "resume")  # per-run worker options, not config keys


def parse_run(spec: str) -> tuple[str, list[str], dict[str, str]]:
    """NAME[:KEY=VALUE,...] -> name, config overrides, worker options."""
    name, _, rest = spec.partition(":")
    sets, options = [], {}
    for item in (i for i in rest.split(",") if i):
        key, _, value = item.partition("=")
        if key in OPTIONS:
            options[key] = value
        else:
            sets.append(item)
    return name, sets, options


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True, help="output_dir of rank 0 (other ranks: OUT-rankR)")
    parser.add_argument("--run", action="append", required=True, metavar="NAME[:KEY=VALUE,...]",
                        help=f"one train call; keys are config keys or worker options {OPTIONS} "
                             "(optimizer=sgd, env=real, stop_after=N, resume=1)")
    parser.add_argument("--dump", type=Path)
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--crash-step", type=int, default=-1)
    parser.add_argument("--crash-code", type=int, default=3)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang-step", type=int, default=-1)
    args = parser.parse_args()

    import mlx.optimizers as optim

    from mlx_swe_rl.rl.config import load_config

    trainer.collect_rollouts = fixed_rollouts
    inject_faults(args)
    built = []
    original_build, original_optimizer = trainer.build_policy, trainer.make_optimizer
    trainer.build_policy = lambda cfg: built.append(original_build(cfg)) or built[-1]
    # Other ranks get an output_dir that does not exist: they must never need it (a second host).
    out = args.out if dist.rank() == 0 else f"{args.out}-rank{dist.rank()}"
    base = [f"model.spec={args.model}", f"output_dir={out}", "puzzles.tiers=[easy]", "sampling.group_size=4",
            "sampling.max_tokens=6", "grpo.beta=0.04", "finetune.mode=lora", "finetune.lora.rank=4",
            "optim.lr=0.01", "train.steps=2", "train.final_eval=false", "train.save_every=1",
            "train.micro_batch_size=2", "workers=1", "train.eval_max_tokens=2"]
    for spec in args.run:
        name, sets, options = parse_run(spec)
        cfg = load_config(None, base + [f"run_name={name}"] + sets)
        sgd = options.get("optimizer") == "sgd"
        trainer.make_optimizer = (lambda c: optim.SGD(learning_rate=c.optim.lr)) if sgd else original_optimizer
        stop_after = int(options["stop_after"]) if "stop_after" in options else None
        try:
            result = trainer.train(cfg, env=None if options.get("env") == "real" else PromptEnv(), progress=False,
                                   resume="resume" in options, stop_after=stop_after)
        except trainer.TrainingError as exc:
            print(f"Error: {exc}", file=sys.stderr, flush=True)
            return 1
        if args.dump:
            dump(args.dump, name, built[-1].model.trainable_parameters(), result.history)
    print(f"rank {dist.rank()} of {dist.size()}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
