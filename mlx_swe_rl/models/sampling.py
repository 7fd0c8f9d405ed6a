"""Batched sampling: G completions for each of many prompts in one continuous batch.

Built on mlx-lm's `BatchGenerator` (what `mlx_lm.batch_generate` uses), so all sequences of a
call share one KV-cached decode loop. Unlike `batch_generate` we keep the EOS token that ended
a completion (a trainer must reinforce stopping) and say which completions were truncated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import mlx.core as mx


@dataclass
class Sample:
    """One sampled completion.

    `token_ids` are the sampled ids exactly (never re-encoded), ending with the EOS token when
    the model stopped by itself; `text` is their decoding without that EOS. `logprobs[i]` is
    log p(token_ids[i]) under the sampling model at temperature 1, as mlx-lm reports it.
    """

    prompt_index: int
    token_ids: list[int]
    text: str
    logprobs: list[float]
    truncated: bool

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class SampleStats:
    """Totals of one `sample` call."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    peak_memory_gb: float = 0.0
    completions: int = 0
    truncated: int = 0

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class SamplingResult:
    """`groups[p]` holds the completions of prompt p, in sampling order."""

    groups: list[list[Sample]]
    stats: SampleStats = field(default_factory=SampleStats)


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
    group_size: int = 1,
    max_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = 0,
    batch_size: int = 32,
    share_prefix: bool = True,
    progress: bool = False,
    desc: str = "sampling",
) -> SamplingResult:
    """Sample `group_size` completions for every prompt (token-id lists) in one batched run.

    With `share_prefix` (and G > 1) each prompt is prefilled once and its KV cache is reused
    by its G completions, instead of G identical prefills. Reproducible for a given seed,
    model, prompt list and batch size. At temperature 0 the decode is greedy (all members of
    a group are then identical).
    """
    from mlx_lm.generate import BatchGenerator

    if group_size < 1 or max_tokens < 1:
        raise ValueError("group_size and max_tokens must be at least 1")
    if seed is not None:
        mx.random.seed(seed)
    eos = set(tokenizer.eos_token_ids)
    generator = BatchGenerator(
        model,
        max_tokens=max_tokens,
        stop_tokens=[[t] for t in eos],
        sampler=make_sampler_fn(temperature, top_p),
        completion_batch_size=batch_size,
        prefill_batch_size=min(batch_size, 8),
    )
    flat_prompts = [list(p) for p in prompts for _ in range(group_size)]
    owner = [i for i in range(len(prompts)) for _ in range(group_size)]
    stats = SampleStats(prompt_tokens=sum(len(p) for p in flat_prompts), completions=len(flat_prompts))
    caches = None
    start = time.perf_counter()  # the shared prefill counts as sampling time
    mx.reset_peak_memory()
    if share_prefix and group_size > 1:
        shared = [prefill(model, p) for p in prompts]
        caches = [shared[i] for i in owner]
        # Each completion then starts from its prompt's last token on top of the shared cache.
        flat_prompts = [p[-1:] for p in flat_prompts]
    tokens: dict[int, list[int]] = {}
    logprobs: dict[int, list[float]] = {}
    finished: dict[int, str] = {}
    bar = _progress_bar(len(flat_prompts), desc) if progress else None
    try:
        uids = generator.insert(flat_prompts, caches=caches)
        for uid in uids:
            tokens[uid], logprobs[uid] = [], []
        while responses := generator.next_generated():
            # One host sync per decode step for the chosen tokens' log-probs.
            picked = mx.stack([r.logprobs[r.token] for r in responses]).tolist()
            for r, lp in zip(responses, picked):
                tokens[r.uid].append(r.token)
                logprobs[r.uid].append(lp)
                if r.finish_reason is not None:
                    finished[r.uid] = r.finish_reason
                    if bar is not None:
                        bar.update(1)
            stats.generated_tokens += len(responses)
            if bar is not None:
                elapsed = time.perf_counter() - start
                bar.set_postfix(tok_s=f"{stats.generated_tokens / max(elapsed, 1e-9):.1f}", refresh=False)
    finally:
        generator.close()
        if bar is not None:
            bar.close()
    stats.seconds = time.perf_counter() - start
    stats.peak_memory_gb = mx.get_peak_memory() / 1e9

    groups: list[list[Sample]] = [[] for _ in prompts]
    for uid, prompt_index in zip(uids, owner):
        ids = tokens[uid]
        # A "stop" finish means the last token is an EOS; a sequence that hit max_tokens with
        # an EOS as its very last token also stopped by itself.
        stopped = bool(ids) and ids[-1] in eos
        text_ids = ids[:-1] if stopped else ids
        sample_ = Sample(prompt_index, ids, tokenizer.decode(text_ids), logprobs[uid], truncated=not stopped)
        stats.truncated += sample_.truncated
        groups[prompt_index].append(sample_)
    return SamplingResult(groups, stats)


def prefill(model: Any, prompt: list[int]) -> list[Any]:
    """The KV cache of `prompt` without its last token (which the generator feeds itself).
    Batch merging copies caches, so one cache can seed several sequences."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    if len(prompt) > 1:
        model(mx.array(prompt[:-1])[None], cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def _progress_bar(total: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="completion", dynamic_ncols=True, leave=False)
