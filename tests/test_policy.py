"""The grouped forward (prompt once per group) equals the plain padded forward."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from mlx_swe_rl.rl.config import FinetuneConfig
from mlx_swe_rl.models.specs import load_model
from mlx_swe_rl.rl.policy import (GroupBatch, SequenceBatch, completion_log_probs, completion_pass, group_log_probs, lora_layers,
                                  prepare_policy, prompt_states)


def random_adapters(model, seed: int) -> None:
    """Nonzero LoRA B matrices, so the adapters matter."""
    mx.random.seed(seed)
    for layer in lora_layers(model):
        layer.lora_b = mx.random.normal(layer.lora_b.shape) * 0.05


def five_completions():
    """One prompt's five completions of unlike lengths, with advantages and weights: a LossGroup."""
    from mlx_swe_rl.rl.trainer import LossGroup

    completions = [[7, 8, 9, 10], [11, 12], [13, 14, 15, 16, 17, 18], [19], [20, 21, 22]]
    return LossGroup(list(range(5, 60)), completions, [[1.0] * len(c) for c in completions],
                     [1.0, -0.5, 0.3, 2.0, -1.2], [0.1, 0.2, 0.3, 0.4, 0.5], [0.2] * 5)


def weighted_log_prob_loss(model):
    """`group_gradients`' loss_fn: advantage- and weight-weighted log-probs of a micro-batch
    (from its Entry when it has one), and its token count."""
    def loss_fn(m, old, ref, states):
        states = states or prompt_states(model, m.batch.prompt, m.entry)
        logp, _ = completion_pass(model, states, m.batch, entry=m.entry)
        return (logp.sum(axis=1) * m.advantages * m.weights).sum(), {"tokens": m.batch.mask().sum()}
    return loss_fn


def test_group_forward_matches_plain_forward_and_gradients(tiny_model_dir):
    model, _ = load_model(str(tiny_model_dir))
    prepare_policy(model, FinetuneConfig())
    random_adapters(model, 1)
    prompt = list(range(5, 60))
    completions = [[7, 8, 9, 10], [11, 12], [13, 14, 15, 16, 17, 18], [19]]
    plain, plain_entropy = completion_log_probs(model, SequenceBatch.build([prompt] * 4, completions), True)
    grouped, grouped_entropy = group_log_probs(model, GroupBatch.build(prompt, completions), True)
    assert plain.shape == grouped.shape == (4, 6)
    assert mx.abs(plain - grouped).max().item() < 1e-5
    assert mx.abs(plain_entropy - grouped_entropy).max().item() < 1e-5
    assert (grouped[1, 2:] == 0).all().item()  # padding positions carry nothing
    # entropy against -sum p log p from one full forward of prompt + completion
    for row, completion in enumerate(completions):
        logits = model(mx.array([prompt + completion]))[0, len(prompt) - 1:len(prompt) - 1 + len(completion)]
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        expected = -(mx.exp(logp) * logp).sum(-1)
        assert mx.abs(grouped_entropy[row, :len(completion)] - expected).max().item() < 1e-4

    advantages = mx.array([1.0, -0.5, 0.3, 2.0])

    def loss(log_probs):
        return lambda: (log_probs()[0].sum(axis=1) * advantages).sum()

    _, g_plain = nn.value_and_grad(model, loss(lambda: completion_log_probs(
        model, SequenceBatch.build([prompt] * 4, completions))))()
    _, g_group = nn.value_and_grad(model, loss(lambda: group_log_probs(model, GroupBatch.build(prompt, completions))))()
    flat_plain, flat_group = dict(tree_flatten(g_plain)), dict(tree_flatten(g_group))
    assert flat_plain.keys() == flat_group.keys()
    scale = max(mx.abs(v).max().item() for v in flat_plain.values())
    worst = max(mx.abs(flat_plain[k] - flat_group[k]).max().item() for k in flat_plain)
    assert scale > 1 and worst < 1e-5 * scale


def test_chunked_head_matches_one_chunk_including_full_finetune_gradients(tiny_model_dir, monkeypatch):
    from mlx_swe_rl.rl import policy

    model, _ = load_model(str(tiny_model_dir))
    prepare_policy(model, FinetuneConfig(mode="full"))  # the head's weights get gradients too
    prompt = list(range(5, 40))
    completions = [[7, 8, 9, 10, 3], [11, 12], [13, 14, 15, 16, 17, 18, 4]]
    advantages = mx.array([1.0, -0.5, 0.3])

    def run():
        def loss():
            logp, entropy = group_log_probs(model, GroupBatch.build(prompt, completions), True)
            return (logp.sum(axis=1) * advantages).sum(), (logp, entropy)
        (_, outputs), grads = nn.value_and_grad(model, lambda: loss())()
        mx.eval(outputs, grads)
        return outputs, dict(tree_flatten(grads))

    (logp, entropy), grads = run()
    vocab = policy.head_module(model).weight.shape[0]
    monkeypatch.setattr(policy, "LOGITS_CHUNK_BYTES", 4 * vocab * 3)  # 3 positions per chunk
    (logp_c, entropy_c), grads_c = run()
    assert mx.abs(logp - logp_c).max().item() < 1e-6
    assert mx.abs(entropy - entropy_c).max().item() < 1e-6
    assert (logp_c[1, 2:] == 0).all().item() and (entropy_c[1, 2:] == 0).all().item()
    scale = max(mx.abs(v).max().item() for v in grads.values())
    assert max(mx.abs(grads[k] - grads_c[k]).max().item() for k in grads) < 1e-5 * scale


def test_lora_matmuls_follow_the_input_dtype_and_adapters_stay_float32(tiny_model_dir):
    from mlx_lm.tuner.lora import LoRALinear

    from mlx_swe_rl.rl.policy import InputDtypeLoRALinear

    model, _ = load_model(str(tiny_model_dir), dtype="bfloat16")
    prepare_policy(model, FinetuneConfig())
    layers = lora_layers(model)
    assert layers and all(type(layer) is InputDtypeLoRALinear for layer in layers)
    layer = layers[0]
    layer.lora_b = mx.random.normal(layer.lora_b.shape, key=mx.random.key(0)) * 0.1
    x = mx.random.normal((2, 5, layer.lora_a.shape[0]), key=mx.random.key(1)).astype(mx.bfloat16)
    ours = layer(x)
    assert ours.dtype == mx.bfloat16
    mlx_lm_way = LoRALinear.__call__(layer, x)  # float32 adapter matmuls
    scale = mx.abs(mlx_lm_way).max().item()
    assert mx.abs(ours.astype(mx.float32) - mlx_lm_way.astype(mx.float32)).max().item() < 0.02 * scale  # bf16 rounding
    grads = nn.value_and_grad(model, lambda: model(mx.array([[3, 4, 5, 6]])).astype(mx.float32).sum())()[1]
    flat = dict(tree_flatten(grads))
    assert flat and all(k.endswith(("lora_a", "lora_b")) and v.dtype == mx.float32 for k, v in flat.items())
    assert all(v.dtype == mx.float32 for k, v in tree_flatten(model.trainable_parameters()))


def test_micro_batched_group_gradient_equals_the_whole_group_gradient(tiny_model_dir):
    # trainer.group_gradients: a group cut into micro-batches runs its prompt once and carries
    # the micro-batches' gradients with respect to the prompt's keys, values and last hidden
    # state back through it in one vector-Jacobian product; the gradient is the whole group's.
    from mlx_swe_rl.rl.trainer import group_gradients, micro_batches

    model, _ = load_model(str(tiny_model_dir))
    prepare_policy(model, FinetuneConfig())
    random_adapters(model, 2)
    group, loss_fn = five_completions(), weighted_log_prob_loss(model)

    results = {}
    for size in (2, 64):
        micro = micro_batches(group, size)
        assert len(micro) == (3 if size == 2 else 1)
        sums: dict[str, float] = {}
        grads = group_gradients(model, loss_fn, micro, [None] * len(micro), [None] * len(micro), sums)
        results[size] = (dict(tree_flatten(grads)), sums)
    (split, split_sums), (whole, whole_sums) = results[2], results[64]
    assert split_sums["tokens"] == whole_sums["tokens"] == 16
    assert abs(split_sums["loss"] - whole_sums["loss"]) < 1e-4
    assert split.keys() == whole.keys() and split
    for name, value in whole.items():
        assert mx.abs(split[name] - value).max().item() < 1e-5 + 1e-4 * mx.abs(value).max().item(), name
    # the prompt's share of the gradient is there: without the product through the prompt the
    # lowest layer's adapters would get (almost) nothing from tokens the prompt's keys reach
    assert any(mx.abs(v).max().item() > 1e-3 for k, v in whole.items() if ".layers.0." in k)
    # and the model holds its real parameters again, not the transformations' copies
    assert all(isinstance(v, mx.array) for _, v in tree_flatten(model.trainable_parameters()))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_frozen_bottom_blocks_run_once_and_change_nothing(tmp_path, arch):
    # LoRA on the last 2 of 4 blocks: blocks 0-1 hold nothing trainable, so `with_entries` runs
    # them once per group and the policy's and the reference's passes start at block 2. The
    # log-probs (adapters on and off) and the gradient are those of the whole forward.
    from tiny_model import make_tiny_model

    from mlx_swe_rl.rl.config import LoRAConfig
    from mlx_swe_rl.rl.policy import adapters_off, frozen_depth
    from mlx_swe_rl.rl.trainer import group_gradients, micro_batches, no_grad_log_probs, with_entries

    model, _ = load_model(str(make_tiny_model(tmp_path / "m", layers=4, arch=arch)))
    prepare_policy(model, FinetuneConfig(lora=LoRAConfig(num_layers=2)))
    assert frozen_depth(model) == 2
    random_adapters(model, 3)
    group, loss_fn = five_completions(), weighted_log_prob_loss(model)

    whole = micro_batches(group, 64)
    _, expected = nn.value_and_grad(model, lambda: loss_fn(whole[0], None, None, None))()
    expected = dict(tree_flatten(expected))
    assert expected and all(".layers.2." in k or ".layers.3." in k for k in expected)
    for size in (2, 64):
        plain = micro_batches(group, size)
        micro = with_entries(model, plain, frozen_depth(model))
        assert all(m.entry is not None and m.entry.depth == 2 for m in micro)
        assert micro[0].entry.prompt is micro[-1].entry.prompt  # the prompt's bottom blocks ran once
        with adapters_off(model):
            for a, b in zip(no_grad_log_probs(model, plain), no_grad_log_probs(model, micro)):
                assert mx.abs(a - b).max().item() < 1e-5
        for a, b in zip(no_grad_log_probs(model, plain), no_grad_log_probs(model, micro)):
            assert mx.abs(a - b).max().item() < 1e-5
        sums: dict[str, float] = {}
        got = dict(tree_flatten(group_gradients(model, loss_fn, micro, [None] * len(micro), [None] * len(micro), sums)))
        assert got.keys() == expected.keys()
        for name, value in expected.items():
            assert mx.abs(got[name] - value).max().item() < 1e-5 + 1e-4 * mx.abs(value).max().item(), name


def test_frozen_depth_is_zero_when_every_block_or_the_embedding_trains(tiny_model_dir):
    from mlx_swe_rl.rl.policy import frozen_depth

    for finetune in (FinetuneConfig(), FinetuneConfig(mode="full")):
        model, _ = load_model(str(tiny_model_dir))
        prepare_policy(model, finetune)
        assert frozen_depth(model) == 0
