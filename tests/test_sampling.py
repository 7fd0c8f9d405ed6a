"""Batched sampling (mlx_swe_rl.sampling) on the tiny random model.

References are computed independently: greedy decoding by hand with full (non-cached)
forward passes, mlx-lm's own `batch_generate`, and a full forward's log-softmax.
"""

from __future__ import annotations

import random

import mlx.core as mx
import pytest

from mlx_swe_rl.models.sampling import encode_chat, sample

MAX_TOKENS = 16


class EosBias:
    """The tiny model with a constant bias on the EOS logit, so sampled completions sometimes
    stop by themselves (a random 512-token model almost never does). Wraps, never mutates."""

    def __init__(self, model, eos_id: int, bias: float):
        self._model, self._eos_id, self._bias = model, eos_id, bias

    def __call__(self, *args, **kwargs):
        logits = self._model(*args, **kwargs)
        bias = mx.zeros((logits.shape[-1],)).at[self._eos_id].add(self._bias)
        return logits + bias.astype(logits.dtype)

    def __getattr__(self, name):
        return getattr(self._model, name)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    """Short prompts of different lengths (so batching pads them) made of ordinary tokens."""
    rng = random.Random(0)
    return [[rng.randrange(3, 500) for _ in range(rng.randrange(3, 12))] for _ in range(4)]


@pytest.fixture(scope="module")
def eos_id(tiny_model) -> int:
    _, tokenizer = tiny_model
    (eos,) = tokenizer.eos_token_ids
    assert tokenizer.decode([eos]) == "<|im_end|>" or tokenizer.convert_ids_to_tokens(eos) == "<|im_end|>"
    return eos


def greedy_by_hand(model, prompt: list[int], steps: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(steps):
        nxt = model(mx.array([seq]))[0, -1].argmax().item()
        out.append(nxt)
        seq.append(nxt)
    return out


def full_log_probs(model, prompt: list[int], completion: list[int]) -> list[float]:
    """log p(completion[i]) from one full forward pass over prompt + completion."""
    logits = model(mx.array([prompt + completion]))[0].astype(mx.float32)
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    n = len(prompt)
    positions = mx.arange(n - 1, n - 1 + len(completion))
    return logp[positions, mx.array(completion)].tolist()


@pytest.mark.parametrize("batch_size", [32, 3])
def test_greedy_groups_in_prompt_order_equal_greedy_by_hand(tiny_model, prompts, batch_size):
    model, tokenizer = tiny_model
    steps = 8
    expected = [greedy_by_hand(model, p, steps) for p in prompts]
    assert len({tuple(e) for e in expected}) == len(prompts)  # distinct, so order is checked
    result = sample(model, tokenizer, prompts, group_size=3, max_tokens=steps, temperature=0.0,
                    batch_size=batch_size)
    assert len(result.groups) == len(prompts)
    for p, group in enumerate(result.groups):
        assert len(group) == 3
        assert [s.prompt_index for s in group] == [p, p, p]
        for s in group:
            # a random model may stop early by emitting EOS: compare the common prefix length
            assert s.token_ids == expected[p][:len(s.token_ids)]
            assert s.truncated == (len(s.token_ids) == steps and s.token_ids[-1] not in tokenizer.eos_token_ids)


def test_greedy_equals_mlx_lm_batch_generate(tiny_model, prompts):
    from mlx_lm import batch_generate

    model, tokenizer = tiny_model
    ours = sample(model, tokenizer, prompts, group_size=1, max_tokens=10, temperature=0.0)
    ref = batch_generate(model, tokenizer, prompts, max_tokens=10, return_token_ids=True)
    eos = set(tokenizer.eos_token_ids)
    for group, ref_ids in zip(ours.groups, ref.token_ids):
        ids = group[0].token_ids
        # batch_generate drops the EOS that stopped a sequence; sample keeps it
        assert (ids[:-1] if ids and ids[-1] in eos else ids) == list(ref_ids)


def test_temperature_samples_equal_mlx_lm_batch_generate_seeded(tiny_model, eos_id, prompts):
    """With no early stops (EOS suppressed), every step draws from mlx-lm's sampler over the
    same batch as `batch_generate`: the same seed gives the same tokens."""
    from mlx_lm import batch_generate

    from mlx_swe_rl.models.sampling import make_sampler_fn

    model, tokenizer = tiny_model
    no_eos = EosBias(model, eos_id, -1e9)
    mx.random.seed(11)
    ref = batch_generate(no_eos, tokenizer, prompts, max_tokens=10, sampler=make_sampler_fn(1.0),
                         return_token_ids=True)
    ours = sample(no_eos, tokenizer, prompts, group_size=1, max_tokens=10, temperature=1.0, seed=11)
    assert [g[0].token_ids for g in ours.groups] == ref.token_ids
    assert len({tuple(t) for t in ref.token_ids}) == len(prompts)


def test_batches_larger_than_the_queue_and_refills(tiny_model, eos_id, prompts):
    """Many sequences through a small batch (rows finish at different steps, the batch is
    refilled): every completion is the same as when it decodes alone, greedy."""
    model, tokenizer = tiny_model
    biased = EosBias(model, eos_id, 3.0)
    together = sample(biased, tokenizer, prompts * 3, group_size=2, max_tokens=MAX_TOKENS, temperature=0.0,
                      batch_size=5)
    lengths = {s.num_tokens for g in together.groups for s in g}
    assert len(lengths) > 1  # rows really finished at different steps
    for prompt, group in zip(prompts * 3, together.groups):
        alone = sample(biased, tokenizer, [prompt], group_size=1, max_tokens=MAX_TOKENS, temperature=0.0)
        assert [s.token_ids for s in group] == [alone.groups[0][0].token_ids] * 2


def test_stopped_and_truncated_completions(tiny_model, eos_id):
    model, tokenizer = tiny_model
    biased = EosBias(model, eos_id, 4.0)
    chat = encode_chat(tokenizer, [{"role": "user", "content": "Fix the bug in sum_list."}])
    result = sample(biased, tokenizer, [chat, chat[-7:]], group_size=6, max_tokens=MAX_TOKENS,
                    temperature=1.0, seed=0)
    flat = [s for g in result.groups for s in g]
    stopped = [s for s in flat if not s.truncated]
    truncated = [s for s in flat if s.truncated]
    assert stopped and truncated, [(s.num_tokens, s.truncated) for s in flat]
    for s in stopped:
        assert s.token_ids[-1] == eos_id
        assert eos_id not in s.token_ids[:-1]  # generation ends at the first EOS
        assert 1 <= s.num_tokens <= MAX_TOKENS
        assert s.text == tokenizer.decode(s.token_ids[:-1])
        assert "<|im_end|>" not in s.text
    for s in truncated:
        assert s.num_tokens == MAX_TOKENS
        assert eos_id not in s.token_ids
        assert s.text == tokenizer.decode(s.token_ids)
    for s in flat:
        assert len(s.logprobs) == s.num_tokens
    stats = result.stats
    assert stats.completions == 12
    assert stats.truncated == len(truncated)
    assert stats.generated_tokens == sum(s.num_tokens for s in flat)
    assert stats.prompt_tokens == 6 * (len(chat) + 7)
    assert stats.seconds > 0 and stats.tokens_per_second > 0


def test_logprobs_match_full_forward(tiny_model, eos_id, prompts):
    model, tokenizer = tiny_model
    biased = EosBias(model, eos_id, 4.0)  # so EOS tokens' log-probs are checked too
    result = sample(biased, tokenizer, prompts, group_size=3, max_tokens=MAX_TOKENS, temperature=1.0, seed=3)
    checked = 0
    for prompt, group in zip(prompts, result.groups):
        for s in group:
            assert len(s.logprobs) == s.num_tokens
            expected = full_log_probs(biased, prompt, s.token_ids)
            assert s.logprobs == pytest.approx(expected, abs=1e-3)
            assert all(lp <= 0 for lp in s.logprobs)
            checked += s.num_tokens
    assert checked > 0


def test_same_seed_same_samples_different_seed_different(tiny_model, prompts):
    model, tokenizer = tiny_model

    def ids(seed):
        res = sample(model, tokenizer, prompts[:2], group_size=2, max_tokens=12, temperature=1.0, seed=seed)
        return [s.token_ids for g in res.groups for s in g]

    first = ids(7)
    assert ids(7) == first
    assert ids(8) != first
    # within one call the members of a group are sampled independently
    assert first[0] != first[1]


def test_invalid_arguments(tiny_model, prompts):
    model, tokenizer = tiny_model
    with pytest.raises(ValueError):
        sample(model, tokenizer, prompts, group_size=0, max_tokens=4)
    with pytest.raises(ValueError):
        sample(model, tokenizer, prompts, group_size=1, max_tokens=0)


def test_encode_chat_uses_the_template(tiny_model):
    _, tokenizer = tiny_model
    messages = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "def f(): pass"}]
    ids = encode_chat(tokenizer, messages)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tail = tokenizer.encode("assistant\n", add_special_tokens=False)
    assert ids[-len(tail) - 1:] == [start, *tail]  # the generation prompt closes the sequence
    assert ids.count(start) == 3 and ids.count(end) == 2
    assert tokenizer.decode(ids) == ("<|im_start|>system\nYou fix bugs.<|im_end|>\n"
                                     "<|im_start|>user\ndef f(): pass<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_without_logprobs_the_same_tokens(tiny_model, eos_id, prompts, temperature):
    """`logprobs=False` (what rollouts ask for) changes no token; greedy then skips the
    vocabulary log-softmax and reports no log-probabilities."""
    model, tokenizer = tiny_model
    biased = EosBias(model, eos_id, 3.0)
    kwargs = dict(group_size=2, max_tokens=MAX_TOKENS, temperature=temperature, seed=5, batch_size=3)
    with_lp = sample(biased, tokenizer, prompts, **kwargs)
    without = sample(biased, tokenizer, prompts, logprobs=False, **kwargs)
    pairs = [(a, b) for ga, gb in zip(with_lp.groups, without.groups) for a, b in zip(ga, gb)]
    assert [a.token_ids for a, _ in pairs] == [b.token_ids for _, b in pairs]
    assert [a.truncated for a, _ in pairs] == [b.truncated for _, b in pairs]
    assert all(len(a.logprobs) == a.num_tokens for a, _ in pairs)
    if temperature == 0:
        assert all(b.logprobs == [] for _, b in pairs)


def test_prompts_are_prefilled_as_they_join_and_released(tiny_model, monkeypatch, prompts):
    """A prompt's KV cache is made when its first completion joins the batch and dropped once
    its last one has taken it or been refused: a long run never holds every prompt's cache.
    Copies of one prompt share one prefill."""
    import gc
    import weakref

    from mlx_swe_rl.models import sampling

    model, tokenizer = tiny_model
    made, real_prefill = [], sampling.prefill

    def recording_prefill(model_, prompt):
        cache = real_prefill(model_, prompt)
        made.append(weakref.ref(cache[0]))
        return cache

    monkeypatch.setattr(sampling, "prefill", recording_prefill)
    stats = sampling.SampleStats()
    caches = sampling.PrefixCaches(model, True, stats)
    for prompt in (prompts[0], prompts[0], prompts[1], prompts[1], prompts[0]):  # prompt 0 queued 3 times
        caches.expect(prompt)
    first = caches.take(prompts[0])
    assert len(made) == 1 and caches.take(prompts[0]) is first  # shared, and prompt 1 not prefilled yet
    assert caches.take(prompts[0]) is first  # the third copy of prompt 0
    del first
    gc.collect()
    assert made[0]() is None  # every sequence of that prompt took it: nothing holds it any more
    caches.take(prompts[1])
    caches.refuse(prompts[1])
    gc.collect()
    assert len(made) == 2 and made[1]() is None and stats.prefill_seconds > 0
    unshared = sampling.PrefixCaches(model, False, stats)
    unshared.expect(prompts[0])
    unshared.expect(prompts[0])
    assert unshared.take(prompts[0]) is not unshared.take(prompts[0]) and len(made) == 4


def run_engine(engine, settle=lambda seq: None, finished=lambda seq, s: None) -> dict:
    """The plain caller loop: step until done, settling asked requests (`settle(seq)`: True
    release, False drop, None leave held) and handing every finished sample to `finished`."""
    made = {}
    while engine.busy:
        step = engine.step()
        for seq in step.asked:
            verdict = settle(seq)
            if verdict is not None:
                engine.release(seq) if verdict else engine.drop(seq)
        for seq, s in step.finished:
            made[seq] = s
            finished(seq, s)
    engine.close()
    return made


def test_held_requests_wait_or_are_dropped_and_sizes_per_prompt(tiny_model, eos_id, prompts):
    """A held request can wait until other completions finish (left held), be dropped, or be
    released; prompts can have their own number of completions; the caller sees every
    completion as it finishes."""
    from mlx_swe_rl.models.sampling import Engine, Request

    model, tokenizer = tiny_model
    biased = EosBias(model, eos_id, 3.0)
    asked, seen = [], []
    engine = Engine(biased, tokenizer, max_tokens=MAX_TOKENS, temperature=0.0, batch_size=4)
    label = {}
    for p, size in enumerate([3, 2, 2]):
        for _ in range(size):
            label[engine.submit(Request(prompts[p], held=p > 0, label=p))] = p

    def settle(seq):
        p = label[seq]
        asked.append(p)
        if p == 2:  # only once all of prompt 0's completions are done
            return True if sum(s.prompt_index == 0 for s in seen) == 3 else None
        return p != 1

    made = run_engine(engine, settle, lambda seq, s: seen.append(s))
    groups = [[made[seq] for seq in sorted(made) if made[seq].prompt_index == p] for p in range(3)]
    assert [len(g) for g in groups] == [3, 0, 2]
    assert asked.count(2) > 2  # held back at least once (asked for each of its 2 requests each time)
    assert sorted(id(s) for s in seen) == sorted(id(s) for g in groups for s in g)
    assert engine.stats.completions == 5
    alone = sample(biased, tokenizer, [prompts[2]], group_size=1, max_tokens=MAX_TOKENS, temperature=0.0)
    assert [s.token_ids for s in groups[2]] == [alone.groups[0][0].token_ids] * 2
    stalled = Engine(biased, tokenizer, max_tokens=4)
    stalled.submit(Request(prompts[0]))
    stalled.submit(Request(prompts[1], held=True))
    with pytest.raises(RuntimeError, match="stalled"):
        run_engine(stalled)


def later_turns(engine, extra, keep) -> dict:
    """A caller loop that gives a finished completion a later turn (held until it could join)
    while `keep(sample)`, released with `extra(parent)` ids."""
    from mlx_swe_rl.models.sampling import Request

    parents, made = {}, {}
    while engine.busy:
        step = engine.step()
        for seq in step.asked:
            engine.release(seq, extra(parents[seq]))
        for seq, s in step.finished:
            made[seq] = s
            if keep(s):
                later = engine.submit(Request(stop=engine.requests[seq].stop, parent=seq, held=True,
                                              label=s.prompt_index))
                parents[later] = s
    engine.close()
    return made


@pytest.mark.parametrize("batch_size", [32, 2])
def test_later_turns_decode_from_the_finished_completion(tiny_model, prompts, batch_size):
    """A later turn continues the finished row's own KV cache with the appended ids: greedy, it
    equals greedy decoding of the whole conversation by hand."""
    from mlx_swe_rl.models.sampling import Engine, Request

    model, tokenizer = tiny_model
    asked = []

    def extra(parent):
        asked.append(parent)
        return [5, 6, 7]

    engine = Engine(model, tokenizer, max_tokens=6, temperature=0.0, batch_size=batch_size)
    for p, prompt in enumerate(prompts):
        for _ in range(2):
            engine.submit(Request(prompt, keep_cache=True, label=p))
    made = later_turns(engine, extra, keep=lambda s: s.parent is None)
    firsts = [s for s in made.values() if s.parent is None]
    later = {seq: s for seq, s in made.items() if s.parent is not None}
    assert len(firsts) == 8 and len(later) == 8 and len(asked) == 8
    for seq, s in later.items():
        parent = s.parent
        assert parent is not None and parent.parent is None
        prompt = engine.requests[seq].prompt
        assert prompt == prompts[parent.prompt_index] + parent.token_ids + [5, 6, 7]
        assert s.token_ids == greedy_by_hand(model, prompt, 6)
    assert engine.stats.completions == 16


def test_a_later_turn_keeps_the_stop_rule_and_needs_ids(tiny_model, prompts):
    from mlx_swe_rl.models.sampling import Engine, Request

    model, tokenizer = tiny_model

    class AtOnce:
        triggers = "".join(chr(c) for c in range(32, 127))

        def done(self, text):
            return True

    engine = Engine(model, tokenizer, max_tokens=6)
    engine.submit(Request(prompts[0], AtOnce(), keep_cache=True))
    made = later_turns(engine, lambda parent: [9], keep=lambda s: s.parent is None)
    first, second = made[0], made[1]
    assert second.parent is first and first.finish == second.finish == "stop"
    engine = Engine(model, tokenizer, max_tokens=3)
    engine.submit(Request(prompts[0], keep_cache=True))
    with pytest.raises(ValueError, match="at least one token"):
        later_turns(engine, lambda parent: [], keep=lambda s: s.parent is None)
