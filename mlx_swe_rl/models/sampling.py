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
from typing import Any, Sequence

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
    last ones) or "length" (cut off at max_tokens). A later turn (`Request.parent`) has its
    previous turn as `parent`; its prompt is the parent's prompt, the parent's tokens and the
    ids its release added.
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
    """`groups[p]` holds the completions of prompt p (`prompts[p]`), in the order they were queued."""

    groups: list[list[Sample]]
    stats: SampleStats = field(default_factory=SampleStats)
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


@dataclass
class Request:
    """One completion to sample. `prompt` is its prompt's token ids (for a later turn, set by
    `Engine.release`); it ends on EOS, `max_tokens` or its `stop` rule. A later turn names its
    previous turn's sequence as `parent` and decodes from that turn's KV cache (kept because the
    parent asked `keep_cache`), so only the ids after the parent's tokens are prefilled. A
    `held` request waits in the queue, in its place, until the caller releases or drops it.
    `label` comes back as the samples' `prompt_index`."""

    prompt: list[int] = field(default_factory=list)
    stop: StopRule | None = None
    parent: int | None = None
    keep_cache: bool = False
    held: bool = False
    label: int = 0


@dataclass
class Step:
    """What one `Engine.step` did: the sequences that finished (in batch-row order), or, when a
    refill reached held requests, those requests (nothing decoded): settle what you can with
    `release` or `drop` (leave the rest held) and step again."""

    finished: list[tuple[int, Sample]] = field(default_factory=list)
    asked: list[int] = field(default_factory=list)


class Engine:
    """Continuous batched decoding of submitted requests, one token per `step`.

    Up to `batch_size` sequences decode together in one batched KV cache. A finished row keeps
    its slot (its tokens are ignored) until an eighth of the batch has finished: dropping rows
    copies the whole cache, so it is done in bulk. Queued requests join, in order, when a
    quarter of the slots are free. With `share_prefix` each distinct prompt is prefilled once
    and its KV cache seeds all its sequences, and is released once every queued sequence of that
    prompt has taken it or been dropped. Reproducible for a given seed, model, request order and
    batch size. At temperature 0 the decode is greedy; there `logprobs=False` skips the
    vocabulary log-softmax of every step (the same tokens, about a tenth of a decode step saved).

    Callers are loops: submit, then `step` until not `busy`, scoring what finished and
    submitting later turns (`parent`) or more rounds as they go. A held request lets such a
    decision wait until the request could join: a refill that reaches held requests returns
    them (`Step.asked`) before decoding, so the caller decides on everything finished so far,
    exactly where a decision made inside the loop would have been taken.
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_tokens: int = 256, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = 0, batch_size: int = 32, share_prefix: bool = True,
                 logprobs: bool = True, progress: bool = False, desc: str = "sampling"):
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if seed is not None:
            mx.random.seed(seed)
        self.model, self.tokenizer = model, tokenizer
        self.max_tokens, self.batch_size = max_tokens, batch_size
        self.normalise = logprobs or temperature > 0
        self.sampler = make_sampler_fn(temperature, top_p)
        self.eos = set(tokenizer.eos_token_ids)
        self.stats = SampleStats()
        self.start = time.perf_counter()  # prefill counts as sampling time
        mx.reset_peak_memory()
        self.caches = PrefixCaches(model, share_prefix, self.stats)
        self.stops = StopMatcher(tokenizer)
        self.requests: list[Request] = []  # by sequence
        self.made: dict[int, Sample] = {}  # finished sequences that later turns may name as parent
        self.kept: dict[int, list[Any]] = {}  # KV caches of finished sequences kept for a later turn
        self.pending: list[int] = []
        self.asked_now: set[int] = set()  # held requests offered during the current refill
        self.bar = _progress_bar(0, desc) if progress else None
        # the batch
        self.rows: list[int] = []  # sequence index of each batch row
        self.done: set[int] = set()
        self.cache: list[Any] = []
        self.inputs = mx.array([], dtype=mx.uint32)
        self.tokens: dict[int, list[int]] = {}
        self.logprobs: dict[int, list[float]] = {}
        self.running = 0  # rows still decoding

    # --- the queue ---------------------------------------------------------------------------

    def submit(self, request: Request) -> int:
        """Queue `request`; returns its sequence index."""
        if request.parent is not None and request.parent not in self.kept:
            raise ValueError("a later turn's parent must be a finished sequence that kept its cache")
        seq = len(self.requests)
        self.requests.append(request)
        self.stops.rules[seq] = request.stop
        if request.parent is None:
            self.caches.expect(request.prompt)
        self.pending.append(seq)
        if self.bar is not None:
            self.bar.total += 1
            self.bar.refresh()
        return seq

    def release(self, seq: int, extra: Sequence[int] | None = None) -> None:
        """Let held request `seq` join; a later turn gets `extra`, the ids after its parent's
        tokens (the turn's end, a new user message, the assistant header)."""
        request = self.requests[seq]
        if request.parent is not None:
            if not extra:
                raise ValueError("a later turn needs at least one token after the completion")
            parent = self.made[request.parent]
            request.prompt = self.requests[request.parent].prompt + parent.token_ids + list(extra)
        request.held = False

    def drop(self, seq: int) -> None:
        """Held request `seq` never joins (its parent's kept cache is let go)."""
        request = self.requests[seq]
        self.pending.remove(seq)
        if request.parent is None:
            self.caches.refuse(request.prompt)
        else:
            self.kept.pop(request.parent, None)
        if self.bar is not None:
            self.bar.total -= 1
            self.bar.refresh()

    @property
    def busy(self) -> bool:
        """Requests queued or decoding."""
        return bool(self.pending or self.running)

    # --- decoding ----------------------------------------------------------------------------

    def step(self) -> Step:
        """A refill when a quarter of the slots are free, then one decoded token for every row."""
        new: list[int] = []
        if self.pending and self.batch_size - self.running >= max(1, self.batch_size // 4):
            unasked = [seq for seq in self.pending if self.requests[seq].held and seq not in self.asked_now]
            if unasked:
                self.asked_now.update(unasked)
                return Step(asked=unasked)
            self.asked_now.clear()
            new = self._joining(self.batch_size - self.running)
            if not (new or self.running):
                raise RuntimeError("sampling stalled: no running completion can settle the waiting requests")
        if new:
            self._join(new)
        if not self.running:
            return Step()
        return Step(finished=self._decode())

    def _joining(self, free: int) -> list[int]:
        """The first `free` queued requests not held, taken off the queue."""
        new = [seq for seq in self.pending if not self.requests[seq].held][:free]
        taken = set(new)
        self.pending = [seq for seq in self.pending if seq not in taken]
        return new

    def _join(self, new: list[int]) -> None:
        self.cache, self.inputs, self.rows = _drop_rows(self.cache, self.inputs, self.rows, self.done)
        prefixes = [self._cache_for(i) for i in new]
        joined = [type(layer).merge([prefix[n] for prefix in prefixes]) for n, layer in enumerate(prefixes[0])]
        if self.cache:
            for layer, extra in zip(self.cache, joined):
                layer.extend(extra)  # in place: the new rows go below the running ones
        else:
            self.cache = joined
        first = [self.requests[i].prompt[-1] for i in new]
        self.inputs = mx.concatenate([self.inputs, mx.array(first, dtype=mx.uint32)])
        self.rows += new
        self.running += len(new)
        for i in new:
            self.tokens[i], self.logprobs[i] = [], []

    def _cache_for(self, seq: int) -> list[Any]:
        request = self.requests[seq]
        if request.parent is None:
            return self.caches.take(request.prompt)
        begin = time.perf_counter()
        cache = self.kept.pop(request.parent)  # it joins the batch (a copy): not kept here
        rest = request.prompt[cache[0].offset:-1]  # the parent's last token (never fed) and the new ids
        if rest:
            from . import fastmath

            with fastmath.inference():
                self.model(mx.array(rest)[None], cache=cache)
            mx.eval([c.state for c in cache])
        self.stats.prefill_seconds += time.perf_counter() - begin
        return cache

    def _decode(self) -> list[tuple[int, Sample]]:
        logits = self.model(self.inputs[:, None], cache=self.cache)[:, -1, :]
        if self.normalise:
            logits = log_softmax(logits)
        self.inputs = self.sampler(logits).astype(mx.uint32)
        # without log-probs `chosen` only stands in for them in the loop below, never stored
        chosen = mx.take_along_axis(logits, self.inputs[:, None], axis=-1)[:, 0] if self.normalise else self.inputs
        mx.eval(self.inputs, chosen)  # one host sync per step
        finished = []
        for row, (token, lp) in enumerate(zip(self.inputs.tolist(), chosen.tolist())):
            seq = self.rows[row]
            if seq in self.done:
                continue
            ids = self.tokens[seq]
            ids.append(token)
            if self.normalise:
                self.logprobs[seq].append(lp)
            self.stats.generated_tokens += 1
            # the stop rule is asked before the limit, so a match on the last allowed token counts
            if token in self.eos or self.stops.check(seq, ids) or len(ids) >= self.max_tokens:
                self.done.add(seq)
                self.running -= 1
                finished.append((seq, self._finish(seq, row)))
        if self.bar is not None:
            self.bar.update(len(finished))
            rate = self.stats.generated_tokens / max(time.perf_counter() - self.start, 1e-9)
            self.bar.set_postfix(tok_s=f"{rate:.1f}", refresh=False)
        if 8 * (len(self.rows) - self.running) >= len(self.rows):
            self.cache, self.inputs, self.rows = _drop_rows(self.cache, self.inputs, self.rows, self.done)
        return finished

    def _finish(self, seq: int, row: int) -> Sample:
        # An EOS or a stop rule counts even when it came exactly at max_tokens; otherwise the
        # completion was cut off.
        ids, lps = self.tokens.pop(seq), self.logprobs.pop(seq)
        request = self.requests[seq]
        if ids and ids[-1] in self.eos:
            how, text_ids = EOS, ids[:-1]
        else:
            how, text_ids = (STOP if self.stops.matched(seq) else LENGTH), ids
        parent = self.made.get(request.parent) if request.parent is not None else None
        done = Sample(request.label, ids, self.tokenizer.decode(text_ids), lps, how, parent)
        if request.keep_cache:  # the later turn starts from this row's cache: taken now, before the batch drops it
            self.made[seq] = done
            self.kept[seq] = [layer.extract(row) for layer in self.cache]
            mx.eval([c.state for c in self.kept[seq]])
        self.stats.completions += 1
        self.stats.truncated += done.truncated
        self.stats.stopped += how == STOP
        self.stats.prompt_tokens += len(request.prompt)
        return done

    def close(self) -> SampleStats:
        """The run's totals (its wall time and peak memory up to now); closes the progress bar."""
        if self.bar is not None:
            self.bar.close()
        self.stats.seconds = time.perf_counter() - self.start
        self.stats.peak_memory_gb = mx.get_peak_memory() / 1e9
        return self.stats


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
    stop: Sequence[StopRule | None] | None = None,
    progress: bool = False,
    desc: str = "sampling",
) -> SamplingResult:
    """Sample `group_size` completions for every prompt (token-id lists) in one batched run
    (`Engine`): `groups[p]` holds prompt p's, in sampling order. `group_size` may also give each
    prompt its own count. `stop[p]`, when given, ends prompt p's completions early once its rule
    matches their text (they end like an EOS: not truncated; the tokens up to the match stay in
    the completion and its log-probs). A stop changes nothing before it; after it the batch
    holds other rows, so later random draws of the other completions differ from an unstopped
    run's. `groups[p]` keeps the order the completions were queued in."""
    sizes = [group_size] * len(prompts) if isinstance(group_size, int) else list(group_size)
    if len(sizes) != len(prompts) or min(sizes, default=1) < 1:
        raise ValueError("group_size (one per prompt, or one for all) must be at least 1")
    if stop is not None and len(stop) != len(prompts):
        raise ValueError("stop: one rule (or None) per prompt")
    engine = Engine(model, tokenizer, max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed,
                    batch_size=batch_size, share_prefix=share_prefix, logprobs=logprobs, progress=progress, desc=desc)
    result = SamplingResult([[] for _ in sizes], prompts=[list(p) for p in prompts])
    made: dict[int, Sample] = {}
    try:
        for p, size in enumerate(sizes):
            for _ in range(size):
                engine.submit(Request(result.prompts[p], stop[p] if stop is not None else None, label=p))
        while engine.busy:
            made.update(engine.step().finished)
    finally:
        result.stats = engine.close()
    for seq in sorted(made):
        result.groups[made[seq].prompt_index].append(made[seq])
    return result


class StopMatcher:
    """Per-sequence stop rules (sequence i follows `rules[i]`, None or absent for none), checked token by
    token: a token's own text is decoded once per token id and cached, and only a token holding
    a trigger character makes the sequence's whole text be decoded and judged (`tokenizer.decode`,
    the same text the finished Sample gets, so the rule and later code extraction agree)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.rules: dict[int, StopRule | None] = {}  # by sequence, as requests come
        self.pieces: dict[int, str] = {}
        self.hits: set[int] = set()

    def check(self, seq: int, ids: list[int]) -> bool:
        """True when sequence `seq`, whose tokens so far are `ids`, must stop now."""
        rule = self.rules.get(seq)
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
    """Prefix caches keyed by prompt, prefilled when a sequence takes one. Shared: one prefill
    per distinct prompt (a prompt queued several times, like a puzzle's calibration rounds, is
    prefilled once), kept only until every expected sequence of that prompt has taken it or been
    refused, so a run over hundreds of prompts never holds all their caches at once."""

    model: Any
    share: bool
    stats: SampleStats
    held: dict[tuple[int, ...], list[Any]] = field(default_factory=dict)
    remaining: dict[tuple[int, ...], int] = field(default_factory=dict)

    def expect(self, prompt: Sequence[int]) -> None:
        """One more sequence will take (or refuse) `prompt`'s cache."""
        key = tuple(prompt)
        self.remaining[key] = self.remaining.get(key, 0) + 1

    def take(self, prompt: Sequence[int]) -> list[Any]:
        """`prompt`'s prefix cache for one sequence (batch merging copies it, so one cache seeds many rows)."""
        key = tuple(prompt)
        start = time.perf_counter()
        cache = self.held.get(key) or prefill(self.model, list(key))
        self.stats.prefill_seconds += time.perf_counter() - start
        if self.share:
            self.held[key] = cache
        self.refuse(prompt)
        return cache

    def refuse(self, prompt: Sequence[int]) -> None:
        """One expected sequence of `prompt` will never take its cache."""
        key = tuple(prompt)
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
