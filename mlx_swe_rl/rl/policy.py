"""The trainable policy: LoRA or full fine-tuning, its reference, and completion log-probs.

LoRA mode keeps one copy of the weights: the reference policy is the same model with every
LoRA layer's scale set to 0 (`adapters_off`). Full mode keeps a frozen second copy, optionally
quantized. Adapters (or full weights) are saved in mlx-lm's adapter format, so
`mlx_lm.generate --adapter-path RUN_DIR` and `mlx_lm.fuse` work on them.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.tuner.lora import LoRALinear

from .config import Config, FinetuneConfig
from .grpo import token_log_probs
from ..models import fastmath


def lora_parameters(cfg: FinetuneConfig) -> dict[str, Any]:
    params = {"rank": cfg.lora.rank, "scale": cfg.lora.scale, "dropout": cfg.lora.dropout}
    if cfg.lora.keys:
        params["keys"] = list(cfg.lora.keys)
    return params


def num_blocks(model: nn.Module) -> int:
    return len(model.layers)


class InputDtypeLoRALinear(LoRALinear):
    """mlx-lm's LoRALinear with the adapter matmuls done in the input's dtype.

    mlx-lm keeps lora_a and lora_b in float32, so with a bfloat16 model `x @ lora_a` promotes x
    to a float32 copy, which autodiff then keeps for lora_a's gradient, in every adapted layer:
    about 0.9 GB for the 1.5B model and one 384-token completion (bench/NOTES.md). Casting the
    small adapters to x's dtype keeps the stored input in bfloat16; the adapters and their
    optimizer state stay float32. Identical to mlx-lm's for float32 models; same parameters,
    so saved adapters are plain mlx-lm adapters.
    """

    def __call__(self, x: mx.array) -> mx.array:
        z = (self.dropout(x) @ self.lora_a.astype(x.dtype)) @ self.lora_b.astype(x.dtype)
        return self.linear(x) + (self.scale * z).astype(x.dtype)


def prepare_policy(model: nn.Module, cfg: FinetuneConfig) -> nn.Module:
    """Freeze the base weights and add LoRA layers (lora mode), or leave everything trainable."""
    from mlx_lm.tuner.utils import linear_to_lora_layers

    if cfg.mode == "lora":
        model.freeze()
        layers = num_blocks(model) if cfg.lora.num_layers < 0 else cfg.lora.num_layers
        linear_to_lora_layers(model, layers, lora_parameters(cfg))
        for _, module in model.named_modules():
            if type(module) is LoRALinear:
                module.__class__ = InputDtypeLoRALinear
    else:
        model.unfreeze()
    model.train()
    return model


def lora_layers(model: nn.Module) -> list[nn.Module]:
    return [m for _, m in model.named_modules() if hasattr(m, "lora_a") and hasattr(m, "scale")]


@contextlib.contextmanager
def adapters_off(model: nn.Module) -> Iterator[nn.Module]:
    """Temporarily turn the LoRA model into its base model (scale 0 on every adapter)."""
    layers = lora_layers(model)
    scales = [layer.scale for layer in layers]
    for layer in layers:
        layer.scale = 0.0
    try:
        yield model
    finally:
        for layer, scale in zip(layers, scales):
            layer.scale = scale


def adapter_config(cfg: FinetuneConfig, model: nn.Module) -> dict[str, Any]:
    """mlx-lm's adapter_config.json content for this fine-tune."""
    layers = num_blocks(model) if cfg.lora.num_layers < 0 else cfg.lora.num_layers
    return {"fine_tune_type": cfg.mode, "num_layers": layers, "lora_parameters": lora_parameters(cfg)}


def save_adapters(model: nn.Module, cfg: FinetuneConfig, directory: Path) -> None:
    """Write adapters.safetensors (the trainable parameters) and adapter_config.json."""
    directory.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.trainable_parameters()))
    mx.save_safetensors(str(directory / "adapters.safetensors"), weights)
    (directory / "adapter_config.json").write_text(json.dumps(adapter_config(cfg, model), indent=1))


def load_trainable(model: nn.Module, directory: Path) -> None:
    """Load trainable parameters saved by `save_adapters` into an already prepared model."""
    model.load_weights(str(directory / "adapters.safetensors"), strict=False)


def frozen_reference(model_spec: str, dtype: str, bits: int | None) -> nn.Module:
    """A second, frozen copy of the base model for full fine-tuning (optionally quantized)."""
    from ..models.specs import load_model

    reference, _ = load_model(model_spec, dtype=dtype, progress=False)
    if bits is not None:
        nn.quantize(reference, group_size=64, bits=bits)
    reference.freeze()
    reference.eval()
    return reference


# --- log-probs of completions ------------------------------------------------------------------

@dataclass
class SequenceBatch:
    """Right-padded prompt + completion token ids and where each completion sits.

    tokens [B, T]; prompt_lens, completion_lens [B]. Position j of a completion (token
    tokens[b, prompt_len + j]) is predicted from hidden state prompt_len + j - 1.
    """

    tokens: mx.array
    prompt_lens: mx.array
    completion_lens: mx.array
    width: int  # the longest completion in the batch

    @classmethod
    def build(cls, prompts: list[list[int]], completions: list[list[int]], pad_id: int = 0) -> "SequenceBatch":
        seqs = [p + c for p, c in zip(prompts, completions)]
        length = max(len(s) for s in seqs)
        padded = [s + [pad_id] * (length - len(s)) for s in seqs]
        return cls(mx.array(padded, dtype=mx.int32), mx.array([len(p) for p in prompts], dtype=mx.int32),
                   mx.array([len(c) for c in completions], dtype=mx.int32),
                   max(len(c) for c in completions))

    def mask(self) -> mx.array:
        """[B, width] 1.0 on real completion tokens."""
        return (mx.arange(self.width)[None, :] < self.completion_lens[:, None]).astype(mx.float32)


def lm_head(model: nn.Module, hidden: mx.array) -> mx.array:
    """Apply the output projection of an mlx-lm causal LM to hidden states."""
    if getattr(model, "lm_head", None) is not None:
        return model.lm_head(hidden)
    return model.model.embed_tokens.as_linear(hidden)


def head_module(model: nn.Module) -> nn.Module:
    """The module holding the output projection's weights (the embedding when they are tied)."""
    return model.lm_head if getattr(model, "lm_head", None) is not None else model.model.embed_tokens


LOGITS_CHUNK_BYTES = 64 * 2**20  # float32 logits materialised at once by `head_log_probs`


def head_log_probs(model: nn.Module, hidden: mx.array, targets: mx.array, positions: list[list[int]],
                   with_entropy: bool = False) -> tuple[mx.array, mx.array | None]:
    """log pi(target) [B, W] from final hidden states [B, W, H], at `positions[b]` of row b (0
    elsewhere), and with `with_entropy` the policy's entropy there (no gradient).

    Only those positions reach the LM head: padding, and the feedback and template tokens
    between the turns of a multi-turn episode, never do. The head and log-softmax run in chunks
    of positions whose float32 logits fit in LOGITS_CHUNK_BYTES; with several chunks each is
    checkpointed (its logits are freed after the forward and recomputed in the backward), so
    memory does not grow with G x length x vocab: with Qwen's 151,936-token vocabulary one
    384-token completion is already 233 MB of logits.
    """
    batch, width, dim = hidden.shape
    # Flat indices of the positions wanted, and for every [b, w] slot its index among them
    # (the others point at an appended 0).
    real = [b * width + w for b, row in enumerate(positions) for w in row]
    slot = [0] * (batch * width)
    for i, flat in enumerate(real):
        slot[flat] = i + 1
    index = mx.array(real, dtype=mx.int32)
    flat_hidden = hidden.reshape(batch * width, dim)[index]
    flat_targets = targets.reshape(batch * width)[index]
    step = max(1, LOGITS_CHUNK_BYTES // (4 * head_module(model).weight.shape[0]))

    def chunk(h: mx.array, t: mx.array) -> tuple[mx.array, ...]:
        logits = lm_head(model, h).astype(mx.float32)
        # stop_gradient: the checkpoint differentiates all inputs, and token ids have no gradient
        logp = token_log_probs(logits, mx.stop_gradient(t))
        if not with_entropy:
            return (logp,)
        frozen = mx.stop_gradient(logits)
        lse = mx.logsumexp(frozen, axis=-1, keepdims=True)
        return logp, lse[:, 0] - (mx.exp(frozen - lse) * frozen).sum(-1)

    run = chunk if step >= len(real) else nn.utils.checkpoint(head_module(model), chunk)
    parts = [run(flat_hidden[i:i + step], flat_targets[i:i + step]) for i in range(0, len(real), step)]
    slots = mx.array(slot, dtype=mx.int32)

    def unflatten(values: list[mx.array]) -> mx.array:
        return mx.concatenate([mx.zeros((1,), mx.float32), *values])[slots].reshape(batch, width)

    entropy = unflatten([mx.stop_gradient(p[1]) for p in parts]) if with_entropy else None
    return unflatten([p[0] for p in parts]), entropy


def completion_log_probs(model: nn.Module, batch: SequenceBatch, with_entropy: bool = False
                         ) -> tuple[mx.array, mx.array | None]:
    """log pi(completion token) for every completion position: [B, width] (0 beyond the end).

    One forward over prompt + completion; the LM head runs only on the completion positions
    (prompt positions need no logits), and log-softmax is taken in float32. With
    `with_entropy`, also the policy's per-token entropy (no gradient).
    """
    hidden = model.model(batch.tokens)  # [B, T, H]; causal mask, so right padding is harmless
    positions = batch.prompt_lens[:, None] - 1 + mx.arange(batch.width)[None, :]
    positions = mx.minimum(positions, batch.tokens.shape[1] - 1)
    picked = mx.take_along_axis(hidden, positions[..., None], axis=1)  # [B, width, H]
    targets = mx.take_along_axis(batch.tokens, mx.minimum(positions + 1, batch.tokens.shape[1] - 1), axis=1)
    return head_log_probs(model, picked, targets, [list(range(n)) for n in batch.completion_lens.tolist()],
                          with_entropy)


# --- the same, with the prompt computed once per group -----------------------------------------

class PrefixCache:
    """Per-layer keys/values of one prompt, reused by a batch of its completions.

    Unlike mlx-lm's KVCache it writes nothing in place: the completion pass concatenates the
    prompt's keys (broadcast over the batch) with its own, so gradients flow back through the
    shared prompt computation exactly once, and one prompt's caches serve any number of passes.
    """

    def __init__(self, keys: mx.array | None = None, values: mx.array | None = None) -> None:
        self.keys: mx.array | None = keys
        self.values: mx.array | None = values
        self.offset = 0 if keys is None else keys.shape[2]

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.keys is None:
            self.keys, self.values, self.offset = keys, values, keys.shape[2]
            return keys, values
        shape = (keys.shape[0], *self.keys.shape[1:])
        return (mx.concatenate([mx.broadcast_to(self.keys, shape), keys], axis=2),
                mx.concatenate([mx.broadcast_to(self.values, shape), values], axis=2))

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> Any:
        from mlx_lm.models.base import create_causal_mask

        if self.keys is None:
            return "causal" if n > 1 else None
        return create_causal_mask(n, offset=self.offset)


@dataclass
class GroupBatch:
    """Completions of one prompt: prompt ids, right-padded completion ids [G, width] and the loss
    mask over them ([G, width]: 1 on the tokens the model chose; 0 on padding and, in a
    multi-turn episode, on the bridges between its turns)."""

    prompt: mx.array
    tokens: mx.array
    loss_mask: list[list[float]]
    width: int

    @classmethod
    def build(cls, prompt: list[int], completions: list[list[int]], masks: list[list[float]] | None = None,
              pad_id: int = 0) -> "GroupBatch":
        """`masks[i]` per token of completion i (default: all of it is the model's)."""
        width = max(len(c) for c in completions)
        masks = masks if masks is not None else [[1.0] * len(c) for c in completions]
        if any(len(m) != len(c) for m, c in zip(masks, completions)):
            raise ValueError("a loss mask must have one value per completion token")
        padded = [c + [pad_id] * (width - len(c)) for c in completions]
        return cls(mx.array(prompt, dtype=mx.int32), mx.array(padded, dtype=mx.int32),
                   [list(m) + [0.0] * (width - len(m)) for m in masks], width)

    def mask(self) -> mx.array:
        return mx.array(self.loss_mask, dtype=mx.float32)

    def positions(self) -> list[list[int]]:
        """Per completion, the positions the loss reads."""
        return [[w for w, m in enumerate(row) if m] for row in self.loss_mask]


@dataclass
class PromptStates:
    """What the completions of a prompt read from it: every layer's keys and values, and the
    last position's hidden state (it predicts completion token 0)."""

    keys: list[mx.array]
    values: list[mx.array]
    last: mx.array  # [1, 1, H]

    def arrays(self) -> list[mx.array]:
        """Flat, for mx.vjp and mx.value_and_grad: the keys, the values, the last hidden state."""
        return [*self.keys, *self.values, self.last]

    @classmethod
    def from_arrays(cls, arrays: list[mx.array]) -> "PromptStates":
        n = (len(arrays) - 1) // 2
        return cls(list(arrays[:n]), list(arrays[n:2 * n]), arrays[-1])


@dataclass
class Entry:
    """One micro-batch's hidden states entering block `depth`, computed once without gradient by
    the blocks below it. Those blocks hold no adapter, so they are the same for the policy and
    its adapters-off reference: both passes start at block `depth`, and the gradient stops
    there."""

    depth: int
    prompt: mx.array  # [1, P, H]: the group's prompt (one array shared by its micro-batches)
    completions: mx.array  # [g, width - 1, H]: completion tokens 0 .. width - 2, which the loss reads after


def frozen_depth(model: nn.Module) -> int:
    """How many bottom blocks a training pass may skip: those below the lowest block with a
    trainable parameter (LoRA on the last N of L blocks: L - N; full fine-tuning: 0). 0 also
    where the model's forward cannot start at a block (see `_plain_blocks`)."""
    if not _plain_blocks(model.model):
        return 0
    names = [name for name, _ in tree_flatten(model.trainable_parameters())]
    if not names or not all(name.startswith("model.layers.") for name in names):
        return 0
    return min(int(name.split(".")[2]) for name in names)


def _plain_blocks(inner: nn.Module) -> bool:
    """Whether mlx-lm's forward of this inner model is embed, then every block under one causal
    mask made from the first cache, then the final norm, so `_blocks` may run any slice of it:
    qwen2 (not pipelined) and llama without sliding-window layers."""
    from mlx_lm.models import llama, qwen2

    if isinstance(inner, qwen2.Qwen2Model):
        return getattr(inner, "pipeline_size", 1) == 1
    return isinstance(inner, llama.LlamaModel) and getattr(inner, "swa_idx", None) is None


def _blocks(model: nn.Module, hidden: mx.array, caches: list[PrefixCache], start: int, stop: int) -> mx.array:
    """Blocks start .. stop - 1 over `hidden` (entering block `start`), one cache per block, under
    the mask the first cache makes (as mlx-lm's forward does)."""
    from mlx_lm.models.base import create_attention_mask

    mask = create_attention_mask(hidden, caches[0])
    for layer, cache in zip(model.model.layers[start:stop], caches):
        hidden = layer(hidden, mask, cache)
    return hidden


def entries(model: nn.Module, batches: list[GroupBatch], depth: int) -> list[Entry]:
    """The `Entry` at block `depth` of each micro-batch of one group (`batches` share a prompt):
    the prompt through blocks 0 .. depth - 1 once, then each micro-batch's completions against
    its keys and values. No gradient; the fast prompt-length attention may run."""
    embed = model.model.embed_tokens
    caches = [PrefixCache() for _ in range(depth)]
    out = []
    with fastmath.inference():
        prompt = mx.stop_gradient(_blocks(model, embed(batches[0].prompt[None]), caches, 0, depth))
        mx.eval(prompt)
        for batch in batches:
            if batch.width > 1:
                shared = [PrefixCache(c.keys, c.values) for c in caches]
                completions = mx.stop_gradient(_blocks(model, embed(batch.tokens[:, :-1]), shared, 0, depth))
            else:
                completions = mx.zeros((batch.tokens.shape[0], 0, prompt.shape[-1]), prompt.dtype)
            mx.eval(completions)
            out.append(Entry(depth, prompt, completions))
    return out


def _forward(model: nn.Module, tokens: mx.array, caches: list[PrefixCache], entered: mx.array | None,
             depth: int) -> mx.array:
    """Final hidden states of `tokens`: the whole forward, or with `entered` (their hidden states
    entering block `depth`) the blocks from `depth` on and the final norm."""
    if entered is None:
        return model.model(tokens, cache=caches)
    return model.model.norm(_blocks(model, entered, caches, depth, len(model.model.layers)))


def prompt_states(model: nn.Module, prompt: mx.array, entry: Entry | None = None) -> PromptStates:
    """One forward over a prompt's ids [P]: its keys and values per layer and last hidden state.
    With an `entry`, only blocks from `entry.depth` on run, and only their keys and values are held."""
    depth = entry.depth if entry is not None else 0
    caches = [PrefixCache() for _ in model.layers[depth:]]
    hidden = _forward(model, prompt[None], caches, entry.prompt if entry is not None else None, depth)  # [1, P, H]
    return PromptStates([c.keys for c in caches], [c.values for c in caches], hidden[:, -1:])


def completion_pass(model: nn.Module, states: PromptStates, batch: GroupBatch, with_entropy: bool = False,
                    entry: Entry | None = None) -> tuple[mx.array, mx.array | None]:
    """log pi of `batch`'s completions [G, width] after the prompt whose `states` are given: one
    forward over the completions attending to the prompt's keys and values. Completion token 0
    is predicted from the prompt's last position, token j from completion position j-1. With
    an `entry` (the one `states` were made with), the pass starts at its block."""
    caches = [PrefixCache(k, v) for k, v in zip(states.keys, states.values)]
    group = batch.tokens.shape[0]
    first = mx.broadcast_to(states.last, (group, 1, states.last.shape[-1]))
    if batch.width > 1:
        depth = entry.depth if entry is not None else 0
        entered = entry.completions if entry is not None else None
        rest = _forward(model, batch.tokens[:, :-1], caches, entered, depth)  # [G, width - 1, H]
        hidden = mx.concatenate([first, rest], axis=1)
    else:
        hidden = first
    return head_log_probs(model, hidden, batch.tokens, batch.positions(), with_entropy)


def group_log_probs(model: nn.Module, batch: GroupBatch, with_entropy: bool = False
                    ) -> tuple[mx.array, mx.array | None]:
    """Like `completion_log_probs`, but the prompt runs once for the whole group: one pass over
    the prompt (`prompt_states`), then one over the completions (`completion_pass`)."""
    return completion_pass(model, prompt_states(model, batch.prompt), batch, with_entropy)


# --- the model bundle ------------------------------------------------------------------------

@dataclass
class Policy:
    """The model being trained, its tokenizer, and how to reach the reference / initial policy."""

    model: nn.Module
    tokenizer: Any
    config: Config
    reference: nn.Module | None = None  # full mode: the frozen copy

    def reference_logits_model(self):
        """A context manager yielding the reference model (LoRA: the same model, adapters off)."""
        if self.reference is not None:
            return contextlib.nullcontext(self.reference)
        return adapters_off(self.model)

    def sampling_model(self):
        """The model to sample from: the policy (on_policy) or the initial weights (frozen)."""
        if self.config.sampling.mode == "frozen":
            return self.reference_logits_model()
        return contextlib.nullcontext(self.model)

    def shared_depth(self) -> int:
        """How many bottom blocks the policy and its reference share, so that an update runs them
        once (`entries`): `frozen_depth` of the model when the reference is the same model with
        adapters off; 0 with a separate reference copy."""
        return frozen_depth(self.model) if self.reference is None else 0


def build_policy(cfg: Config) -> Policy:
    """The policy a run trains: the model with LoRA (or all weights) trainable, and in full
    mode the frozen reference copy when the KL term or the frozen sampler needs it."""
    from ..models.specs import load_model

    model, tokenizer = load_model(cfg.model.spec, dtype=cfg.model.dtype)
    mx.random.seed(cfg.seed)  # LoRA's A matrices are drawn at random: same config, same start
    prepare_policy(model, cfg.finetune)
    reference = None
    if cfg.finetune.mode == "full" and (cfg.grpo.beta > 0 or cfg.sampling.mode == "frozen"):
        reference = frozen_reference(cfg.model.spec, cfg.model.dtype, cfg.finetune.reference_bits)
    return Policy(model, tokenizer, cfg, reference)
