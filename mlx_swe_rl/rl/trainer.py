"""The on-policy GRPO loop: sample from the policy being trained, score, compute group
advantages, update; the run directory it records everything in is rundir.py's.

One step, top to bottom (`run_step`):
  1. take the step's puzzles (passrates.py: a seeded permutation per epoch, or the most
     learnable ones by their pass-rate estimates; either way resume keeps the order);
  2. sample G completions per puzzle from the current policy (or the initial weights in
     `frozen` mode) and score them with the one shared scorer; with dynamic sampling, groups
     whose answers all pass or all fail are replaced by groups of spare puzzles, which join
     the same continuous batch (`dynamic_rollouts`);
  3. group advantages; zero-variance groups (and optionally truncated completions) drop out;
  4. reference log-probs (adapters off, or the frozen copy) when beta > 0, and old-policy
     log-probs when mu > 1, from training-style forwards without gradient;
  5. mu times: accumulate gradients over micro-batches, clip, check finite, AdamW update.

Data-parallel (`mlx.launch ... python -m mlx_swe_rl.train`, see distributed.py): each rank
samples and scores its share of the step's puzzles (whole puzzles, so the advantages are the
same), the loss normalisers and gradients are summed over all ranks, so every rank applies the
update one process would; rank 0 alone writes the run directory and evaluates. Every rank
keeps the same pass-rate estimates (from all ranks' rollouts), so all choose the same puzzles.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_map, tree_unflatten

from . import distributed as dist
from .config import Config
from .grpo import grpo_objective, group_advantages, token_weights
from .policy import Entry, GroupBatch, Policy, PromptStates, build_policy, completion_pass, entries, prompt_states
from ..puzzles.format import Puzzle
from .passrates import PassRateError, choose
from .reporter import Reporter
from ..runfiles import RunInUseError, StepRecord, run_in_use
from .rollouts import Episode, RolloutBatch, collect_rollouts, dynamic_rollouts, informative
from .rundir import TrainingError, check_before_loading, eval_puzzles, open_run_dir, training_puzzles
from .selection import SelectionError, select_training_puzzles
from .start import environments, starting_point
from ..models import fastmath
from ..models.sampling import SampleStats


# --- seeds -------------------------------------------------------------------------------------

def step_seed(seed: int, step: int, rank: int = 0) -> int:
    """The RNG seed of one step (sampling and dropout), derived so resume reproduces it; each
    rank of a data-parallel run gets its own (rank 0 the single-process one)."""
    return (seed * 1_000_003 + step * 7919 + rank * 104_729) % (2**31)


def make_optimizer(cfg: Config) -> optim.Optimizer:
    o = cfg.optim
    after = max(cfg.train.steps - o.warmup_steps, 1)
    main = optim.cosine_decay(o.lr, after) if o.schedule == "cosine" else (lambda _: mx.array(o.lr))
    if o.warmup_steps > 0:
        # Starts at lr / (warmup + 1), not 0: a zero first step would waste its rollouts.
        warmup = optim.linear_schedule(o.lr / (o.warmup_steps + 1), o.lr, o.warmup_steps)
        lr = optim.join_schedules([warmup, main], [o.warmup_steps])
    else:
        lr = main
    return optim.AdamW(learning_rate=lr, weight_decay=o.weight_decay)


# --- one step ----------------------------------------------------------------------------------

@dataclass
class LossGroup:
    """The completions of one prompt that enter the loss, with advantages and weights. A
    completion is every token after the prompt (a multi-turn episode's turns and the bridges
    between them); `masks` marks the model's own tokens, the only ones the loss reads."""

    prompt: list[int]
    completions: list[list[int]] = field(default_factory=list)
    masks: list[list[float]] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    # Each completion's share in per-token diagnostics (entropy, KL, clipping): the mean over
    # completions of their token means, whatever the loss aggregation.
    stat_weights: list[float] = field(default_factory=list)


@dataclass
class MicroBatch:
    """Completions of one prompt that go through one forward/backward, with their advantages,
    loss weights and diagnostic weights."""

    batch: GroupBatch
    advantages: mx.array
    weights: mx.array
    stat_weights: mx.array
    entry: Entry | None = None  # where its passes start, when the bottom blocks are frozen (`with_entries`)


def micro_batches(group: LossGroup, size: int) -> list[MicroBatch]:
    """At most `size` of the group's completions per micro-batch. A group that needs several is
    cut longest first, so each micro-batch holds completions of like length and pads little;
    the loss sums over completions, so their order does not change it. A group that fits one
    micro-batch keeps its order (and its committed seeded histories their exact arithmetic)."""
    n = len(group.completions)
    order = sorted(range(n), key=lambda i: -len(group.completions[i])) if n > size else list(range(n))
    out = []
    for start in range(0, n, size):
        rows = order[start:start + size]
        out.append(MicroBatch(GroupBatch.build(group.prompt, [group.completions[i] for i in rows],
                                               [group.masks[i] for i in rows]),
                              mx.array([group.advantages[i] for i in rows]), mx.array([group.weights[i] for i in rows]),
                              mx.array([group.stat_weights[i] for i in rows])))
    return out


def with_entries(model: nn.Module, micro: list[MicroBatch], depth: int) -> list[MicroBatch]:
    """One group's micro-batches, each with its `Entry` at block `depth` (`Policy.shared_depth`:
    the bottom blocks hold nothing trainable, LoRA on the last N blocks): those blocks then run
    once per group, for the policy and the reference alike, and no backward goes through them."""
    return [replace(m, entry=e) for m, e in zip(micro, entries(model, [m.batch for m in micro], depth))]


def scorable(group: list[Episode]) -> bool:
    """No error verdict among the group's answers."""
    return not any(r.error for r in group)


@dataclass(frozen=True)
class LossCounts:
    """What entered the loss this step, over all ranks of a data-parallel run."""

    zero_var_frac: float  # groups left out: equal rewards (or, with dynamic sampling, not mixed) or errors
    loss_completions: int
    groups_sampled: int
    groups_kept: int


def loss_inputs(rollouts: RolloutBatch, cfg: Config) -> tuple[list[LossGroup], LossCounts]:
    """Advantages per group, then the completions that carry signal, with per-completion weights.
    The weights' normalisers and the counts cover the whole step, over all ranks of a
    data-parallel run."""
    advantages, valid = [], []
    # A group with an error verdict (its puzzle could not be scored) says nothing about its
    # answers: its rewards are all 0, so it has no variance, and it counts as such regardless.
    # With dynamic sampling a group must also be mixed by the binary outcome: all-pass or
    # all-fail answers whose shaped rewards differ would push on format, not on correctness
    # (verl's "phantom gradients"); without it the reward's variance alone decides, as before.
    keep = informative if cfg.train.dynamic_sampling.enabled else scorable
    if rollouts.groups:  # a rank may have no puzzles this step
        rewards = mx.array([[r.reward for r in group] for group in rollouts.groups])
        adv, ok = group_advantages(rewards, cfg.grpo.advantage)
        advantages = adv.tolist()
        valid = [bool(v) and keep(group) for v, group in zip(ok.tolist(), rollouts.groups)]
    groups = []
    for prompt, group, group_adv, ok in zip(rollouts.prompts, rollouts.groups, advantages, valid):
        if not ok:
            continue
        kept = LossGroup(prompt)
        for rollout, a in zip(group, group_adv):
            if (cfg.grpo.mask_truncated and rollout.sample.truncated) or not rollout.sample.token_ids or rollout.dropped:
                continue
            ids, mask = rollout.sequence()
            kept.completions.append(ids)
            kept.masks.append(mask)
            kept.advantages.append(a)
        if kept.completions:
            groups.append(kept)
    lengths = [int(sum(m)) for g in groups for m in g.masks]  # the model's tokens: the loss normaliser
    whole = dist.all_sum({"groups": len(valid), "valid": sum(valid), "kept": len(lengths), "tokens": sum(lengths)})

    def weights_of(aggregation: str) -> Iterator[float]:
        return iter(token_weights(mx.array(lengths or [0]), aggregation, cfg.sampling.max_tokens,
                                  total_kept=int(whole["kept"]), total_tokens=int(whole["tokens"])).tolist())

    weights, stat_weights = weights_of(cfg.grpo.aggregation), weights_of("seq_mean_token_mean")
    for g in groups:
        g.weights = [next(weights) for _ in g.completions]
        g.stat_weights = [next(stat_weights) for _ in g.completions]
    counts = LossCounts(zero_var_frac=1.0 - whole["valid"] / whole["groups"], loss_completions=int(whole["kept"]),
                        groups_sampled=int(whole["groups"]), groups_kept=int(whole["valid"]))
    return groups, counts


def no_grad_log_probs(model: nn.Module, micro: list[MicroBatch]) -> list[mx.array]:
    """Training-style forward (eval mode: no dropout) without gradient of a group's micro-batches:
    its prompt runs once, and each micro-batch's completions attend to its keys and values."""
    was_training = model.training
    model.eval()
    with fastmath.inference():  # never differentiated: the fast prompt-length attention may run
        states = prompt_states(model, micro[0].batch.prompt, micro[0].entry)
        out = []
        for m in micro:
            logp = mx.stop_gradient(completion_pass(model, states, m.batch, entry=m.entry)[0])
            mx.eval(logp)
            out.append(logp)
    if was_training:
        model.train()
    return out


def accumulate(total: Any, part: Any, sums: dict[str, float] | None = None, loss: mx.array | None = None,
               stats: dict[str, mx.array] | None = None) -> Any:
    """total + part, leaf by leaf (None: nothing yet), evaluated with the micro-batch's `loss` and
    `stats` (added to `sums`), so the micro-batch's graph is released when it returns."""
    total = part if total is None else tree_map(mx.add, total, part)
    mx.eval(total, loss, stats)
    if sums is not None:
        for key, value in {"loss": loss, **stats}.items():
            sums[key] = sums.get(key, 0.0) + value.item()
    return total


def group_gradients(model: nn.Module, loss_fn: Callable, micro: list[MicroBatch], olds: list, refs: list,
                    sums: dict[str, float]) -> Any:
    """The gradient of the loss over one group's micro-batches (trainable parameters), adding its
    diagnostics to `sums`.

    A group in one micro-batch is one forward/backward over prompt and completions. A group cut
    into several would otherwise run its prompt forward and backward once per micro-batch; here
    the prompt runs once without gradient, each micro-batch's backward also returns the gradient
    with respect to the prompt's keys, values and last hidden state, and those are summed and
    carried back through the prompt in one vector-Jacobian product. The same gradient, with the
    prompt's backward done once."""
    if len(micro) == 1:
        (loss, stats), grads = nn.value_and_grad(model, loss_fn)(micro[0], olds[0], refs[0], None)
        return accumulate(None, grads, sums, loss, stats)
    params = model.trainable_parameters()
    names, leaves = zip(*tree_flatten(params))

    def with_leaves(arrays: Any) -> None:
        model.update(tree_unflatten(list(zip(names, arrays))))

    states = prompt_states(model, micro[0].batch.prompt, micro[0].entry)
    mx.eval(states.arrays())

    def micro_loss(leaf_list: list[mx.array], state_arrays: list[mx.array], m: MicroBatch, old: Any, ref: Any):
        with_leaves(leaf_list)
        return loss_fn(m, old, ref, PromptStates.from_arrays(state_arrays))

    value_and_grads = mx.value_and_grad(micro_loss, argnums=(0, 1))
    summed = None  # (gradient of the parameters, gradient of the prompt's states)
    for m, old, ref in zip(micro, olds, refs):
        (loss, stats), part = value_and_grads(list(leaves), states.arrays(), m, old, ref)
        summed = accumulate(summed, part, sums, loss, stats)
    leaf_grads, state_grads = summed

    def prompt_forward(*arrays: mx.array) -> list[mx.array]:
        with_leaves(arrays)
        return prompt_states(model, micro[0].batch.prompt, micro[0].entry).arrays()

    _, through_prompt = mx.vjp(prompt_forward, list(leaves), state_grads)
    model.update(params)  # the real parameters back, not the transformations' copies
    grads = accumulate(leaf_grads, through_prompt)
    return tree_unflatten(list(zip(names, grads)))


def run_updates(policy: Policy, optimizer: optim.Optimizer, groups: list[LossGroup]) -> dict[str, float]:
    """mu optimizer updates on one batch of rollouts; returns the loss diagnostics. Data-parallel:
    gradients and loss sums are summed over the ranks before clipping, so all ranks apply the
    same update (a rank with no `groups` contributes zeros)."""
    cfg = policy.config
    g = cfg.grpo
    model = policy.model
    need_ref = g.beta > 0
    start = time.perf_counter()
    batches = [micro_batches(group, cfg.train.micro_batch_size) for group in groups]
    if depth := policy.shared_depth():
        batches = [with_entries(model, micro, depth) for micro in batches]
    refs, olds = [], []
    for micro in batches:
        if need_ref:
            with policy.reference_logits_model() as reference:
                refs.append(no_grad_log_probs(reference, micro))
        else:
            refs.append([None] * len(micro))
        olds.append(no_grad_log_probs(model, micro) if g.num_iterations > 1 else [None] * len(micro))

    def loss_fn(m: MicroBatch, old: mx.array | None, ref: mx.array | None, states: PromptStates | None):
        batch = m.batch
        states = states or prompt_states(model, batch.prompt, m.entry)
        logp, entropy = completion_pass(model, states, batch, with_entropy=True, entry=m.entry)
        # mu = 1: the sampling policy is the current one, ratio == 1 but the gradient flows.
        old = mx.stop_gradient(logp) if old is None else old
        loss, stats = grpo_objective(logp, old, ref, m.advantages, batch.mask(), m.weights, beta=g.beta,
                                     eps_low=g.clip_low, eps_high=g.clip_high, ratio_level=g.ratio_level,
                                     stat_weights=m.stat_weights)
        stats["entropy"] = (entropy * m.stat_weights[:, None] * batch.mask()).sum()
        return loss, stats

    model.train()
    totals: dict[str, float] = {"reference_s": time.perf_counter() - start}
    keys = ("loss", "policy_loss", "clip_frac", "entropy") + (("kl",) if need_ref else ())
    for iteration in range(g.num_iterations):
        grads, sums = None, dict.fromkeys(keys, 0.0)
        for micro, old, ref in zip(batches, olds, refs):
            grads = accumulate(grads, group_gradients(model, loss_fn, micro, old, ref, sums))
        if grads is None:
            grads = tree_map(mx.zeros_like, model.trainable_parameters())
        grads, sums = dist.all_sum_tree(grads), dist.all_sum(sums)  # the whole step's (no-ops on one rank)
        if cfg.optim.max_grad_norm > 0:
            grads, norm = optim.clip_grad_norm(grads, cfg.optim.max_grad_norm)
        else:
            norm = mx.sqrt(sum((v * v).sum() for _, v in tree_flatten(grads)))
        mx.eval(grads, norm)  # frees the unclipped sum before the optimizer allocates its outputs
        norm = norm.item()
        if not (math.isfinite(sums["loss"]) and math.isfinite(norm)):
            raise TrainingError(f"non-finite loss ({sums['loss']}) or gradient norm ({norm}) at update "
                                f"{iteration + 1}; this update was not applied (lower optim.lr?)")
        optimizer_start = time.perf_counter()
        optimizer.update(model, grads)
        mx.eval(model.trainable_parameters(), optimizer.state)
        totals["optimizer_s"] = totals.get("optimizer_s", 0.0) + time.perf_counter() - optimizer_start
        # Mean over the mu updates: the first always has ratio 1, so it alone shows no clipping.
        for key, value in {**sums, "grad_norm": norm}.items():
            totals[key] = totals.get(key, 0.0) + value / g.num_iterations
    return totals


def run_step(policy: Policy, optimizer: optim.Optimizer, env: Any, puzzles: list[Puzzle], step: int,
             progress: bool = False, spare: list[Puzzle] = ()) -> tuple[StepRecord, RolloutBatch]:
    """One GRPO step; returns the history record and the rollouts. Data-parallel, this rank
    samples its share of `puzzles` (its rollouts come back), and the record covers all ranks.
    With `train.dynamic_sampling` on (one process only), groups that cannot teach are replaced
    by groups of `spare` puzzles, in order, in the same batch (`dynamic_rollouts`, one sampling
    seed); the record's `puzzles` lists them all. Off, the step is `collect_rollouts` alone."""
    cfg = policy.config
    start = time.perf_counter()
    mx.reset_peak_memory()
    seed = step_seed(cfg.seed, step, dist.rank())
    mx.random.seed(seed)
    policy.model.eval()
    mine = dist.shard(puzzles)  # whole puzzles, so a group's advantages stay on one rank
    rollouts = RolloutBatch([], [], [], SampleStats())
    extra = 0  # replacement groups (dynamic sampling)
    if mine:
        with policy.sampling_model() as sampler:
            plan, desc, ds = cfg.train_sampling(seed), f"step {step} sampling", cfg.train.dynamic_sampling
            if ds.enabled:
                rollouts, extra = dynamic_rollouts(sampler, policy.tokenizer, env, mine, list(spare), plan,
                                                   cap=ds.max_extra_groups or cfg.train.puzzles_per_step,
                                                   progress=progress, desc=desc)
            else:
                rollouts = collect_rollouts(sampler, policy.tokenizer, env, mine, plan, progress=progress, desc=desc)
    groups, counts = loss_inputs(rollouts, cfg)
    update_start = time.perf_counter()
    # counted over all ranks: they all take part in the update
    losses = LossStats(**run_updates(policy, optimizer, groups)) if counts.loss_completions else LossStats()
    update_seconds = time.perf_counter() - update_start
    episodes = EpisodeTotals.of(rollouts, extra)
    timings = StepTimings.of(rollouts, losses, update_seconds)
    return StepRecord(
        step=step, reward_mean=episodes.reward / episodes.n, solve_rate=episodes.solved / episodes.n,
        loss=losses.loss, policy_loss=losses.policy_loss, kl=losses.kl, entropy=losses.entropy,
        clip_frac=losses.clip_frac, grad_norm=losses.grad_norm,
        zero_var_frac=counts.zero_var_frac, loss_completions=counts.loss_completions,
        groups_sampled=counts.groups_sampled, groups_kept=counts.groups_kept, extra_groups=extra,
        sampled_tokens=int(episodes.tokens), extra_tokens=int(episodes.extra_tokens),
        completion_len=episodes.tokens / episodes.n, turns=episodes.turns / episodes.n,
        truncation_rate=episodes.truncated / episodes.n, errored=int(episodes.errored),
        tokens_per_s=episodes.tokens_per_s, lr=learning_rate(optimizer),
        sample_s=timings.sample_s, prefill_s=timings.prefill_s, score_s=timings.score_s,
        reference_s=timings.reference_s, optimizer_s=timings.optimizer_s, update_s=timings.update_s,
        step_s=time.perf_counter() - start, peak_memory_gb=timings.peak_memory_gb,
        puzzles=[p.id for p in puzzles] + [p.id for p in spare[:extra]],
    ), rollouts


@dataclass(frozen=True)
class LossStats:
    """The update's diagnostics (`run_updates`); all None in a step without completions in the
    loss (no update), `kl` also when beta is 0."""

    loss: float | None = None
    policy_loss: float | None = None
    kl: float | None = None
    entropy: float | None = None
    clip_frac: float | None = None
    grad_norm: float | None = None
    reference_s: float = 0.0
    optimizer_s: float = 0.0


@dataclass(frozen=True)
class EpisodeTotals:
    """Sums over the step's episodes, over all ranks (`tokens_per_s` too: the ranks sample side by side)."""

    n: float
    reward: float
    solved: float
    tokens: float  # the model's tokens, every turn
    extra_tokens: float  # those of dynamic sampling's replacement groups (the last `extra`)
    turns: float
    truncated: float
    errored: float
    tokens_per_s: float

    @classmethod
    def of(cls, rollouts: RolloutBatch, extra: int) -> EpisodeTotals:
        flat = [r for group in rollouts.groups for r in group]
        replacements = [r for group in rollouts.groups[len(rollouts.groups) - extra:] for r in group] if extra else []
        mine = cls(n=len(flat), reward=sum(r.reward for r in flat), solved=sum(r.solved for r in flat),
                   tokens=sum(r.model_tokens for r in flat), extra_tokens=sum(r.model_tokens for r in replacements),
                   turns=sum(len(r.turns) for r in flat), truncated=sum(r.sample.truncated for r in flat),
                   errored=sum(bool(r.error) for r in flat), tokens_per_s=rollouts.stats.tokens_per_second)
        return cls(**dist.all_sum(asdict(mine)))


@dataclass(frozen=True)
class StepTimings:
    """Seconds and peak memory of the step's phases: the slowest / largest rank's."""

    sample_s: float
    prefill_s: float  # part of sample_s: the prompts' forwards
    score_s: float
    reference_s: float  # old/reference log-prob forwards (and the frozen bottom blocks, `Entry`)
    optimizer_s: float  # part of update_s: the optimizer's updates
    update_s: float  # reference_s + forward/backward + optimizer_s
    peak_memory_gb: float

    @classmethod
    def of(cls, rollouts: RolloutBatch, losses: LossStats, update_seconds: float) -> StepTimings:
        mine = cls(sample_s=rollouts.stats.seconds, prefill_s=rollouts.stats.prefill_seconds,
                   score_s=rollouts.score_seconds, reference_s=losses.reference_s, optimizer_s=losses.optimizer_s,
                   update_s=update_seconds, peak_memory_gb=mx.get_peak_memory() / 1e9)
        return cls(**dist.all_max(asdict(mine)))


def learning_rate(optimizer: optim.Optimizer) -> float:
    """The learning rate the step's last update used (a schedule's value, or the constant)."""
    lr = optimizer.learning_rate
    return float(lr.item()) if isinstance(lr, mx.array) else float(lr)


# --- the whole run -----------------------------------------------------------------------------

@dataclass
class RunResult:
    run_dir: Path
    history: list[StepRecord] = field(default_factory=list)
    eval_before: dict[str, Any] | None = None
    eval_after: dict[str, Any] | None = None


def train(cfg: Config, *, resume: bool = False, progress: bool = True, env: Any = None,
          stop_after: int | None = None, log: Callable[[str], None] = print) -> RunResult:
    """Run (or resume) a training run as configured; returns what it recorded.

    Set-up: the memory preflight (memory.py) before any weight is loaded, the environments,
    the training puzzles (with `puzzles.select: mixed`, chosen by a calibration with the
    initial weights: selection.py) and the point to start from (start.py). The loop: sample,
    score and update (`run_step`), report (the alarms and step logs: reporter.py), checkpoint,
    evaluate. The end: the final evaluation.

    `env` replaces the sandboxed CodeFixEnv (tests use synthetic rewards); `stop_after` ends the
    run after that step as if it had been killed there (checkpoints as configured).
    Data-parallel, rank 0 alone reads and writes the run directory, prints and evaluates (its
    reporter; the others' is quiet); all ranks return the same history. Rank 0 holds the run
    directory's lock throughout: a second process training the same run fails at once.
    """
    main = dist.is_main()
    if not main:
        progress, log = False, _quiet
    puzzles = training_puzzles(cfg)  # with puzzles.select: mixed, the candidates
    if not puzzles:
        raise TrainingError("no training puzzles match the puzzles section of the config")
    eval_set = eval_puzzles(cfg, puzzles) if env is None else []
    check_before_loading(cfg, puzzles, eval_set, log)  # a run refused here leaves no run directory
    if not main:
        return _train(cfg, puzzles, eval_set, resume, progress, env, stop_after, log)
    try:
        with run_in_use(cfg.run_dir):
            return _train(cfg, puzzles, eval_set, resume, progress, env, stop_after, log)
    except RunInUseError as exc:
        raise TrainingError(str(exc)) from exc


def _train(cfg: Config, puzzles: list[Puzzle], eval_set: list[Puzzle], resume: bool, progress: bool, env: Any,
           stop_after: int | None, log: Callable[[str], None]) -> RunResult:
    """`train` once its settings are checked (and, on rank 0, with the run directory held)."""
    from .evaluation import evaluate_run

    main = dist.is_main()
    checkpoint = open_run_dir(cfg.run_dir, cfg, resume) if main else None
    policy = build_policy(cfg)
    log(f"model patches (fast math): {fastmath.describe(fastmath.installed())}")
    if depth := policy.shared_depth():
        log(f"LoRA from block {depth} of {len(policy.model.layers)}: updates run blocks 0-{depth - 1} once per group")
    optimizer = make_optimizer(cfg)
    result = RunResult(cfg.run_dir)
    try:
        with environments(cfg, puzzles + eval_set, env, log) as envs:
            with policy.sampling_model() as initial:  # before any checkpoint is loaded: the initial weights
                puzzles = select_training_puzzles(cfg, initial, policy.tokenizer, envs.train, puzzles, cfg.run_dir,
                                                  reuse=resume, may_calibrate=checkpoint is None, progress=progress,
                                                  log=log)
            start = starting_point(cfg, policy, optimizer, checkpoint, puzzles, resume, log)
            rates, tokens_total = start.rates, start.tokens_total
            reporter = (Reporter(cfg, policy.model, optimizer, start.seen, log, progress) if main
                        else Reporter.quiet(cfg, policy.model, optimizer))

            def evaluate(name: str, label: str) -> dict[str, Any] | None:
                return evaluate_run(policy.model, policy.tokenizer, envs.eval, eval_set, cfg, name, label, progress, log)

            if cfg.train.final_eval and start.step == 0 and eval_set:
                result.eval_before = evaluate("before", "before")
            reporter.start(start.step)
            for step in range(start.step + 1, cfg.train.steps + 1):
                chosen, spare = choose(cfg, puzzles, rates, step)
                record, rollouts = run_step(policy, optimizer, envs.train, chosen, step, progress, spare)
                tokens_total += record.sampled_tokens
                record.tokens_total = tokens_total  # learning per sampled token: the x-axis of figures
                episodes = [line for group in dist.unshard([[{"step": step, **r.summary()} for r in group]
                                                            for group in rollouts.groups]) for line in group]
                rates.observe(step, episodes)  # every rank: all choose the same puzzles next
                result.history.append(record)
                reporter.step(record, episodes, rates)
                reporter.checkpoint(step, rates)
                if cfg.train.eval_every and step % cfg.train.eval_every == 0 and step != cfg.train.steps and eval_set:
                    evaluate(f"step-{step:04d}", f"step-{step}")
                reporter.stepped(record)
                if stop_after is not None and step >= stop_after:
                    return result
            reporter.close()
            if cfg.train.final_eval and eval_set:
                result.eval_after = evaluate("after", "after")
    except (dist.DistributedError, SelectionError, PassRateError) as exc:
        raise TrainingError(str(exc)) from exc
    return result


def sampled_tokens(record: dict[str, Any], cfg: Config) -> int:
    """The model tokens a history.jsonl line's step sampled, estimated for lines written before
    `sampled_tokens` existed (`StepRecord.from_json`)."""
    return StepRecord.from_json(record, cfg.sampling.group_size).sampled_tokens


def _quiet(_: str) -> None:
    pass
