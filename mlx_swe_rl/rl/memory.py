"""Memory preflight: the run's peak memory estimated from the model's shapes, before loading it.

Users of peer trainers find out that GRPO does not fit their 16 GB Mac after minutes of loading
and sampling (mlx-lm-lora #16, mlx-lm #828). `estimate` predicts the peak of each phase of a run
from config.json and the run's settings, `check` compares the largest with what the device
offers, and the trainer stops with one line (naming settings that would fit) before it loads
the weights.

What a phase holds (bytes; L blocks, hidden H, intermediate I, heads h of size d, KV heads k,
vocabulary V, prompt P, completion W, micro-batch m):
- resident: the weights (quantized ones at their bits), the frozen reference of full
  fine-tuning with beta > 0 or frozen sampling (`finetune.reference_bits`), AdamW's m and v of
  what trains (float32 LoRA adapters, or every weight);
- update: the gradients (one copy; three while micro-batches accumulate: the sum, the new
  micro-batch's and their sum), and what autodiff keeps of the forward over one prompt plus m
  completions, in every block that trains (LoRA on the top N blocks: those N; autodiff keeps
  nothing of the frozen blocks below them, measured): per block and token 4H + 2hd + 3I values
  (norm inputs and outputs, queries, attention output, gate, up and their product), the keys and
  values the completions attend to (2kd per position, per completion), and the attention
  probabilities (h x W x (P + W) per completion: MLX's CPU attention keeps them), plus the LM
  head's float32 logits;
- sampling (training steps, evaluations, calibration): the batched KV cache of
  batch x (P + max_tokens) positions (mlx-lm grows it in steps of 256) and the prefill's logits.

Calibrated against MLX's peaks measured on SmolLM2-135M (float32) and the bf16 shape of
Qwen2.5-Coder-1.5B (W1, W2 and the quick start; tests/test_memory.py holds the figures).
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from .config import Config

GB = 1e9
WARN_FRACTION = 0.8  # warn at this share of the limit
KV_STEP = 256  # mlx-lm's KVCache grows in steps of this many positions
# The LM head of one micro-batch, in bytes per completion position and vocabulary entry: measured
# 2.35 float32 logits' worth with policy.LOGITS_CHUNK_BYTES at 64 MiB (SmolLM2, 512-1536
# positions: 445-471 KB per position). The chunks bound the transient logits, but not all of it.
HEAD_BYTES_PER_LOGIT = 9.4
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
LORA_SHAPES = {  # module path suffix -> (in, out) in units the shape resolves
    "q_proj": ("hidden", "q"), "k_proj": ("hidden", "kv"), "v_proj": ("hidden", "kv"), "o_proj": ("q", "hidden"),
    "gate_proj": ("hidden", "intermediate"), "up_proj": ("hidden", "intermediate"),
    "down_proj": ("intermediate", "hidden"),
}
ALL_LINEARS = tuple(f"{'self_attn' if k[0] in 'qkvo' else 'mlp'}.{k}" for k in LORA_SHAPES)


class MemoryCheckError(RuntimeError):
    """The run will not fit (or its model cannot be read); the message is one line."""


# --- the model's shape ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs from a model's config.json (Llama / Qwen2 / Mistral style)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True
    qkv_bias: bool = False
    bits: int | None = None  # quantized weights: bits per value
    group_size: int = 64

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "ModelShape":
        """Read the fields of a Hugging Face / mlx-lm config.json (a multimodal model's
        `text_config` when there is one); KeyError names a missing field."""
        c = {**config, **config.get("text_config", {})}
        heads = int(c["num_attention_heads"])
        hidden = int(c["hidden_size"])
        quant = config.get("quantization") or {}
        return cls(layers=int(c["num_hidden_layers"]), hidden=hidden, intermediate=int(c["intermediate_size"]),
                   heads=heads, kv_heads=int(c.get("num_key_value_heads") or heads),
                   head_dim=int(c.get("head_dim") or hidden // heads), vocab=int(c["vocab_size"]),
                   tied=bool(c.get("tie_word_embeddings", False)),
                   qkv_bias=c.get("model_type") == "qwen2" or bool(c.get("attention_bias", False)),
                   bits=quant.get("bits"), group_size=int(quant.get("group_size", 64)))

    def dims(self, name: str) -> int:
        return {"hidden": self.hidden, "q": self.heads * self.head_dim, "kv": self.kv_heads * self.head_dim,
                "intermediate": self.intermediate}[name]

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(in, out) of the linear layers of one block."""
        return [(self.dims(i), self.dims(o)) for i, o in LORA_SHAPES.values()]

    def weight_bytes(self, dtype_bytes: int, bits: int | None = None) -> int:
        """All weights; matrices at `bits` (default: the model's own quantization) with a
        scale and a bias per group, everything else at `dtype_bytes`."""
        bits = self.bits if bits is None else bits

        def matrix(n: int) -> float:
            return n * dtype_bytes if bits is None else n * bits / 8 + 2 * dtype_bytes * n / self.group_size

        per_block = sum(matrix(i * o) for i, o in self.linear_shapes())
        small = 2 * self.hidden + (self.dims("q") + 2 * self.dims("kv") if self.qkv_bias else 0)
        embeddings = matrix(self.vocab * self.hidden) * (1 if self.tied else 2)
        return int(self.layers * (per_block + small * dtype_bytes) + embeddings + self.hidden * dtype_bytes)

    def activation_values(self, rank: int = 0) -> int:
        """Values autodiff keeps per token and block (see the module docstring)."""
        return 4 * self.hidden + 2 * self.heads * self.head_dim + 3 * self.intermediate + 7 * rank


def read_shape(model_dir: Path) -> ModelShape:
    """The ModelShape of a resolved model directory, or MemoryCheckError naming the file."""
    path = Path(model_dir) / "config.json"
    try:
        return ModelShape.from_config(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise MemoryCheckError(f"{path}: cannot read the model's shape ({exc})") from None
    except KeyError as exc:
        raise MemoryCheckError(f"{path}: no {exc.args[0]} (the memory estimate needs it; "
                               "train.memory_check=false skips the check)") from None


# --- the run's workload --------------------------------------------------------------------------

@dataclass(frozen=True)
class Sampling:
    """One kind of batched sampling: how many completions at most, how long, after what prompt."""

    completions: int
    max_tokens: int
    prompt: int


@dataclass(frozen=True)
class Workload:
    """The settings that decide a run's memory (from a Config and its prompts' lengths)."""

    dtype_bytes: int
    mode: str  # lora | full
    reference: bool  # a frozen copy of the weights
    reference_bits: int | None
    lora_rank: int
    lora_blocks: int  # blocks with adapters
    lora_keys: tuple[str, ...]
    group_size: int
    puzzles_per_step: int
    micro_batch: int
    train_prompt: int
    batch_size: int
    phases: dict[str, Sampling] = field(default_factory=dict)  # "sampling", "eval", "calibration"

    @property
    def max_tokens(self) -> int:
        return self.phases["sampling"].max_tokens

    @property
    def micro_batches(self) -> int:
        """Forward/backward passes per optimizer update (at most: whole groups may drop out)."""
        return self.puzzles_per_step * math.ceil(self.group_size / self.micro_batch)

    @classmethod
    def from_config(cls, cfg: Config, shape: ModelShape, train_prompt: int, eval_prompt: int = 0,
                    eval_puzzles: int = 0, candidates: int = 0) -> "Workload":
        """The workload of `cfg`: `train_prompt` the longest training prompt (tokens),
        `eval_prompt` / `eval_puzzles` those of the evaluations (0: none), `candidates` the
        number of puzzles calibrated (puzzles.select: mixed)."""
        s, t, f = cfg.sampling, cfg.train, cfg.finetune
        micro = min(t.micro_batch_size, s.group_size)
        # the same resolved settings the phases sample with
        train, evals, calibration = cfg.train_sampling(), cfg.eval_sampling(), cfg.calibration_sampling()
        phases = {"sampling": Sampling(t.puzzles_per_step * train.group_size,
                                       episode_tokens(cfg, train.max_turns, train.max_tokens), train_prompt)}
        if eval_puzzles and (t.final_eval or t.eval_every):
            phases["eval"] = Sampling(eval_puzzles * evals.group_size,
                                      episode_tokens(cfg, evals.max_turns, evals.max_tokens), eval_prompt)
        if candidates and cfg.puzzles.select == "mixed":
            phases["calibration"] = Sampling(candidates * calibration.group_size, calibration.max_tokens,
                                             train_prompt)
        blocks = shape.layers if f.lora.num_layers < 0 else min(f.lora.num_layers, shape.layers)
        return cls(dtype_bytes=DTYPE_BYTES[cfg.model.dtype], mode=f.mode,
                   reference=f.mode == "full" and (cfg.grpo.beta > 0 or s.mode == "frozen"),
                   reference_bits=f.reference_bits, lora_rank=f.lora.rank, lora_blocks=blocks,
                   lora_keys=tuple(f.lora.keys or ALL_LINEARS), group_size=s.group_size,
                   puzzles_per_step=t.puzzles_per_step, micro_batch=micro, train_prompt=train_prompt,
                   batch_size=s.batch_size, phases=phases)


def episode_tokens(cfg: Config, turns: int, max_tokens: int) -> int:
    """The most tokens after the prompt in an episode of `turns` answers: each answer's
    `max_tokens` and, between answers, the feedback's user turn (its characters bound its tokens;
    the chat template adds a few dozen)."""
    return turns * max_tokens + (turns - 1) * (cfg.multi_turn.feedback_chars + 64)


# --- the estimate --------------------------------------------------------------------------------

@dataclass
class Estimate:
    """Bytes per component and per phase; `peak` is the largest phase."""

    parts: dict[str, float]
    phases: dict[str, float]
    notes: dict[str, str]

    @property
    def peak(self) -> float:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    def sampling_peak(self) -> float:
        """The largest phase that samples (every phase but the update)."""
        return max((v for k, v in self.phases.items() if k != "update"), default=0.0)


def lora_bytes(shape: ModelShape, work: Workload) -> int:
    """float32 A and B of every adapted linear."""
    per_block = 0
    for key in work.lora_keys:
        dims = LORA_SHAPES.get(key.rsplit(".", 1)[-1])
        # An unknown module path: assume the widest shape a block has.
        d_in, d_out = (shape.dims(dims[0]), shape.dims(dims[1])) if dims else (shape.hidden, shape.intermediate)
        per_block += work.lora_rank * (d_in + d_out)
    return 4 * per_block * work.lora_blocks


def estimate(shape: ModelShape, work: Workload, steady: bool = True) -> Estimate:
    """The peak of each phase of a run. `steady` counts AdamW's m and v (held from the first
    update on); without it, the first step, as bench/bench_memory.py measures it."""
    b = work.dtype_bytes
    weights = shape.weight_bytes(b)
    reference = shape.weight_bytes(b, work.reference_bits) if work.reference else 0
    trainable = lora_bytes(shape, work) if work.mode == "lora" else weights
    optimizer = 2 * trainable if steady else 0
    gradients = (3 if work.micro_batches > 1 else 1) * trainable
    resident = weights + reference + optimizer

    m, p, w = work.micro_batch, work.train_prompt, work.max_tokens
    rank = work.lora_rank if work.mode == "lora" else 0
    # The prompt and one micro-batch's completions, counted together: exact when a group is one
    # micro-batch; an upper bound when it is cut, since the prompt then runs once per group
    # (trainer.group_gradients) and its activations are held apart from the completions'.
    per_block = b * ((p + m * w) * shape.activation_values(rank)
                     + m * (p + w) * 2 * shape.kv_heads * shape.head_dim
                     + shape.heads * (m * w + p) * (p + w))
    # Only blocks with something to train keep their activations for the backward: below the
    # lowest adapter the forward is a constant to autodiff (a 16-block model measured 1.16 GB
    # above its weights with adapters in every block, 0.39 GB with them in the top 4).
    activations = (work.lora_blocks if work.mode == "lora" else shape.layers) * per_block
    head = HEAD_BYTES_PER_LOGIT * m * w * shape.vocab
    parts = {"weights": weights, "reference": reference, "trainable": trainable, "optimizer": optimizer,
             "gradients": gradients, "activations": activations, "head": head}
    phases = {"update": resident + gradients + activations + head}
    notes = {"update": f"{m} completions of <= {w} tokens after a {p}-token prompt per forward/backward"}
    kv_per_position = shape.layers * 2 * shape.kv_heads * shape.head_dim * b
    for name, s in work.phases.items():
        batch = min(work.batch_size, s.completions)
        positions = KV_STEP * math.ceil((s.prompt + s.max_tokens) / KV_STEP)
        kv = batch * positions * kv_per_position
        prefill = s.prompt * shape.vocab * b  # the prefill's logits of every prompt position
        parts[f"{name} KV cache"] = kv
        phases[name] = resident + kv + prefill
        notes[name] = f"{batch} sequences x {positions} positions of KV cache"
    return Estimate(parts, phases, notes)


# --- what the device offers ----------------------------------------------------------------------

def device_memory() -> tuple[int | None, str]:
    """(bytes a run may use, where the figure comes from); None when unknown."""
    import mlx.core as mx

    if mx.default_device() == mx.gpu:
        info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
        for key in ("max_recommended_working_set_size", "memory_size", "total_memory"):
            if info.get(key):
                return int(info[key]), f"{info.get('device_name', 'GPU')}: {key}"
        return None, "GPU memory unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "CPU: MemAvailable"
    except OSError:
        pass
    try:
        names = ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES") if sys.platform != "darwin" else ("SC_PHYS_PAGES",)
        for name in names:
            if name in os.sysconf_names:
                return os.sysconf("SC_PAGE_SIZE") * os.sysconf(name), f"CPU: {name}"
    except (OSError, ValueError):
        pass
    return None, "memory size unknown"


# --- the check -----------------------------------------------------------------------------------

MAX_TOKENS_KEYS = {"sampling": "sampling.max_tokens", "eval": "train.eval_max_tokens",
                   "calibration": "puzzles.calibration.max_tokens"}


def fitting_settings(shape: ModelShape, work: Workload, limit: float) -> dict[str, int] | None:
    """The settings closest to `work` whose estimate stays within `limit`: first the largest
    train.micro_batch_size and sampling.batch_size (neither changes what is learned), then, if
    even 1 and 1 do not fit, shorter completions (each phase's limit capped; the keys of those
    that change are named). None when nothing fits."""
    tokens = work.max_tokens
    while tokens >= 16:
        shorter = replace(work, phases={k: replace(s, max_tokens=min(s.max_tokens, tokens))
                                        for k, s in work.phases.items()})
        micro = _largest(work.micro_batch,
                         lambda n: estimate(shape, replace(shorter, micro_batch=n)).phases["update"] <= limit)
        batch = _largest(min(work.batch_size, max(s.completions for s in work.phases.values())),
                         lambda n: estimate(shape, replace(shorter, batch_size=n)).sampling_peak() <= limit)
        if micro and batch:
            out = {"train.micro_batch_size": micro, "sampling.batch_size": batch}
            for name, s in work.phases.items():
                if shorter.phases[name].max_tokens != s.max_tokens:
                    # a phase that follows sampling.max_tokens (the config's null) needs no key of its own
                    own = name == "sampling" or s.max_tokens != work.max_tokens
                    out.update({MAX_TOKENS_KEYS[name]: tokens} if own else {})
            return out
        tokens //= 2
    return None


def _largest(start: int, fits: Callable[[int], bool]) -> int | None:
    n = start
    while n >= 1:
        if fits(n):
            return n
        n = n // 2 if n > 1 else 0
    return None


def describe_settings(settings: dict[str, int], work: Workload) -> str:
    """Only the settings that change, as `key=value` pairs."""
    current = {"train.micro_batch_size": work.micro_batch, "sampling.batch_size": work.batch_size}
    changed = [f"{k}={v}" for k, v in settings.items() if current.get(k) != v]
    return " ".join(changed) or "the same settings"


def size(n: float) -> str:
    return f"{n / 1e12:.1f} TB" if n >= 1e12 else f"{n / GB:.2f} GB"


def check(shape: ModelShape, work: Workload, limit: int | None, source: str,
          log: Callable[[str], None]) -> Estimate:
    """Estimate; above `limit` raise MemoryCheckError (one line, with settings that would fit),
    at WARN_FRACTION of it or more log a warning."""
    est = estimate(shape, work)
    if limit is None:
        return est
    peak, share = est.peak, est.peak / limit
    skip = "python -m mlx_swe_rl.train --dry-run shows the estimate; train.memory_check=false skips this check"
    if peak > limit:
        fits = fitting_settings(shape, work, limit * WARN_FRACTION) or fitting_settings(shape, work, limit)
        advice = (f"settings that would fit: {describe_settings(fits, work)}" if fits else
                  f"nothing fits: the weights alone take {size(est.parts['weights'] + est.parts['reference'])}")
        raise MemoryCheckError(f"memory: this run needs about {size(peak)} at its peak ({est.peak_phase}; estimated "
                               f"from the model's shapes), more than the {size(limit)} available ({source}); "
                               f"{advice} ({skip})")
    if share >= WARN_FRACTION:
        fits = fitting_settings(shape, work, limit * WARN_FRACTION)
        advice = f"; smaller: {describe_settings(fits, work)}" if fits else ""
        log(f"memory: warning: this run needs about {size(peak)} at its peak ({est.peak_phase}), {share:.0%} of the "
            f"{size(limit)} available ({source}){advice}")
    return est


def format_estimate(est: Estimate, limit: int | None, source: str, title: str = "") -> str:
    """The breakdown `train --dry-run` prints."""
    lines = [f"memory estimate{' for ' + title if title else ''}: peak {size(est.peak)} ({est.peak_phase})"
             + (f", {est.peak / limit:.0%} of the {size(limit)} available ({source})" if limit else f" ({source})")]
    labels = {"weights": "weights", "reference": "frozen reference", "trainable": "trainable weights",
              "optimizer": "AdamW m and v", "gradients": "gradients (3 copies while accumulating)",
              "activations": "activations kept for the backward", "head": "LM head (float32 logits)"}
    for key, value in est.parts.items():
        if value:
            lines.append(f"  {labels.get(key, key):<42} {size(value):>10}")
    for phase, value in est.phases.items():
        lines.append(f"  peak of the {phase:<30} {size(value):>10}  ({est.notes[phase]})")
    return "\n".join(lines)


def longest_prompts(model_dir: Path, groups: Iterable[list[Any]], style: Any = None) -> list[int]:
    """The longest chat prompt (tokens, with the model's chat template, asked in `style`, an
    `env.prompts.PromptStyle`) of each group of puzzles (0 for an empty group); loads only the
    tokenizer."""
    from mlx_lm.utils import load_tokenizer

    from ..env.prompts import PromptStyle, build_messages
    from ..models.sampling import encode_chat

    tokenizer = load_tokenizer(Path(model_dir))
    lengths: dict[str, int] = {}
    out = []
    for puzzles in groups:
        for p in puzzles:
            if p.id not in lengths:
                lengths[p.id] = len(encode_chat(tokenizer, build_messages(p, style or PromptStyle())))
        out.append(max((lengths[p.id] for p in puzzles), default=0))
    return out


# --- a config's estimate -------------------------------------------------------------------------

def plan(cfg: Config, puzzles: list[Any], eval_set: list[Any]) -> tuple[ModelShape, Workload]:
    """The model's shape and the run's workload for `cfg`, training on (or calibrating)
    `puzzles` and evaluating on `eval_set`; resolves the model spec (a first use may fetch or
    convert it) and reads config.json and the tokenizer, never the weights."""
    from ..models.specs import resolve_model

    model_dir = resolve_model(cfg.model.spec)
    shape = read_shape(model_dir)
    train_prompt, eval_prompt = longest_prompts(model_dir, [puzzles, eval_set], cfg.prompt.style())
    return shape, Workload.from_config(cfg, shape, train_prompt, eval_prompt, len(eval_set), len(puzzles))


def preflight(cfg: Config, puzzles: list[Any], eval_set: list[Any], log: Callable[[str], None]) -> Estimate:
    """Estimate `cfg`'s peak and compare it with the device: MemoryCheckError above the limit,
    a logged warning near it."""
    shape, work = plan(cfg, puzzles, eval_set)
    limit, source = device_memory()
    return check(shape, work, limit, source, log)


def dry_run(cfg: Config, puzzles: list[Any], eval_set: list[Any], title: str,
            log: Callable[[str], None]) -> None:
    """Log the estimate's breakdown, then check it as `preflight` does."""
    shape, work = plan(cfg, puzzles, eval_set)
    limit, source = device_memory()
    log(format_estimate(estimate(shape, work), limit, source, title))
    check(shape, work, limit, source, log)
