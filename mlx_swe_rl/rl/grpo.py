"""The GRPO math as pure functions on arrays. Notation (one optimizer step):

    P puzzles x G completions; r[p, g] reward; o_i completion i with tokens t = 1..|o_i|;
    pi = current policy, pi_old = the policy that sampled (or the last update's), pi_ref = reference.

Each function below implements one equation; the names in brackets are the papers':
  advantages        A_i = (r_i - mean_g r) / (std_g r + eps)                [GRPO, DeepSeekMath]
                    A_i =  r_i - mean_g r                                     [Dr. GRPO]
                    A_i =  r_i - mean_{j != i} r_j                            [RLOO]
  token_log_probs   log pi(o_{i,t} | q, o_{i,<t}), log-softmax in float32
  policy_loss       rho = pi / pi_old per token (or GSPO: exp(mean_t log rho) per sequence)
                    l_{i,t} = -min(rho A_i, clip(rho, 1 - eps_low, 1 + eps_high) A_i)  [PPO; DAPO clip-higher]
  kl_k3             k3 = exp(x) - x - 1 with x = log pi_ref - log pi, x clamped   [Schulman's k3]
  token_weights     how l_{i,t} + beta k3_{i,t} is summed over tokens and completions:
                    seq_mean_token_mean      (1/N) sum_i (1/|o_i|) sum_t       [GRPO]
                    token_mean               (1 / sum_i |o_i|) sum_i sum_t     [DAPO]
                    seq_mean_token_sum_norm  (1/(N L)) sum_i sum_t, L constant [Dr. GRPO]

With mu = 1 update per batch, pi_old = pi (stop-gradient), rho = 1, and the gradient of the
loss is -A_i grad log pi summed with the weights: the seed's advantage-weighted log-likelihood.
Weights are computed for the whole step before it is split into micro-batches, so summing
micro-batch gradients gives exactly the full-batch gradient.
"""

from __future__ import annotations

import mlx.core as mx

ADVANTAGE_METHODS = ("std", "mean", "rloo")
AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")
RATIO_LEVELS = ("token", "sequence")


def group_advantages(rewards: mx.array, method: str = "std", eps: float = 1e-4) -> tuple[mx.array, mx.array]:
    """Advantages for rewards shaped [P, G], and a [P] mask of groups that carry signal.

    A group whose rewards are all equal has zero advantage for every member under all three
    methods; it is marked invalid so the trainer can drop it and count it (never divide by a
    zero std). The std is the population std of the group (ddof = 0).
    """
    rewards = rewards.astype(mx.float32)
    group_size = rewards.shape[1]
    mean = rewards.mean(axis=1, keepdims=True)
    centred = rewards - mean
    std = mx.sqrt((centred * centred).mean(axis=1, keepdims=True))
    # Compare extremes, not std: equal non-dyadic rewards (0.2, ...) leave a float32 std of ~1e-8.
    valid = rewards.max(axis=1) > rewards.min(axis=1)
    if method == "std":
        adv = centred / (std + eps)
    elif method == "mean":
        adv = centred
    elif method == "rloo":
        if group_size < 2:
            raise ValueError("rloo advantages need at least 2 completions per group")
        # r_i - (sum_g r - r_i) / (G - 1) == G / (G - 1) * (r_i - mean)
        adv = centred * (group_size / (group_size - 1))
    else:
        raise ValueError(f"advantage method '{method}' is not one of {', '.join(ADVANTAGE_METHODS)}")
    return mx.where(valid[:, None], adv, 0.0), valid


def token_log_probs(logits: mx.array, targets: mx.array) -> mx.array:
    """log softmax(logits)[target] in float32; logits [..., V], targets [...] -> [...]."""
    logits = logits.astype(mx.float32)
    picked = mx.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return picked - mx.logsumexp(logits, axis=-1)


def policy_loss(logp: mx.array, old_logp: mx.array, advantages: mx.array, mask: mx.array,
                eps_low: float = 0.2, eps_high: float = 0.2, ratio_level: str = "token",
                log_ratio_clamp: float = 20.0) -> tuple[mx.array, mx.array]:
    """Per-token clipped surrogate loss [B, T] and a [B, T] indicator of clipped tokens.

    logp, old_logp, mask: [B, T] (mask 1 on completion tokens); advantages: [B].
    """
    log_ratio = mx.clip(logp - old_logp, -log_ratio_clamp, log_ratio_clamp)
    if ratio_level == "sequence":
        # GSPO: one length-normalised ratio per completion, broadcast over its tokens.
        lengths = mx.maximum(mask.sum(axis=1, keepdims=True), 1)
        seq = (log_ratio * mask).sum(axis=1, keepdims=True) / lengths
        log_ratio = mx.broadcast_to(seq, logp.shape)
    elif ratio_level != "token":
        raise ValueError(f"ratio level '{ratio_level}' is not one of {', '.join(RATIO_LEVELS)}")
    ratio = mx.exp(log_ratio)
    adv = advantages[:, None].astype(mx.float32)
    unclipped = ratio * adv
    clipped = mx.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    loss = -mx.minimum(unclipped, clipped)
    was_clipped = (clipped < unclipped) & (mask > 0)
    return loss, was_clipped


def kl_k3(logp: mx.array, ref_logp: mx.array, clamp: float = 20.0) -> mx.array:
    """Per-token k3 estimate of KL(pi || pi_ref): exp(x) - x - 1, x = log pi_ref - log pi (clamped).
    Non-negative, zero when the policies agree; computed in float32."""
    x = mx.clip(ref_logp.astype(mx.float32) - logp.astype(mx.float32), -clamp, clamp)
    # expm1: exp(x) - 1 - x in float32 cancels to 0 for |x| < ~3e-4, hiding early KL.
    return mx.expm1(x) - x


def token_weights(lengths: mx.array, aggregation: str, max_tokens: int, *, total_kept: int | None = None,
                  total_tokens: int | None = None) -> mx.array:
    """Per-completion weight w_i so that the step loss is sum_i w_i sum_t l_{i,t}.

    lengths: [N] number of loss tokens of each completion in the whole step (0 for dropped
    completions, which then get weight 0). When `lengths` is only part of the step (one rank
    of a data-parallel run), `total_kept` (N) and `total_tokens` (sum_i |o_i|) give the
    normalisers of the whole step, so the parts' losses and gradients add up to the whole's.
    """
    lengths = lengths.astype(mx.float32)
    kept = (lengths > 0).astype(mx.float32)
    n = mx.maximum(kept.sum() if total_kept is None else mx.array(total_kept, mx.float32), 1.0)
    if aggregation == "seq_mean_token_mean":
        return kept / (n * mx.maximum(lengths, 1.0))
    if aggregation == "token_mean":
        tokens = lengths.sum() if total_tokens is None else mx.array(total_tokens, mx.float32)
        return kept / mx.maximum(tokens, 1.0)
    if aggregation == "seq_mean_token_sum_norm":
        return kept / (n * float(max_tokens))
    raise ValueError(f"aggregation '{aggregation}' is not one of {', '.join(AGGREGATIONS)}")


def grpo_objective(logp: mx.array, old_logp: mx.array, ref_logp: mx.array | None, advantages: mx.array,
                   mask: mx.array, weights: mx.array, *, beta: float, eps_low: float, eps_high: float,
                   ratio_level: str = "token", stat_weights: mx.array | None = None
                   ) -> tuple[mx.array, dict[str, mx.array]]:
    """The micro-batch loss sum_i w_i sum_t mask (l_{i,t} + beta k3_{i,t}), and diagnostics
    (KL, clip fraction) weighted by `stat_weights` (default: the loss's own weights), for
    summing across micro-batches. Per-token means as diagnostics need weights that sum to one
    over the step's tokens, which a loss aggregation such as Dr. GRPO's does not give."""
    per_token, was_clipped = policy_loss(logp, old_logp, advantages, mask, eps_low, eps_high, ratio_level)
    w = weights[:, None] * mask
    ws = w if stat_weights is None else stat_weights[:, None] * mask
    stats = {"policy_loss": (per_token * w).sum(), "clip_frac": (was_clipped * ws).sum()}
    total = per_token
    if beta > 0 and ref_logp is not None:
        kl = kl_k3(logp, ref_logp)
        total = total + beta * kl
        stats["kl"] = (kl * ws).sum()
    loss = (total * w).sum()
    return loss, stats
