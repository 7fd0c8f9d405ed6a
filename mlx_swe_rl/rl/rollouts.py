"""Rollouts: sample G completions per puzzle from a policy and score them with the one scorer.

Training, evaluation and calibration all collect rollouts through `collect_rollouts`, so the
prompt, the sampler and the verdict are the same everywhere. A rollout is an episode: one turn
(the completion, scored), or with `max_turns` > 1 up to that many, each later turn answering
the feedback on the previous one (multi-turn repair). Its tokens after the prompt are the
model's completions and the bridges between them, exactly as sampled (`Episode.sequence`).

One `Driver` owns the engine loop for every kind of episode; what happens when answers finish
is a small policy's: `Turns` (the next turn, or the end of the episode) for training and
evaluation, calibration's `Rounds` (another round of a puzzle, or stop: it is mixed), dynamic
sampling's `Refill` (`Turns`, and a spare puzzle's group for each group that cannot teach). An
episode being sampled holds its own answers, verdicts and bridges (`LiveEpisode`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

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
    answers; its reward is the last answer's, less `plan.turn_penalty` per extra turn. The
    driver with the `Turns` policy: single-turn is the same loop with no later turns."""
    turns = Turns(tokenizer, env, plan.max_turns)
    driver = plan_driver(model, tokenizer, env, puzzles, plan, progress, desc)
    groups = open_groups(driver, plan)
    stats = driver.run(turns)
    return scored_batch(driver, groups, range(len(puzzles)), stats, plan)


def dynamic_rollouts(
    model: Any,
    tokenizer: Any,
    env: CodeFixEnv,
    puzzles: list[Puzzle],
    spare: list[Puzzle],
    plan: SamplingPlan,
    *,
    cap: int,
    progress: bool = False,
    desc: str = "sampling",
) -> tuple[RolloutBatch, int]:
    """Dynamic sampling: `collect_rollouts` of `puzzles`, where each group that turns out not
    `informative` is replaced by a group of the next `spare` puzzle, `cap` replacements at most,
    until as many groups are informative as there are `puzzles` (or the spares run out). Returns
    the batch (`puzzles`' groups, then the replacements', in `spare`'s order) and how many
    replacement groups it holds.

    One continuous batch (the `Refill` policy): the spare groups are queued held from the start,
    and one joins as soon as a group it replaces is finished and scored, while the rest decode;
    spare groups never needed are dropped before they sample a token. One engine, so one
    sampling seed, `plan.seed`: until the first replacement joins, `puzzles`' groups decode
    exactly as `collect_rollouts` would decode them; a replacement draws from the same random
    stream as it joins (and changes what the rows beside it draw from then on)."""
    policy = Refill(tokenizer, env, plan, len(puzzles))
    driver = plan_driver(model, tokenizer, env, [*puzzles, *spare[:cap]], plan, progress, desc)
    policy.open(driver)
    stats = driver.run(policy)
    kept = [p for p in range(len(driver.puzzles)) if policy.released(p)]  # the step's, then spares in order
    return scored_batch(driver, policy.groups, kept, stats, plan), len(kept) - len(puzzles)


def plan_driver(model: Any, tokenizer: Any, env: CodeFixEnv, puzzles: list[Puzzle], plan: SamplingPlan,
                progress: bool, desc: str) -> Driver:
    """A driver for `puzzles` under one phase's plan: their prompts and stop rules, and its engine."""
    prompts = encode_prompts(tokenizer, env, puzzles)
    stops = stop_rules(env, puzzles, plan.stop_after_answer)
    return Driver(plan_engine(model, tokenizer, plan, progress, desc), env, puzzles, prompts, stops)


def open_groups(driver: Driver, plan: SamplingPlan, held_from: int | None = None) -> list[list[LiveEpisode]]:
    """Queue `plan.group_size` episodes of each of the driver's puzzles, puzzle by puzzle; those
    of puzzles from `held_from` on are held until their policy lets them join. Returns them by
    puzzle."""
    held_from = len(driver.puzzles) if held_from is None else held_from
    return [[driver.open(p, held=p >= held_from, keep_cache=plan.max_turns > 1) for _ in range(plan.group_size)]
            for p in range(len(driver.puzzles))]


def scored_batch(driver: Driver, groups: list[list[LiveEpisode]], kept: Iterable[int], stats: SampleStats,
                 plan: SamplingPlan) -> RolloutBatch:
    """The finished groups of the driver's puzzles `kept` (`groups[p]`: puzzle p's episodes), in
    that order, as a batch with the driver's totals."""
    kept = list(kept)
    episodes = [[live.episode(driver.puzzles[p].id, plan.turn_penalty) for live in groups[p]] for p in kept]
    return RolloutBatch([driver.puzzles[p] for p in kept], [driver.prompts[p] for p in kept], episodes, stats,
                        driver.score_seconds)


# --- the driver -------------------------------------------------------------------------------

@dataclass
class LiveEpisode:
    """An episode being sampled: its puzzle (`index` into the driver's puzzles), its answers so
    far and their verdicts as they are scored, the bridge after each answer that was answered
    again, and `ids`, the conversation's token ids up to its last bridge (the prompt, then each
    earlier answer and bridge: the next answer's prefix). `tag` is its policy's own mark
    (calibration: the round's entry); `dropped`: its ids did not match the chat template."""

    index: int
    ids: list[int]
    tag: int = 0
    samples: list[Sample] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    bridges: list[list[int]] = field(default_factory=list)
    dropped: bool = False
    seq: int = -1  # the engine sequence of its latest request

    @property
    def scored(self) -> bool:
        """Every answer it gave has its verdict."""
        return len(self.verdicts) == len(self.samples)

    def episode(self, puzzle_id: str, turn_penalty: float) -> Episode:
        """The finished episode: its turns, and the last verdict less the penalty per extra turn."""
        turns = [Turn(s, v, self.bridges[i] if i < len(self.bridges) else [])
                 for i, (s, v) in enumerate(zip(self.samples, self.verdicts))]
        last = turns[-1].verdict
        return Episode(puzzle_id, turns, last.reward - turn_penalty * (len(turns) - 1), last.solved,
                       dropped=self.dropped)


@dataclass(frozen=True)
class Decision:
    """What becomes of a held request: it joins the batch (a later turn after `bridge`, the ids
    that follow its previous answer) or never does."""

    join: bool
    bridge: tuple[int, ...] = ()


JOIN, END = Decision(True), Decision(False)
WAIT = None  # not decided yet: the request stays held and is asked again at the next refill


def decide_once(decided: dict[int, Decision], key: int, gate: Callable[[], Decision | None]) -> Decision | None:
    """`gate()`'s decision for `key`, taken once and kept in `decided` (every held answer of one
    group or round goes the same way); WAIT is not kept, so the gate is asked again later."""
    if key not in decided:
        decision = gate()
        if decision is WAIT:
            return WAIT
        decided[key] = decision
    return decided[key]


class EpisodePolicy(Protocol):
    """What happens next in a driver's loop, decided when answers finish (`answered`: queue a
    held follow-up, note the answer) and when a held request could join (`decide`, reading
    verdicts through `Driver.verdict`, which scores every waiting answer together)."""

    def answered(self, driver: Driver, live: LiveEpisode) -> None: ...

    def decide(self, driver: Driver, live: LiveEpisode) -> Decision | None: ...


class Driver:
    """The one engine loop of every kind of episode (training and evaluation rollouts,
    multi-turn repair, calibration rounds, dynamic sampling's replacements): it opens episodes and queues their later turns,
    steps the engine, hands each finished answer to its episode and scores waiting answers
    together, all at once, when a decision needs a verdict (and the rest at the end). What
    happens next is its policy's (`EpisodePolicy`). A held request waits in the engine's
    queue, in its place, until the policy decides it, exactly where a decision made inside
    the loop would have been taken."""

    def __init__(self, engine: Engine, env: CodeFixEnv, puzzles: list[Puzzle], prompts: list[list[int]],
                 stops: list[StopRule | None]):
        self.engine, self.env, self.puzzles, self.prompts, self.stops = engine, env, puzzles, prompts, stops
        self.episodes: list[LiveEpisode] = []  # in the order they were opened
        self.by_seq: dict[int, LiveEpisode] = {}  # engine sequence -> its episode
        self.waiting: list[LiveEpisode] = []  # episodes whose last answer awaits its verdict
        self.score_seconds = 0.0

    def open(self, p: int, *, held: bool = False, keep_cache: bool = False, tag: int = 0) -> LiveEpisode:
        """Queue a new episode of puzzle `p` (its first answer; `held`: until its policy lets it join)."""
        live = LiveEpisode(p, list(self.prompts[p]), tag)
        live.seq = self.engine.submit(Request(self.prompts[p], self.stops[p], keep_cache=keep_cache, held=held, label=p))
        self.by_seq[live.seq] = live
        self.episodes.append(live)
        return live

    def follow(self, live: LiveEpisode, keep_cache: bool) -> None:
        """Queue `live`'s next answer, held (it decodes from its last answer's kept KV cache)."""
        live.seq = self.engine.submit(Request(stop=self.stops[live.index], parent=live.seq, keep_cache=keep_cache,
                                              held=True, label=live.index))
        self.by_seq[live.seq] = live

    def verdict(self, live: LiveEpisode) -> Verdict:
        """The verdict on `live`'s last answer (scoring every waiting answer if it has none yet)."""
        if not live.scored:
            self.score_waiting()
        return live.verdicts[-1]

    def score_waiting(self) -> None:
        """Score every answer that awaits its verdict, in one scorer call."""
        batch, self.waiting = self.waiting, []
        if not batch:
            return
        start = time.perf_counter()
        verdicts = self.env.score([(self.puzzles[live.index].id, live.samples[-1].text) for live in batch])
        for live, verdict in zip(batch, verdicts):
            live.verdicts.append(verdict)
        self.score_seconds += time.perf_counter() - start

    def run(self, policy: EpisodePolicy) -> SampleStats:
        """Step the engine until nothing is queued or decoding, then score what is left; returns
        the sampling totals."""
        try:
            while self.engine.busy:
                step = self.engine.step()
                for seq in step.asked:
                    decision = policy.decide(self, self.by_seq[seq])
                    if decision is WAIT:
                        continue
                    if decision.join:
                        self.engine.release(seq, decision.bridge)
                    else:
                        self.engine.drop(seq)
                for seq, sample in step.finished:
                    live = self.by_seq[seq]
                    live.samples.append(sample)
                    self.waiting.append(live)
                    policy.answered(self, live)
        finally:
            stats = self.engine.close()
        self.score_waiting()  # the last answers, which had no next turn to decide
        return stats


class Turns:
    """The policy of training and evaluation rollouts: after a finished answer, a later turn
    (up to `max_turns` answers) that joins when its answer failed the public tests, with the
    feedback as a new user turn; its bridge comes from the chat template (`ChatFrame`), and
    the episode is dropped when its ids do not decode to what the template renders."""

    def __init__(self, tokenizer: Any, env: CodeFixEnv, max_turns: int):
        self.tokenizer, self.env, self.max_turns = tokenizer, env, max_turns
        self.frame = ChatFrame.of(tokenizer) if max_turns > 1 else None

    def answered(self, driver: Driver, live: LiveEpisode) -> None:
        turn = len(live.samples)
        if turn < self.max_turns:
            driver.follow(live, keep_cache=turn + 1 < self.max_turns)

    def decide(self, driver: Driver, live: LiveEpisode) -> Decision:
        verdict = driver.verdict(live)
        if verdict.public_ok or verdict.error:  # an error verdict has no feedback to answer
            return END
        answer = live.samples[-1]
        bridge = self.frame.bridge(self.tokenizer, verdict.feedback, answer.finish == EOS)
        messages = self.env.prompt_for(driver.puzzles[live.index].id)
        for s, v in zip(live.samples, live.verdicts):
            messages = messages + [{"role": "assistant", "content": s.text}, {"role": "user", "content": v.feedback}]
        ids = live.ids + answer.token_ids + bridge
        if self.tokenizer.decode(ids) != render(self.tokenizer, messages, True):
            live.dropped = True
            return END
        live.ids = ids
        live.bridges.append(bridge)
        return Decision(True, tuple(bridge))


class Refill(Turns):
    """Dynamic sampling's policy: `Turns` for every episode, and the spare puzzles' groups
    (puzzles `wanted` on, in order; opened held) released one by one, spare k when k + 1 of the
    groups in the batch (the step's and the spares' released so far) are finished, scored and
    not `informative` (it replaces the (k + 1)-th), and dropped once no group left could need it.

    So each group that cannot teach brings in one replacement, until `wanted` groups are
    informative, the cap (the number of spares opened) is reached, or no spare is left. A group
    is finished when all its episodes are: a later turn's decision is taken (and kept) as soon as
    a finished group needs it, not only when the engine asks, so a spare never waits on a
    decision the engine would take after it (which could leave nothing to decode). A released
    spare keeps its place in the queue: it takes free rows before later turns queued after it."""

    def __init__(self, tokenizer: Any, env: CodeFixEnv, plan: SamplingPlan, wanted: int):
        super().__init__(tokenizer, env, plan.max_turns)
        self.plan, self.wanted = plan, wanted
        self.groups: list[list[LiveEpisode]] = []  # by puzzle
        self.spares: dict[int, Decision] = {}  # by spare puzzle: its G held answers all go the same way
        self.next_turns: dict[int, Decision] = {}  # by engine sequence of a held later turn
        self.outcomes: dict[int, bool] = {}  # by finished group: informative

    def open(self, driver: Driver) -> None:
        """Queue every group of the driver's puzzles: the first `wanted` to decode, the spares held."""
        self.groups = open_groups(driver, self.plan, held_from=self.wanted)

    def released(self, p: int) -> bool:
        """Puzzle `p`'s group is in the batch (a step puzzle's, or a spare's that joined)."""
        return p < self.wanted or self.spares.get(p) is JOIN

    def decide(self, driver: Driver, live: LiveEpisode) -> Decision | None:
        if live.samples:  # a later turn; only spare groups' first answers are held otherwise
            return self._next_turn(driver, live)
        return decide_once(self.spares, live.index, lambda: self._gate(driver, live.index))

    def _next_turn(self, driver: Driver, live: LiveEpisode) -> Decision:
        """`Turns`' decision on `live`'s held later turn, taken once (it extends the episode's ids)."""
        return decide_once(self.next_turns, live.seq, lambda: Turns.decide(self, driver, live))

    def _gate(self, driver: Driver, p: int) -> Decision | None:
        k = p - self.wanted  # the k-th spare
        if k > 0 and p - 1 not in self.spares:
            return WAIT  # in order: what spare k may do depends on whether spare k - 1 joined
        released = [q for q in range(len(self.groups)) if self.released(q)]
        finished = [q for q in released if self._finished(driver, q)]
        failed = sum(not self.outcomes[q] for q in finished)
        if failed > k:
            return JOIN  # a group that cannot teach, which spares 0..k-1 have not replaced
        if failed + len(released) - len(finished) <= k:
            return END  # even if every unfinished group failed, spares before this one suffice
        return WAIT

    def _finished(self, driver: Driver, q: int) -> bool:
        """Every episode of group `q` has ended (scored, no later turn to come); notes whether
        the group is informative."""
        if q in self.outcomes:
            return True
        group = self.groups[q]
        if any(self._going(live) for live in group) or not all(self._ended(driver, live) for live in group):
            return False
        self.outcomes[q] = informative([live.episode(driver.puzzles[q].id, self.plan.turn_penalty) for live in group])
        return True

    def _going(self, live: LiveEpisode) -> bool:
        """`live` is queued or decoding: no answer yet, or a later turn that joined and has not answered."""
        return not live.samples or (len(live.samples) < self.max_turns and self.next_turns.get(live.seq) is JOIN)

    def _ended(self, driver: Driver, live: LiveEpisode) -> bool:
        """`live`, whose last answer is finished, ends there (its verdict known)."""
        if len(live.samples) == self.max_turns:
            driver.verdict(live)
            return True
        return self._next_turn(driver, live) is END


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
