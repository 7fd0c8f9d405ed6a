"""Rollouts: sample G completions per puzzle from a policy and score them with the one scorer.

Training, evaluation and calibration all collect rollouts through `collect_rollouts`, so the
prompt, the sampler and the verdict are the same everywhere.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..env.codefix import CodeFixEnv
from ..puzzles.format import Puzzle
from ..models.sampling import Sample, SampleStats, encode_chat, sample

ALL_SOLVED, MIXED, ALL_FAILED = "all-solved", "mixed", "all-failed"


@dataclass
class Rollout:
    """One scored completion of one puzzle."""

    puzzle_id: str
    sample: Sample
    reward: float
    solved: bool  # as the env decided it (info["solved"])
    info: dict[str, Any]

    def record(self) -> dict[str, Any]:
        """A JSON-ready dict: the completion, extracted code, test results and reward."""
        s = self.sample
        return {
            "text": s.text,
            "num_tokens": s.num_tokens,
            "truncated": s.truncated,
            "finish": s.finish,
            "code": self.info["code"],
            "format_ok": self.info["format_ok"],
            "format_error": self.info.get("format_error"),
            "reward": self.reward,
            "reward_parts": self.info["reward_parts"],
            "solved": self.solved,
            "passed": self.info["passed"],
            "total": self.info["total"],
            "tests": self.info["tests"],
        }

    def summary(self) -> dict[str, Any]:
        """The compact line the trainer appends to rollouts.jsonl for each completion: reward,
        text, extracted code (None when the response held none) and one short outcome per test,
        so a run can be read back (`mlx-swe-rl watch`) without rerunning anything."""
        return {
            "puzzle_id": self.puzzle_id,
            "reward": self.reward,
            "solved": self.solved,
            "completion": self.sample.text,
            "tokens": self.sample.num_tokens,
            "truncated": self.sample.truncated,
            "code": self.info.get("code"),
            "tests": [{"status": t["status"], "detail": _clip(t.get("message", ""), DETAIL_CHARS)}
                      for t in self.info.get("tests", [])],
        }


DETAIL_CHARS = 200  # per test in rollouts.jsonl: enough for "expected X, got Y", not a traceback


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass
class RolloutBatch:
    """`groups[i]` holds the rollouts of `puzzles[i]`."""

    puzzles: list[Puzzle]
    prompts: list[list[int]]
    groups: list[list[Rollout]]
    stats: SampleStats
    score_seconds: float = 0.0


def collect_rollouts(
    model: Any,
    tokenizer: Any,
    env: CodeFixEnv,  # or any object with the same prompt_for / score methods
    puzzles: list[Puzzle],
    *,
    group_size: int,
    temperature: float,
    max_tokens: int,
    top_p: float = 1.0,
    seed: int | None = 0,
    batch_size: int = 32,
    stop_after_answer: bool = True,
    progress: bool = False,
    desc: str = "sampling",
) -> RolloutBatch:
    """Sample `group_size` completions for each puzzle in one batch, then score them all. With
    `stop_after_answer` a completion ends where its answer does (`CodeFixEnv.stop_rule`)."""
    prompts = encode_prompts(tokenizer, env, puzzles)
    result = sample(model, tokenizer, prompts, group_size=group_size, max_tokens=max_tokens,
                    temperature=temperature, top_p=top_p, seed=seed, batch_size=batch_size,
                    stop=stop_rules(env, puzzles, stop_after_answer),
                    logprobs=False, progress=progress, desc=desc)  # rewards and the loss never read them
    start = time.perf_counter()
    rollouts = score_samples(env, [(p, s) for p, group in zip(puzzles, result.groups) for s in group])
    score_seconds = time.perf_counter() - start
    groups = [rollouts[i * group_size:(i + 1) * group_size] for i in range(len(puzzles))]
    return RolloutBatch(puzzles, prompts, groups, result.stats, score_seconds)


def encode_prompts(tokenizer: Any, env: CodeFixEnv, puzzles: list[Puzzle]) -> list[list[int]]:
    """The chat prompt token ids of each puzzle, as the sampler gets them."""
    return [encode_chat(tokenizer, env.prompt_for(p.id)) for p in puzzles]


def stop_rules(env: CodeFixEnv, puzzles: list[Puzzle], stop_after_answer: bool) -> list[Any] | None:
    """The sampler's stop rule of each puzzle, or None to let completions run to EOS or the limit."""
    return [env.stop_rule(p.id) for p in puzzles] if stop_after_answer else None


def score_samples(env: CodeFixEnv, pairs: list[tuple[Puzzle, Sample]]) -> list[Rollout]:
    """Score (puzzle, completion) pairs in one scorer call, as rollouts in the same order."""
    scored = env.score([(p.id, s.text) for p, s in pairs]) if pairs else []
    return [Rollout(p.id, s, reward, info["solved"], info)
            for (p, s), (reward, info) in zip(pairs, scored)]


def category(group: list[Rollout]) -> str:
    """all-solved / mixed / all-failed: only mixed groups give GRPO a learning signal."""
    solved = sum(r.solved for r in group)
    if solved == len(group):
        return ALL_SOLVED
    return MIXED if solved else ALL_FAILED
