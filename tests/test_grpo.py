"""The GRPO math (mlx_swe_rl.grpo) against hand-computed values.

Every expectation here is written out by hand or computed with plain Python / numpy float64,
never by calling the implementation a second way.
"""

from __future__ import annotations

import math
import statistics

import mlx.core as mx
import numpy as np
import pytest

from mlx_swe_rl.rl.grpo import AGGREGATIONS, group_advantages, grpo_objective, kl_k3, policy_loss, token_log_probs, token_weights

EPS = 1e-4  # group_advantages' default


def close(actual: mx.array, expected, tol: float = 1e-6) -> None:
    np.testing.assert_allclose(np.array(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64),
                               rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------- advantages
def test_std_advantages_hand_values():
    adv, valid = group_advantages(mx.array([[1, 0, 0, 1], [1, 1, 1, 1]]), "std")
    # group 0: mean 0.5, population std 0.5 -> (r - 0.5) / (0.5 + eps)
    a = 0.5 / (0.5 + EPS)
    close(adv, [[a, -a, -a, a], [0, 0, 0, 0]])
    assert valid.tolist() == [True, False]
    assert adv.dtype == mx.float32


def test_std_advantages_use_population_std():
    rewards = [0.2, 0.5, 1.0]
    mean = sum(rewards) / 3
    std = statistics.pstdev(rewards)  # ddof = 0
    adv, valid = group_advantages(mx.array([rewards]), "std", eps=0.0)
    close(adv, [[(r - mean) / std for r in rewards]], tol=1e-5)
    assert valid.tolist() == [True]
    # eps is added to the std, not to the variance
    adv, _ = group_advantages(mx.array([rewards]), "std", eps=0.5)
    close(adv, [[(r - mean) / (std + 0.5) for r in rewards]], tol=1e-5)


def test_mean_advantages_hand_values():
    adv, valid = group_advantages(mx.array([[1, 0, 0, 1], [0, 0, 0, 0], [0.25, 0.75, 0.5, 0.5]]), "mean")
    close(adv, [[0.5, -0.5, -0.5, 0.5], [0, 0, 0, 0], [-0.25, 0.25, 0, 0]])
    assert valid.tolist() == [True, False, True]


def test_rloo_equals_leave_one_out_loop():
    rows = [[1.0, 0.0, 0.0, 1.0], [0.1, 0.9, 0.4, 0.3], [2.0, 2.0, 2.0, 2.0]]
    expected = []
    for row in rows:
        out = []
        for i, r in enumerate(row):
            others = [x for j, x in enumerate(row) if j != i]
            out.append(r - sum(others) / len(others))
        expected.append(out)
    expected[2] = [0.0] * 4  # zero-variance group is zeroed
    adv, valid = group_advantages(mx.array(rows), "rloo")
    close(adv, expected, tol=1e-5)
    assert valid.tolist() == [True, True, False]
    # the [1, 0, 0, 1] group by hand: 1 - 1/3 and 0 - 2/3
    close(adv[0], [2 / 3, -2 / 3, -2 / 3, 2 / 3], tol=1e-6)


def test_rloo_needs_two_completions_and_unknown_method_raises():
    with pytest.raises(ValueError, match="rloo"):
        group_advantages(mx.array([[1.0], [0.0]]), "rloo")
    with pytest.raises(ValueError, match="nosuch"):
        group_advantages(mx.array([[1.0, 0.0]]), "nosuch")


@pytest.mark.parametrize("method", ["std", "mean", "rloo"])
def test_zero_variance_groups_are_invalid_and_zero(method):
    adv, valid = group_advantages(mx.array([[0, 0, 0], [1, 1, 1], [0, 1, 0]]), method)
    assert valid.tolist() == [False, False, True]
    assert adv[:2].tolist() == [[0, 0, 0], [0, 0, 0]]
    assert all(a != 0 for a in adv[2].tolist())


@pytest.mark.parametrize("method", ["std", "mean", "rloo"])
def test_equal_fractional_rewards_are_zero_variance(method):
    # e.g. "partial" rewards: every completion passed 1 of 5 tests; next to a group with signal
    for value, group_size in [(0.2, 8), (0.7, 8), (0.9, 5), (0.1, 16)]:
        signal = [1.0] + [0.0] * (group_size - 1)
        adv, valid = group_advantages(mx.array([[value] * group_size, signal]), method)
        assert valid.tolist() == [False, True], (value, group_size)
        assert adv[0].tolist() == [0.0] * group_size, (value, group_size)


# ---------------------------------------------------------------------------------- log-probs
def _np_log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def test_token_log_probs_match_numpy_log_softmax():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((2, 3, 11)) * 4).astype(np.float32)
    targets = rng.integers(0, 11, size=(2, 3))
    got = token_log_probs(mx.array(logits), mx.array(targets))
    assert got.shape == (2, 3) and got.dtype == mx.float32
    ref = np.take_along_axis(_np_log_softmax(logits), targets[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(np.array(got, dtype=np.float64), ref, atol=1e-5, rtol=0)


def test_token_log_probs_is_stable_for_large_logits():
    logits = np.array([[1000.0, 999.0, -1000.0]], dtype=np.float32)
    got = token_log_probs(mx.array(logits), mx.array([0])).tolist()
    # log(1 / (1 + e^-1)); float32 resolution at magnitude 1000 is ~6e-5
    assert got[0] == pytest.approx(-math.log1p(math.exp(-1)), abs=2e-4)


def test_token_log_probs_float16_logits_give_float32():
    rng = np.random.default_rng(1)
    logits16 = (rng.standard_normal((4, 9)) * 6).astype(np.float16)
    targets = rng.integers(0, 9, size=(4,))
    got = token_log_probs(mx.array(logits16), mx.array(targets))
    assert got.dtype == mx.float32
    ref = np.take_along_axis(_np_log_softmax(logits16), targets[:, None], axis=-1)[:, 0]
    np.testing.assert_allclose(np.array(got, dtype=np.float64), ref, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------- policy loss
def test_ratio_one_loss_is_minus_advantage_and_gradient_is_minus_advantage():
    logp = mx.array([[-1.0, -2.0, -0.5], [-0.3, -4.0, -1.5]])
    adv = mx.array([1.5, -0.75])
    mask = mx.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, clipped = policy_loss(logp, logp, adv, mask)
    close(loss, [[-1.5, -1.5, -1.5], [0.75, 0.75, 0.75]])
    assert not clipped.any().item()

    def total(lp):
        return policy_loss(lp, mx.stop_gradient(lp), adv, mask)[0].sum()

    grad = mx.grad(total)(logp)
    close(grad, [[-1.5, -1.5, -1.5], [0.75, 0.75, 0.75]], tol=1e-6)


def test_clip_higher_is_asymmetric():
    eps_low, eps_high = 0.2, 0.28
    ratios = [1.5, 1.25, 0.75, 0.5]
    log_ratio = mx.array([[math.log(r) for r in ratios]] * 2)
    old = mx.full((2, 4), -2.0)
    logp = old + log_ratio
    adv = mx.array([2.0, -1.0])
    mask = mx.ones((2, 4))
    loss, clipped = policy_loss(logp, old, adv, mask, eps_low=eps_low, eps_high=eps_high)
    # A > 0: clipped above 1 + eps_high = 1.28 (1.25 is not clipped, as it would be with 0.2);
    #        below 1 the unclipped (smaller) term wins.
    # A < 0: clipped below 1 - eps_low = 0.8 (0.75 is clipped); above 1 the unclipped term wins.
    expected = [[-1.28 * 2, -1.25 * 2, -0.75 * 2, -0.5 * 2],
                [1.5, 1.25, 0.8, 0.8]]
    close(loss, expected, tol=1e-5)
    assert clipped.tolist() == [[True, False, False, False], [False, False, True, True]]


def test_clipped_tokens_get_no_gradient():
    old = mx.array([[-1.0, -1.0]])
    adv = mx.array([1.0])
    mask = mx.ones((1, 2))

    def total(lp):
        return policy_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.2)[0].sum()

    logp = old + mx.array([[math.log(2.0), math.log(1.1)]])
    grad = mx.grad(total)(logp)
    # d/dlogp of -rho*A = -rho*A for the unclipped token; 0 where the ratio is clipped
    close(grad, [[0.0, -1.1]], tol=1e-5)


def test_clip_indicator_ignores_masked_tokens():
    old = mx.zeros((1, 3))
    logp = mx.full((1, 3), math.log(3.0))
    loss, clipped = policy_loss(logp, old, mx.array([1.0]), mx.array([[1.0, 0.0, 1.0]]))
    assert clipped.tolist() == [[True, False, True]]
    close(loss, [[-1.2, -1.2, -1.2]], tol=1e-5)


def test_sequence_level_ratio_is_exp_of_mean_masked_log_ratio():
    old = mx.zeros((2, 3))
    # row 0: masked token has a huge log ratio that must not count
    logp = mx.array([[0.1, 0.3, 5.0], [-0.3, -0.1, -0.2]])
    mask = mx.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = mx.array([1.0, 2.0])
    loss, clipped = policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, ratio_level="sequence")
    r0 = math.exp((0.1 + 0.3) / 2)  # 1.2214, inside [0.8, 1.28]
    r1 = math.exp((-0.3 - 0.1 - 0.2) / 3)  # 0.8187; A > 0 so the unclipped term is the min
    close(loss, [[-r0] * 3, [-2 * r1] * 3], tol=1e-5)
    assert not clipped.any().item()
    # the same log ratios at token level give per-token losses instead (e^0.3 = 1.35 is clipped)
    token_loss, token_clipped = policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    close(token_loss[0, :2], [-math.exp(0.1), -1.28], tol=1e-5)
    assert token_clipped[0].tolist() == [False, True, False]
    with pytest.raises(ValueError, match="nosuch"):
        policy_loss(logp, old, adv, mask, ratio_level="nosuch")


def test_sequence_level_ratio_clips_whole_sequence():
    old = mx.zeros((1, 2))
    logp = mx.array([[0.5, 0.7]])  # mean 0.6 -> ratio 1.822 > 1.2
    loss, clipped = policy_loss(logp, old, mx.array([1.0]), mx.ones((1, 2)), ratio_level="sequence")
    close(loss, [[-1.2, -1.2]], tol=1e-5)
    assert clipped.tolist() == [[True, True]]


def test_huge_log_ratio_is_clamped_to_finite_loss():
    old = mx.array([[-200.0, 0.0]])
    logp = mx.array([[0.0, -200.0]])
    loss, _ = policy_loss(logp, old, mx.array([-1.0]), mx.ones((1, 2)))
    values = loss.tolist()[0]
    assert all(math.isfinite(v) for v in values)
    # A < 0 and ratio e^20: unclipped term -e^20 is the min -> loss e^20 (clamped at 20)
    assert values[0] == pytest.approx(math.exp(20.0), rel=1e-5)
    assert values[1] == pytest.approx(0.8, rel=1e-5)


# ---------------------------------------------------------------------------------- KL
def test_kl_k3_hand_values():
    logp = mx.array([-1.0, -1.0, -2.0, -0.5])
    ref = mx.array([-1.0, -2.0, -1.5, -0.5])
    x = [0.0, -1.0, 0.5, 0.0]  # ref - logp
    expected = [math.exp(v) - v - 1 for v in x]
    got = kl_k3(logp, ref)
    close(got, expected, tol=1e-6)
    values = got.tolist()
    assert values[0] == 0.0 and values[3] == 0.0
    assert values[1] > 0 and values[2] > 0
    assert values[1] == pytest.approx(math.exp(-1.0), abs=1e-6)


def test_kl_k3_is_clamped_and_finite():
    got = kl_k3(mx.array([-1000.0, 0.0]), mx.array([0.0, -1000.0])).tolist()
    assert all(math.isfinite(v) for v in got)
    assert got[0] == pytest.approx(math.exp(20) - 20 - 1, rel=1e-5)
    assert got[1] == pytest.approx(math.exp(-20) + 20 - 1, rel=1e-5)


def test_kl_k3_is_float32_for_float16_inputs():
    got = kl_k3(mx.array([-1.0], dtype=mx.float16), mx.array([-2.0], dtype=mx.float16))
    assert got.dtype == mx.float32
    assert got.item() == pytest.approx(math.exp(-1.0), abs=1e-6)


# ---------------------------------------------------------------------------------- weights
def test_token_weights_hand_values():
    lengths = mx.array([2, 4, 0])
    # GRPO: 1 / (N_kept * |o_i|) with N_kept = 2
    close(token_weights(lengths, "seq_mean_token_mean", 8), [1 / 4, 1 / 8, 0])
    # DAPO: 1 / total tokens = 1/6
    close(token_weights(lengths, "token_mean", 8), [1 / 6, 1 / 6, 0])
    # Dr. GRPO: 1 / (N_kept * max_tokens) = 1/16
    close(token_weights(lengths, "seq_mean_token_sum_norm", 8), [1 / 16, 1 / 16, 0])


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"])
def test_token_weights_all_dropped_is_zero_not_nan(aggregation):
    got = token_weights(mx.array([0, 0]), aggregation, 8).tolist()
    assert got == [0.0, 0.0]


def test_token_weights_unknown_aggregation_raises():
    with pytest.raises(ValueError, match="nosuch"):
        token_weights(mx.array([1, 2]), "nosuch", 8)


# ---------------------------------------------------------------------------------- objective
def test_objective_hand_value_with_and_without_kl():
    logp = mx.array([[-1.0, -2.0]])
    ref = logp - 1.0  # x = -1 on both tokens
    adv, mask, weights = mx.array([2.0]), mx.ones((1, 2)), mx.array([0.5])
    loss, stats = grpo_objective(logp, logp, ref, adv, mask, weights, beta=0.0, eps_low=0.2, eps_high=0.2)
    assert loss.item() == pytest.approx(0.5 * (-2 - 2), abs=1e-6)
    assert "kl" not in stats
    assert stats["policy_loss"].item() == pytest.approx(-2.0, abs=1e-6)
    assert stats["clip_frac"].item() == 0.0

    loss, stats = grpo_objective(logp, logp, ref, adv, mask, weights, beta=0.1, eps_low=0.2, eps_high=0.2)
    kl = 0.5 * 2 * math.exp(-1.0)
    assert stats["kl"].item() == pytest.approx(kl, abs=1e-6)
    assert loss.item() == pytest.approx(-2.0 + 0.1 * kl, abs=1e-6)


def test_objective_beta_zero_ignores_ref_logp():
    rng = np.random.default_rng(2)
    logp = mx.array(rng.standard_normal((3, 4)).astype(np.float32))
    old = logp + mx.array(rng.standard_normal((3, 4)).astype(np.float32) * 0.1)
    adv, mask, w = mx.array([1.0, -1.0, 0.5]), mx.ones((3, 4)), mx.array([0.1, 0.2, 0.3])
    kwargs = dict(beta=0.0, eps_low=0.2, eps_high=0.2)
    a, sa = grpo_objective(logp, old, None, adv, mask, w, **kwargs)
    b, sb = grpo_objective(logp, old, logp - 50.0, adv, mask, w, **kwargs)
    assert a.item() == b.item()
    assert "kl" not in sa and "kl" not in sb


def test_objective_masked_tokens_do_not_count():
    logp = mx.array([[-1.0, -2.0, -3.0]])
    mask = mx.array([[1.0, 1.0, 0.0]])
    kwargs = dict(beta=0.5, eps_low=0.2, eps_high=0.2)
    a, _ = grpo_objective(logp, logp, logp, mx.array([1.0]), mask, mx.array([0.5]), **kwargs)
    changed = mx.array([[-1.0, -2.0, -40.0]])
    b, _ = grpo_objective(changed, logp, logp - 7.0 * (1 - mask), mx.array([1.0]), mask, mx.array([0.5]), **kwargs)
    assert a.item() == pytest.approx(-1.0, abs=1e-6)  # 0.5 * (-1 - 1)
    assert b.item() == pytest.approx(a.item(), abs=1e-6)


def test_diagnostics_do_not_depend_on_the_loss_aggregation():
    # Two completions of 4 and 2 tokens; the KL of the short one is larger. As per-token
    # diagnostics, KL and clipping use the mean of token means (stat_weights) under any
    # aggregation, so Dr. GRPO's max_tokens normaliser cannot shrink them.
    logp = mx.array([[-1.0, -1.0, -1.0, -1.0], [-1.0, -1.0, 0.0, 0.0]])
    ref = mx.array([[-1.1, -1.1, -1.1, -1.1], [-1.5, -1.5, 0.0, 0.0]])
    mask = mx.array([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    lengths = mx.array([4, 2])
    mean_weights = token_weights(lengths, "seq_mean_token_mean", 16)
    expected_kl = 0.5 * (kl_k3(logp[0], ref[0]).mean() + kl_k3(logp[1, :2], ref[1, :2]).mean())
    kwargs = dict(beta=0.1, eps_low=0.2, eps_high=0.2, stat_weights=mean_weights)
    losses = []
    for aggregation in AGGREGATIONS:
        loss, stats = grpo_objective(logp, logp, ref, mx.array([1.0, -1.0]), mask,
                                     token_weights(lengths, aggregation, 16), **kwargs)
        assert stats["kl"].item() == pytest.approx(expected_kl.item(), rel=1e-5)
        losses.append(loss.item())
    assert len({round(x, 6) for x in losses}) == len(AGGREGATIONS)  # the losses themselves differ


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_micro_batches_sum_to_full_batch(ratio_level):
    rng = np.random.default_rng(3)
    B, T = 4, 6
    lengths = [6, 3, 0, 5]
    mask_np = np.array([[1.0 if t < n else 0.0 for t in range(T)] for n in lengths], dtype=np.float32)
    logp = mx.array((-rng.random((B, T)) * 3).astype(np.float32))
    old = logp + mx.array((rng.standard_normal((B, T)) * 0.3).astype(np.float32))
    ref = logp + mx.array((rng.standard_normal((B, T)) * 0.3).astype(np.float32))
    adv = mx.array([1.2, -0.7, 0.0, 0.4])
    mask = mx.array(mask_np)
    weights = token_weights(mx.array(lengths), "seq_mean_token_mean", T)  # from the whole step
    kwargs = dict(beta=0.04, eps_low=0.2, eps_high=0.28, ratio_level=ratio_level)

    def loss_fn(lp, rows):
        return grpo_objective(lp, old[rows], ref[rows], adv[rows], mask[rows], weights[rows], **kwargs)

    full, full_stats = loss_fn(logp, slice(0, 4))
    first, s1 = loss_fn(logp[0:2], slice(0, 2))
    second, s2 = loss_fn(logp[2:4], slice(2, 4))
    assert (first + second).item() == pytest.approx(full.item(), abs=1e-6)
    assert set(full_stats) == {"policy_loss", "clip_frac", "kl"}
    for key in full_stats:
        assert (s1[key] + s2[key]).item() == pytest.approx(full_stats[key].item(), abs=1e-6)
    # the gradients of the micro-batches, stacked, are the full-batch gradient
    g_full = mx.grad(lambda lp: loss_fn(lp, slice(0, 4))[0])(logp)
    g1 = mx.grad(lambda lp: loss_fn(lp, slice(0, 2))[0])(logp[0:2])
    g2 = mx.grad(lambda lp: loss_fn(lp, slice(2, 4))[0])(logp[2:4])
    close(mx.concatenate([g1, g2]), g_full, tol=1e-6)
    # masked positions and the dropped (length 0) completion get no gradient
    assert np.all(np.array(g_full)[mask_np == 0] == 0)


def test_kl_k3_is_accurate_for_small_log_ratios():
    # exp(x) - x - 1 computed naively in float32 is exactly 0 here; the true value is ~x^2/2.
    for x in (1e-4, -1e-4, 3e-5):
        got = kl_k3(mx.array([0.0]), mx.array([x])).item()
        assert got == pytest.approx(math.expm1(x) - x, rel=1e-3)
