"""Batched sampling: G completions for each of many prompts in one continuous batch.

Our own continuous-batching loop over mlx-lm's batched KV caches (`BatchKVCache`, what
`mlx_lm.batch_generate` uses) and its samplers, so all sequences of a call share one KV-cached
decode loop. Unlike `batch_generate` we keep the EOS token that ended a completion (a trainer
must reinforce stopping) and say which completions were truncated; finished rows are dropped
from the batch in bulk rather than one copy of the cache each, and the log-softmax runs on the
fast exp where MLX's is slow. A completion may also end on a stop rule (`StopRule`: e.g. the
closing fence of the answer's code block), matched on its decoded text.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import mlx.core as mx

from ..stopping import StopRule

EOS, STOP, LENGTH = "eos", "stop", "length"  # how a completion ended


@dataclass
class Sample:
    """One sampled completion.

    `token_ids` are the sampled ids exactly (never re-encoded), ending with the EOS token when
    the model stopped by itself; `text` is their decoding without that EOS. `logprobs[i]` is
    log p(token_ids[i]) under the sampling model at temperature 1, as mlx-lm reports it (empty
    when greedy sampling was asked not to compute them). `finish` says how it ended: "eos" (the
    model stopped), "stop" (a stop rule matched; the tokens that completed the match are the
    last ones) or "length" (cut off at max_tokens). A later turn (`sample(follow_up=...)`) has
    its previous turn as `parent`; its prompt is the parent's prompt, the parent's tokens and
    the ids the follow-up added.
    """

    prompt_index: int
    token_ids: list[int]
    text: str
    logprobs: list[float]
    finish: str
    parent: "Sample | None" = field(default=None, repr=False, compare=False)  # the turn this one follows

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def truncated(self) -> bool:
        """Cut off by the token limit (a completion that ended on EOS or a stop rule was not)."""
        return self.finish == LENGTH


@dataclass
class SampleStats:
    """Totals of one `sample` call."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0  # part of `seconds`
    peak_memory_gb: float = 0.0
    completions: int = 0
    truncated: int = 0
    stopped: int = 0  # ended on a stop rule

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class SamplingResult:
    """`groups[p]` holds the completions of prompt p, in sampling order; `later` the later turns
    (`follow_up`), in the order they finished; `prompts[s.prompt_index]` is any sample's prompt."""

    groups: list[list[Sample]]
    stats: SampleStats = field(default_factory=SampleStats)
    later: list[Sample] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)


def encode_chat(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of `messages` rendered with the model's chat template, ready for generation."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    if isinstance(ids, dict):  # some tokenizers return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def make_sampler_fn(temperature: float, top_p: float = 1.0):
    """mlx-lm sampler: argmax at temperature 0, otherwise temperature (and top-p) sampling."""
    from mlx_lm.sample_utils import make_sampler

    return make_sampler(temp=temperature, top_p=top_p)


def sample(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[list[int]],
    *,
    group_size: int | Sequence[int] = 1,
    max_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = 0,
    batch_size: int = 32,
    share_prefix: bool = True,
    logprobs: bool = True,
    gate: Callable[[int], bool | None] | None = None,
    on_sample: Callable[[Sample], None] | None = None,
    stop: Sequence[StopRule | None] | None = None,
    follow_up: Callable[[Sample], Callable[[], list[int] | None] | None] | None = None,
    progress: bool = False,
    desc: str = "sampling",
) -> SamplingResult:
    """Sample `group_size` completions for every prompt (token-id lists) in one batched run.

    With `share_prefix` each distinct prompt is prefilled once and its KV cache is reused by
    all its completions (also across copies of the same prompt), instead of one prefill per
    completion. A prompt is prefilled when its first completion joins the batch, so only the
    prompts being decoded hold a cache. Reproducible for a given seed, model, prompt list and
    batch size. At temperature 0 the decode is greedy (all members of a group are then
    identical); there `logprobs=False` skips the vocabulary log-softmax of every step (the
    same tokens, about a tenth of a decode step saved).

    `group_size` may also give each prompt its own count. `gate(p)`, when given, is asked
    before prompt p's first completion joins the batch: True decodes the prompt, False skips it
    (its group comes back empty), None asks again at a later refill while other completions
    decode (at least one running completion must be able to settle it). `on_sample` is called
    with each completion as it finishes. Together they let a caller decide on more samples of
    a prompt from its finished ones without ever draining the batch.

    `stop[p]`, when given, ends prompt p's completions early once its rule matches their text
    (they end like an EOS: not truncated; the tokens up to the match stay in the completion and
    its log-probs). A stop changes nothing before it; after it the batch holds other rows, so
    later random draws of the other completions differ from an unstopped run's.

    `follow_up(s)`, when given, is called as each completion s finishes and returns None (no
    next turn) or a decider. The sampler calls the decider when s's next turn could join the batch (at a refill, so a
    caller can settle many finished completions at once, e.g. score them together) and it
    returns the token ids to append after s's tokens (the turn's end, a new user message, the
    assistant header) or None: no next turn. The next turn decodes from s's own KV cache, so
    only the appended ids are prefilled; it follows s's stop rule and may have a follow-up too.
    """
    sizes = [group_size] * len(prompts) if isinstance(group_size, int) else list(group_size)
    if len(sizes) != len(prompts) or min(sizes, default=1) < 1 or max_tokens < 1:
        raise ValueError("group_size (one per prompt, or one for all) and max_tokens must be at least 1")
    if stop is not None and len(stop) != len(prompts):
        raise ValueError("stop: one rule (or None) per prompt")
    if seed is not None:
        mx.random.seed(seed)
    eos = set(tokenizer.eos_token_ids)
    prompts = [list(p) for p in prompts]  # later turns add theirs
    owner = [i for i, size in enumerate(sizes) for _ in range(size)]  # each sequence's prompt
    stats = SampleStats()
    start = time.perf_counter()  # prefill counts as sampling time
    mx.reset_peak_memory()
    caches = PrefixCaches(model, prompts, owner, share_prefix, stats)
    made: list[Sample | None] = [None] * len(owner)
    rules = [stop[p] for p in owner] if stop is not None else [None] * len(owner)
    stops = StopMatcher(tokenizer, rules) if any(rules) else None  # later turns copy these
    turns: dict[int, NextTurn] = {}  # later turns waiting to join, by sequence
    parent_of: dict[int, Sample] = {}  # the previous turn of each later turn that joined

    def finish(seq: int, ids: list[int], lps: list[float], row_cache: Callable[[], list[Any]]) -> list[int]:
        # An EOS or a stop rule counts even when it came exactly at max_tokens; otherwise the
        # completion was cut off.
        if ids and ids[-1] in eos:
            how, text_ids = EOS, ids[:-1]
        else:
            how, text_ids = (STOP if stops is not None and stops.matched(seq) else LENGTH), ids
        made[seq] = done = Sample(owner[seq], ids, tokenizer.decode(text_ids), lps, how, parent_of.pop(seq, None))
        if on_sample is not None:
            on_sample(done)
        decider = follow_up(done) if follow_up is not None else None
        if decider is None:
            return []
        # the next turn starts from this row's cache: evaluated now, before the batch drops it
        cache = row_cache()
        mx.eval([c.state for c in cache])
        turns[len(made)] = NextTurn(done, decider, cache)
        owner.append(-1)  # its prompt is known once decided
        made.append(None)
        rules.append(rules[seq])
        return [len(made) - 1]

    decided: dict[int, bool] = {}  # gate verdicts, per prompt

    def ready(seq: int) -> bool | None:
        if seq in turns:
            return turns[seq].decide(prompts, owner, seq)
        prompt = owner[seq]
        if prompt not in decided:
            verdict = True if gate is None else gate(prompt)
            if verdict is None:
                return None
            decided[prompt] = verdict
        if not decided[prompt]:
            caches.refuse(seq)
        return decided[prompt]

    def cache_for(seq: int) -> list[Any]:
        if seq not in turns:
            return caches.take(seq)
        begin = time.perf_counter()
        turn = turns.pop(seq)  # its cache joins the batch (a copy): not kept here
        parent_of[seq] = turn.parent
        cache = turn.extend(model, prompts[owner[seq]])
        stats.prefill_seconds += time.perf_counter() - begin
        return cache

    bar = _progress_bar(len(owner), desc) if progress else None
    try:
        decode(model, cache_for, lambda seq: prompts[owner[seq]][-1], list(range(len(owner))), eos,
               make_sampler_fn(temperature, top_p), max_tokens, batch_size, stats, finish, bar, start,
               normalise=logprobs or temperature > 0,
               ready=ready if gate is not None or follow_up is not None else None,
               stop_at=stops.check if stops is not None else None)
    finally:
        if bar is not None:
            bar.close()
    stats.seconds = time.perf_counter() - start
    stats.peak_memory_gb = mx.get_peak_memory() / 1e9

    result = SamplingResult([[] for _ in sizes], stats, prompts=prompts)
    for sample_ in made:
        if sample_ is None:  # its prompt was gated out, or there was no next turn
            continue
        (result.later if sample_.parent is not None else result.groups[sample_.prompt_index]).append(sample_)
        stats.completions += 1
        stats.truncated += sample_.truncated
        stats.stopped += sample_.finish == STOP
        stats.prompt_tokens += len(prompts[sample_.prompt_index])
    return result


@dataclass
class NextTurn:
    """A finished completion's next turn, waiting for its decider: it will decode from the
    completion's own KV cache with the decider's ids appended."""

    parent: Sample
    decider: Callable[[], list[int] | None]
    cache: list[Any]  # the parent row's KV cache: its prompt and tokens, all but the last one

    def decide(self, prompts: list[list[int]], owner: list[int], seq: int) -> bool:
        """Ask the decider; on a next turn, record its prompt as sequence `seq`'s."""
        extra = self.decider()
        if extra is None:
            return False
        if not extra:
            raise ValueError("follow_up: a next turn needs at least one token after the completion")
        owner[seq] = len(prompts)
        prompts.append(prompts[self.parent.prompt_index] + self.parent.token_ids + list(extra))
        return True

    def extend(self, model: Any, prompt: list[int]) -> list[Any]:
        """The parent's cache with the rest of `prompt` but its last token prefilled: the
        parent's last token (never fed to the model) and the appended ids."""
        from . import fastmath

        rest = prompt[self.cache[0].offset:-1]
        if rest:
            with fastmath.inference():
                model(mx.array(rest)[None], cache=self.cache)
            mx.eval([c.state for c in self.cache])
        return self.cache


class StopMatcher:
    """Per-sequence stop rules (sequence i follows `rules[i]`, None for none), checked token by
    token: a token's own text is decoded once per token id and cached, and only a token holding
    a trigger character makes the sequence's whole text be decoded and judged (`tokenizer.decode`,
    the same text the finished Sample gets, so the rule and later code extraction agree)."""

    def __init__(self, tokenizer: Any, rules: list[StopRule | None]):
        self.tokenizer = tokenizer
        self.rules = rules  # may grow as later turns are added
        self.pieces: dict[int, str] = {}
        self.hits: set[int] = set()

    def check(self, seq: int, ids: list[int]) -> bool:
        """True when sequence `seq`, whose tokens so far are `ids`, must stop now."""
        rule = self.rules[seq]
        if rule is None:
            return False
        token = ids[-1]
        piece = self.pieces.get(token)
        if piece is None:
            piece = self.pieces[token] = self.tokenizer.decode([token])
        if not any(c in piece for c in rule.triggers) or not rule.done(self.tokenizer.decode(ids)):
            return False
        self.hits.add(seq)
        return True

    def matched(self, seq: int) -> bool:
        return seq in self.hits


def prefill(model: Any, prompt: list[int]) -> list[Any]:
    """The KV cache of `prompt` without its last token (the decode loop feeds that one itself).
    Batch merging copies caches, so one cache can seed several sequences."""
    from mlx_lm.models.cache import make_prompt_cache

    from . import fastmath

    cache = make_prompt_cache(model)
    if len(prompt) > 1:
        with fastmath.inference():  # never differentiated: the fast prompt attention may run
            model(mx.array(prompt[:-1])[None], cache=cache)
        mx.eval([c.state for c in cache])
    return cache


@dataclass
class PrefixCaches:
    """Prefix caches for the sequences of a run (sequence i completes prompt `owner[i]`),
    prefilled when a sequence takes one. Shared: one prefill per distinct prompt (a prompt that
    appears several times, like a puzzle's calibration rounds, is prefilled once), kept only
    until every sequence of that prompt has taken it or been refused, so a run over hundreds of
    prompts never holds all their caches at once."""

    model: Any
    prompts: Sequence[list[int]]
    owner: list[int]
    share: bool
    stats: SampleStats
    held: dict[tuple[int, ...], list[Any]] = field(default_factory=dict)
    remaining: dict[tuple[int, ...], int] = field(default_factory=dict)
    keys: list[tuple[int, ...]] = field(default_factory=list)  # per prompt: its token ids as a dict key

    def __post_init__(self) -> None:
        self.keys = [tuple(prompt) for prompt in self.prompts]
        for prompt in self.owner:
            self.remaining[self.keys[prompt]] = self.remaining.get(self.keys[prompt], 0) + 1

    def take(self, i: int) -> list[Any]:
        """Sequence i's prefix cache (batch merging copies it, so one cache seeds many rows)."""
        key = self.keys[self.owner[i]]
        start = time.perf_counter()
        cache = self.held.get(key) or prefill(self.model, list(key))
        self.stats.prefill_seconds += time.perf_counter() - start
        if self.share:
            self.held[key] = cache
        self.refuse(i)
        return cache

    def refuse(self, i: int) -> None:
        """Sequence i will never take its cache."""
        key = self.keys[self.owner[i]]
        self.remaining[key] -= 1
        if not self.remaining[key]:
            self.held.pop(key, None)


def log_softmax(logits: mx.array) -> mx.array:
    """Log-probabilities over the last axis; on `fastmath.fast_exp` where the fast path is in
    use (MLX's exp over a 49k vocabulary costs ~30 ms per decode step at batch 64 there)."""
    from . import fastmath

    if not fastmath.installed():
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    top = logits.max(axis=-1, keepdims=True)
    return logits - (top + mx.log(fastmath.fast_exp(logits - top).sum(axis=-1, keepdims=True)))


def decode(model: Any, cache_for: Callable[[int], list[Any]], first_token: Callable[[int], int], pending: list[int],
           eos: set[int], sampler: Any, max_tokens: int, batch_size: int, stats: SampleStats,
           on_finish: Callable[[int, list[int], list[float], Callable[[], list[Any]]], list[int]], bar: Any = None,
           start: float = 0.0, normalise: bool = True, ready: Callable[[int], bool | None] | None = None,
           stop_at: Callable[[int, list[int]], bool] | None = None) -> None:
    """Continuous batched decoding of the `pending` sequences: sequence i starts from its prefix
    cache `cache_for(i)` (asked for when it joins) with `first_token(i)` as input, and runs until
    an EOS, `max_tokens` or `stop_at(i, its tokens so far)` says so; then `on_finish(i, token
    ids, log-probabilities, row_cache)` gets it (temperature-1 log-probs, as mlx-lm reports
    them; `row_cache()` extracts the row's KV cache) and returns sequences to queue after the
    pending ones (its later turn, or none). With `normalise` False the sampler gets the raw
    logits and no log-probabilities are kept (for an argmax sampler: the same tokens, one
    vocabulary log-softmax per step less).

    Up to `batch_size` sequences decode together in one batched cache. A finished row keeps its
    slot (its tokens are ignored) until an eighth of the batch has finished: dropping rows
    copies the whole cache, so it is done in bulk; new sequences join when a quarter of the
    slots are free, in order, each once `ready(i)` says True (False: never; None: not yet)."""
    rows: list[int] = []  # sequence index of each batch row
    done: set[int] = set()
    cache: list[Any] = []
    inputs = mx.array([], dtype=mx.uint32)
    tokens: dict[int, list[int]] = {}
    logprobs: dict[int, list[float]] = {}
    running = 0  # rows still decoding
    while pending or running:
        new: list[int] = []
        if pending and batch_size - running >= max(1, batch_size // 4):
            new, pending = _joining(pending, batch_size - running, ready, bar)
            if not (new or running):
                if pending:
                    raise RuntimeError("sampling stalled: no running completion can settle the waiting prompts")
                break
        if new:
            cache, inputs, rows = _drop_rows(cache, inputs, rows, done)
            prefixes = [cache_for(i) for i in new]
            joined = [type(layer).merge([prefix[n] for prefix in prefixes]) for n, layer in enumerate(prefixes[0])]
            if cache:
                for layer, extra in zip(cache, joined):
                    layer.extend(extra)  # in place: the new rows go below the running ones
            else:
                cache = joined
            inputs = mx.concatenate([inputs, mx.array([first_token(i) for i in new], dtype=mx.uint32)])
            rows += new
            running += len(new)
            for i in new:
                tokens[i], logprobs[i] = [], []
        logits = model(inputs[:, None], cache=cache)[:, -1, :]
        if normalise:
            logits = log_softmax(logits)
        inputs = sampler(logits).astype(mx.uint32)
        # without log-probs `chosen` only stands in for them in the loop below, never stored
        chosen = mx.take_along_axis(logits, inputs[:, None], axis=-1)[:, 0] if normalise else inputs
        mx.eval(inputs, chosen)  # one host sync per step
        for row, (token, lp) in enumerate(zip(inputs.tolist(), chosen.tolist())):
            seq = rows[row]
            if seq in done:
                continue
            tokens[seq].append(token)
            if normalise:
                logprobs[seq].append(lp)
            stats.generated_tokens += 1
            # the stop rule is asked before the limit, so a match on the last allowed token counts
            if token in eos or (stop_at is not None and stop_at(seq, tokens[seq])) or len(tokens[seq]) >= max_tokens:
                done.add(seq)
                running -= 1
                later = on_finish(seq, tokens.pop(seq), logprobs.pop(seq),
                                  lambda row=row: [layer.extract(row) for layer in cache])
                pending = pending + later
                if bar is not None:
                    bar.total += len(later)
                    bar.update(1)
        if bar is not None:
            rate = stats.generated_tokens / max(time.perf_counter() - start, 1e-9)
            bar.set_postfix(tok_s=f"{rate:.1f}", refresh=False)
        if 8 * (len(rows) - running) >= len(rows):
            cache, inputs, rows = _drop_rows(cache, inputs, rows, done)


def _joining(pending: list[int], free: int, ready: Callable[[int], bool | None] | None,
             bar: Any) -> tuple[list[int], list[int]]:
    """(sequences that join now, sequences still pending), taking up to `free` ready ones in
    order; sequences `ready` refuses are dropped (and taken off the progress bar's total)."""
    if ready is None:
        return pending[:free], pending[free:]
    new, waiting = [], []
    for position, seq in enumerate(pending):
        if len(new) == free:
            return new, waiting + pending[position:]
        verdict = ready(seq)
        if verdict:
            new.append(seq)
        elif verdict is None:
            waiting.append(seq)
        elif bar is not None:
            bar.total -= 1
            bar.refresh()
    return new, waiting


def _drop_rows(cache: list[Any], inputs: mx.array, rows: list[int],
               done: set[int]) -> tuple[list[Any], mx.array, list[int]]:
    """The batch without its finished rows."""
    keep = [r for r, seq in enumerate(rows) if seq not in done]
    if len(keep) == len(rows):
        return cache, inputs, rows
    if not keep:
        return [], mx.array([], dtype=mx.uint32), []
    index = mx.array(keep)
    for layer in cache:
        layer.filter(index)
    return cache, inputs[index], [rows[r] for r in keep]


def _progress_bar(total: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="completion", dynamic_ncols=True, leave=False)
