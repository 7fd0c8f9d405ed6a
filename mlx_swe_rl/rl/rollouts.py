"""Rollouts: sample G completions per puzzle from a policy and score them with the one scorer.

Training, evaluation and calibration all collect rollouts through `collect_rollouts`, so the
prompt, the sampler and the verdict are the same everywhere. A rollout is an episode: one turn
(the completion, scored), or with `max_turns` > 1 up to that many, each later turn answering
the feedback on the previous one (multi-turn repair). Its tokens after the prompt are the
model's completions and the bridges between them, exactly as sampled (`Episode.sequence`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..env.codefix import CodeFixEnv
from ..env.verdict import Verdict
from ..puzzles.format import Puzzle
from ..models.chat import ChatFrame, render
from ..models.sampling import EOS, Engine, Request, Sample, SampleStats, encode_chat
from ..stopping import StopRule
from .config import SamplingPlan

ALL_SOLVED, MIXED, ALL_FAILED = "all-solved", "mixed", "all-failed"


@dataclass
class Turn:
    """One answer of an episode: the completion, the env's verdict on it (with a test split,
    the public-test outcome and the feedback too) and the ids that followed it (the bridge to
    the next turn: its own end, the feedback as a user turn, the assistant header; none after
    the last turn)."""

    sample: Sample
    verdict: Verdict
    bridge: list[int] = field(default_factory=list)

    @property
    def reward(self) -> float:
        return self.verdict.reward

    def record(self) -> dict[str, Any]:
        """The turn as JSON, the same keys in evaluation reports and rollouts.jsonl."""
        s, v = self.sample, self.verdict
        return {"text": s.text, "num_tokens": s.num_tokens, "finish": s.finish,
                "code": v.code, "public_ok": v.public_ok, "public_passed": v.public_passed,
                "solved": v.solved, "reward": v.reward,
                "feedback": v.feedback if self.bridge else None,
                **({"error": _clip(v.error, ERROR_CHARS)} if v.error else {})}


@dataclass
class Episode:
    """One scored episode of one puzzle, always made of turns: one for a single-turn rollout, up
    to `max_turns` in multi-turn repair. `reward` and `solved` are its final verdict (the last
    answer's, less the turn penalty); `verdict` is the last answer's. `dropped`: not to be
    trained on (its ids did not match what the chat template renders)."""

    puzzle_id: str
    turns: list[Turn]
    reward: float
    solved: bool  # as the env decided it for the last answer (its verdict's)
    dropped: bool = False

    @classmethod
    def single(cls, sample: Sample, verdict: Verdict) -> Episode:
        """An episode of one answer, scored."""
        return cls(verdict.puzzle_id, [Turn(sample, verdict)], verdict.reward, verdict.solved)

    @property
    def sample(self) -> Sample:
        """The last answer."""
        return self.turns[-1].sample

    @property
    def verdict(self) -> Verdict:
        """The env's verdict on the last answer."""
        return self.turns[-1].verdict

    @property
    def error(self) -> str | None:
        """Why its puzzle could not be scored (an error verdict: reward 0), else None."""
        return self.verdict.error

    @property
    def model_tokens(self) -> int:
        """The tokens the model wrote, over all its turns."""
        return sum(t.sample.num_tokens for t in self.turns)

    def sequence(self) -> tuple[list[int], list[float]]:
        """The token ids after the prompt and the loss mask over them: 1 on the model's own
        tokens, 0 on the bridges between turns (feedback and template tokens: no gradient)."""
        ids: list[int] = []
        mask: list[float] = []
        for turn in self.turns:
            ids += turn.sample.token_ids + turn.bridge
            mask += [1.0] * turn.sample.num_tokens + [0.0] * len(turn.bridge)
        return ids, mask

    def record(self) -> dict[str, Any]:
        """A JSON-ready dict for evaluation reports: the last completion, extracted code, test
        results and the final reward, then every turn (`Turn.record`)."""
        s, v = self.sample, self.verdict
        return {
            "text": s.text,
            "num_tokens": s.num_tokens,
            "truncated": s.truncated,
            "finish": s.finish,
            "code": v.code,
            "format_ok": v.format_ok,
            "format_error": v.format_error,
            "reward": self.reward,
            "reward_parts": v.parts,
            "solved": self.solved,
            "passed": v.passed,
            "total": v.total,
            "tests": v.test_records(),
            **({"error": self.error} if self.error else {}),
            "turns": [t.record() for t in self.turns],
            "dropped": self.dropped,
        }

    def summary(self) -> dict[str, Any]:
        """The compact line the trainer appends to rollouts.jsonl for each episode: `record()`'s
        keys, fewer of them (the last completion, its extracted code or None, reward), one short
        outcome per test, and every turn (`Turn.record`), so a run can be read back
        (`mlx-swe-rl watch`) without rerunning anything."""
        return {
            "puzzle_id": self.puzzle_id,
            "reward": self.reward,
            "solved": self.solved,
            "text": self.sample.text,
            "num_tokens": self.sample.num_tokens,
            "truncated": self.sample.truncated,
            "code": self.verdict.code,
            "tests": [{"status": t.status, "detail": _clip(t.message, DETAIL_CHARS)} for t in self.verdict.tests],
            **({"error": _clip(self.error, ERROR_CHARS)} if self.error else {}),
            "turns": [t.record() for t in self.turns],
        }


DETAIL_CHARS = 200  # per test in rollouts.jsonl: enough for "expected X, got Y", not a traceback
ERROR_CHARS = 500  # why a puzzle could not be scored: the oracle's exception, not its whole output


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass
class RolloutBatch:
    """`groups[i]` holds the rollouts of `puzzles[i]`."""

    puzzles: list[Puzzle]
    prompts: list[list[int]]
    groups: list[list[Episode]]
    stats: SampleStats
    score_seconds: float = 0.0

    def joined(self, more: RolloutBatch) -> RolloutBatch:
        """This batch's groups, then `more`'s, with the sampling totals of both."""
        a, b = self.stats, more.stats
        stats = SampleStats(prompt_tokens=a.prompt_tokens + b.prompt_tokens,
                            generated_tokens=a.generated_tokens + b.generated_tokens, seconds=a.seconds + b.seconds,
                            prefill_seconds=a.prefill_seconds + b.prefill_seconds,
                            peak_memory_gb=max(a.peak_memory_gb, b.peak_memory_gb),
                            completions=a.completions + b.completions, truncated=a.truncated + b.truncated,
                            stopped=a.stopped + b.stopped)
        return RolloutBatch(self.puzzles + more.puzzles, self.prompts + more.prompts, self.groups + more.groups,
                            stats, self.score_seconds + more.score_seconds)


def collect_rollouts(
    model: Any,
    tokenizer: Any,
    env: CodeFixEnv,  # or any object with the same prompt_for / score methods
    puzzles: list[Puzzle],
    plan: SamplingPlan,
    *,
    progress: bool = False,
    desc: str = "sampling",
) -> RolloutBatch:
    """Sample `plan.group_size` episodes for each puzzle in one batch and score them. With
    `plan.stop_after_answer` an answer ends where its answer does (`CodeFixEnv.stop_rule`).

    `plan.max_turns` > 1 (an env with a test split): an episode whose answer fails its public
    tests gets the env's feedback as a new user turn and answers again, up to `max_turns`
    answers; its reward is the last answer's, less `plan.turn_penalty` per extra turn. A later
    turn waits in the engine's queue (held) from the moment its previous answer finishes; when
    it could join, every answer waiting for a verdict is scored at once and the turn is released
    with its bridge, or dropped. Single-turn is the same loop with no later turns."""
    prompts = encode_prompts(tokenizer, env, puzzles)
    stops = stop_rules(env, puzzles, plan.stop_after_answer)
    episodes = _Episodes(tokenizer, env, puzzles, prompts, plan.max_turns)
    engine = plan_engine(model, tokenizer, plan, progress, desc)
    firsts: dict[int, Sample] = {}
    try:
        for p, prompt in enumerate(prompts):
            for _ in range(plan.group_size):
                engine.submit(Request(prompt, stops[p], keep_cache=plan.max_turns > 1, label=p))
        while engine.busy:
            step = engine.step()
            for seq in step.asked:
                bridge = episodes.decide(episodes.parents[seq])
                engine.release(seq, bridge) if bridge is not None else engine.drop(seq)
            for seq, s in step.finished:
                if s.parent is None:
                    firsts[seq] = s
                turn = episodes.finished(s)
                if turn < plan.max_turns:
                    later = engine.submit(Request(stop=stops[s.prompt_index], parent=seq,
                                                  keep_cache=turn + 1 < plan.max_turns, held=True, label=s.prompt_index))
                    episodes.parents[later] = s
    finally:
        stats = engine.close()
    episodes.score_waiting()  # the last answers, which had no next turn to decide
    groups: list[list[Episode]] = [[] for _ in puzzles]
    for seq in sorted(firsts):
        s = firsts[seq]
        groups[s.prompt_index].append(episodes.episode(puzzles[s.prompt_index], s, plan.turn_penalty))
    return RolloutBatch(puzzles, prompts, groups, stats, episodes.score_seconds)


class _Episodes:
    """The episodes of a `collect_rollouts` call: scores finished answers (all waiting ones at
    once, when a verdict is needed), decides each next turn, and builds its bridge from the
    chat template (`models.chat.ChatFrame`), checking that the accumulated ids decode to exactly
    what the template renders for the conversation."""

    def __init__(self, tokenizer: Any, env: CodeFixEnv, puzzles: list[Puzzle], prompts: list[list[int]],
                 max_turns: int):
        self.tokenizer, self.env, self.puzzles, self.prompts = tokenizer, env, puzzles, prompts
        self.max_turns = max_turns
        self.frame = ChatFrame.of(tokenizer) if max_turns > 1 else None
        self.waiting: list[Sample] = []
        self.verdicts: dict[int, Verdict] = {}  # by id(sample)
        self.bridges: dict[int, list[int]] = {}
        self.children: dict[int, Sample] = {}  # by id(parent sample)
        self.parents: dict[int, Sample] = {}  # a held later turn's previous answer, by engine sequence
        self.mismatched: set[int] = set()
        self.score_seconds = 0.0

    def chain(self, s: Sample) -> list[Sample]:
        """The turns up to and including `s`, first turn first."""
        turns = [s]
        while turns[-1].parent is not None:
            turns.append(turns[-1].parent)
        return turns[::-1]

    def finished(self, s: Sample) -> int:
        """Queue answer `s` for scoring; returns its turn number (1 for a first answer)."""
        self.waiting.append(s)
        if s.parent is not None:
            self.children[id(s.parent)] = s
        return len(self.chain(s))

    def score_waiting(self) -> None:
        start = time.perf_counter()
        batch, self.waiting = self.waiting, []
        if not batch:
            return
        for s, verdict in zip(batch, self.env.score([(self.puzzles[s.prompt_index].id, s.text) for s in batch])):
            self.verdicts[id(s)] = verdict
        self.score_seconds += time.perf_counter() - start

    def decide(self, s: Sample) -> list[int] | None:
        """The bridge to `s`'s next turn, or None: the episode ends (public tests passed, the
        last turn allowed, or ids that do not match the template's rendering)."""
        if id(s) not in self.verdicts:
            self.score_waiting()
        verdict = self.verdicts[id(s)]
        turns = self.chain(s)
        if verdict.public_ok or verdict.error:  # an error verdict has no feedback to answer
            return None
        bridge = self.frame.bridge(self.tokenizer, verdict.feedback, s.finish == EOS)
        messages = self.env.prompt_for(self.puzzles[s.prompt_index].id)
        for turn in turns:
            messages = messages + [{"role": "assistant", "content": turn.text},
                                   {"role": "user", "content": self.verdicts[id(turn)].feedback}]
        ids = list(self.prompts[s.prompt_index])
        for turn in turns[:-1]:
            ids += turn.token_ids + self.bridges[id(turn)]
        ids += s.token_ids + bridge
        if self.tokenizer.decode(ids) != render(self.tokenizer, messages, True):
            self.mismatched.add(id(turns[0]))
            return None
        self.bridges[id(s)] = bridge
        return bridge

    def episode(self, puzzle: Puzzle, first: Sample, turn_penalty: float) -> Episode:
        """The episode that starts with `first`, with all its turns."""
        turns = [first]
        while id(turns[-1]) in self.children:
            turns.append(self.children[id(turns[-1])])
        records = [Turn(s, self.verdicts[id(s)], self.bridges.get(id(s), [])) for s in turns]
        last = records[-1].verdict
        reward = last.reward - turn_penalty * (len(records) - 1)
        return Episode(puzzle.id, records, reward, last.solved, dropped=id(first) in self.mismatched)


def encode_prompts(tokenizer: Any, env: CodeFixEnv, puzzles: list[Puzzle]) -> list[list[int]]:
    """The chat prompt token ids of each puzzle, as the sampler gets them."""
    return [encode_chat(tokenizer, env.prompt_for(p.id)) for p in puzzles]


def plan_engine(model: Any, tokenizer: Any, plan: SamplingPlan, progress: bool, desc: str) -> Engine:
    """The sampling engine of one phase's plan. No log-probs: rewards and the loss never read them."""
    return Engine(model, tokenizer, max_tokens=plan.max_tokens, temperature=plan.temperature, top_p=plan.top_p,
                  seed=plan.seed, batch_size=plan.batch_size, logprobs=False, progress=progress, desc=desc)


def stop_rules(env: CodeFixEnv, puzzles: list[Puzzle], stop_after_answer: bool) -> list[StopRule | None]:
    """The sampler's stop rule of each puzzle (None: its completions run to EOS or the limit)."""
    return [env.stop_rule(p.id) if stop_after_answer else None for p in puzzles]


def score_samples(env: CodeFixEnv, pairs: list[tuple[Puzzle, Sample]]) -> list[Episode]:
    """Score (puzzle, completion) pairs in one scorer call, as rollouts in the same order."""
    scored = env.score([(p.id, s.text) for p, s in pairs]) if pairs else []
    return [Episode.single(s, verdict) for (_, s), verdict in zip(pairs, scored)]


def informative(group: list[Episode]) -> bool:
    """Some answers solved and some not (by the binary outcome, whatever the shaped rewards), and
    no error verdict: the groups dynamic sampling keeps."""
    return category(group) == MIXED and not any(r.error for r in group)


def category(group: list[Episode]) -> str:
    """all-solved / mixed / all-failed: only mixed groups give GRPO a learning signal."""
    solved = sum(r.solved for r in group)
    if solved == len(group):
        return ALL_SOLVED
    return MIXED if solved else ALL_FAILED


# --- dynamic sampling -------------------------------------------------------------------------

def refill_seed(seed: int, round_: int) -> int:
    """The sampling seed of a step's `round_`-th replacement draw (dynamic sampling)."""
    return (seed + round_ * 15_485_863) % (2**31)


def refill(batch: RolloutBatch, spare: list[Puzzle], cap: int,
           draw: Callable[[list[Puzzle], int], RolloutBatch]) -> tuple[RolloutBatch, int]:
    """Dynamic sampling: while fewer of `batch`'s groups are `informative` than it had puzzles,
    draw groups of as many more puzzles (the next of `spare`, in order; `draw(puzzles, round)`
    samples and scores them), `cap` of them at most. Returns every group sampled (the first
    batch's, then the replacements') and how many replacement groups that was."""
    wanted, used, round_ = len(batch.groups), 0, 0
    while True:
        missing = wanted - sum(informative(group) for group in batch.groups)
        n = min(missing, cap - used, len(spare) - used)
        if n <= 0:
            return batch, used
        round_ += 1
        batch = batch.joined(draw(spare[used:used + n], round_))
        used += n
