"""The memory preflight (mlx_swe_rl.rl.memory): the estimate against measured peaks, the exact
byte counts it rests on, and the check that stops a run that cannot fit before it loads."""

from __future__ import annotations

import time

import mlx.core as mx
import pytest
from click.testing import CliRunner
from mlx.utils import tree_flatten

from mlx_swe_rl.rl import memory
from mlx_swe_rl.rl.config import load_config
from mlx_swe_rl.rl.memory import ModelShape, Workload, estimate

# config.json of the built-in smollm2-135m and the shape bench/bench_memory.py builds (W2)
SMOLLM2 = {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "intermediate_size": 1536,
           "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True}
QWEN_1_5B = {"model_type": "qwen2", "hidden_size": 1536, "num_hidden_layers": 28, "intermediate_size": 8960,
             "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}

# MLX peaks recorded in docs/training.md and docs/speed-and-memory.md, the settings they were measured with,
# and the longest prompt (tokens); the estimate of each must be within 25%. "step": a training
# step's peak (sampling and update, AdamW state held); "first update": the update phase of a
# run's first optimizer step, before AdamW holds its m and v.
W1 = ("smollm2 W1 step", SMOLLM2, 2.35, 112, "step",
      ["model.dtype=float32", "sampling.group_size=8", "sampling.max_tokens=128", "train.puzzles_per_step=1",
       "train.micro_batch_size=8", "grpo.beta=0.04", "finetune.lora.rank=8"])
QUICKSTART = ("quick-start step", SMOLLM2, 3.58, 194, "step",  # 194: its 4 training puzzles' longest
              ["sampling.group_size=8", "sampling.max_tokens=192", "train.puzzles_per_step=3",
               "train.micro_batch_size=8", "grpo.beta=0.0"])
# W2 measures one optimizer step on fixed completions (no sampling, no AdamW state yet).
W2_LORA = ("W2 LoRA + KL", QWEN_1_5B, 5.85, 256, "first update",
           ["model.dtype=bfloat16", "finetune.mode=lora", "sampling.group_size=8", "sampling.max_tokens=384",
            "train.puzzles_per_step=1", "train.micro_batch_size=1", "grpo.beta=0.04"])
W2_FULL = ("W2 full + KL", QWEN_1_5B, 17.63, 256, "first update",
           ["model.dtype=bfloat16", "finetune.mode=full", "sampling.group_size=8", "sampling.max_tokens=384",
            "train.puzzles_per_step=1", "train.micro_batch_size=1", "grpo.beta=0.04"])


def workload(config: dict, overrides: list[str], prompt: int) -> tuple[ModelShape, Workload]:
    shape = ModelShape.from_config(config)
    return shape, Workload.from_config(load_config(None, overrides), shape, train_prompt=prompt)


@pytest.mark.parametrize("case", [W1, QUICKSTART, W2_LORA, W2_FULL], ids=lambda c: c[0])
def test_estimate_within_25_percent_of_the_measured_peaks(case):
    name, config, measured_gb, prompt, what, overrides = case
    shape, work = workload(config, overrides, prompt)
    est = estimate(shape, work, steady=what == "step")
    got = est.peak if what == "step" else est.phases["update"]
    print(f"{name}: estimate {got / 1e9:.2f} GB, measured {measured_gb} GB ({got / 1e9 / measured_gb - 1:+.1%})")
    assert est.peak_phase == "update"
    assert got / 1e9 == pytest.approx(measured_gb, rel=0.25)


def test_weight_bytes_of_the_w2_shape():
    shape = ModelShape.from_config(QWEN_1_5B)
    assert shape.weight_bytes(2) == pytest.approx(3.09e9, rel=0.002)  # bench_memory.py: weights 3.09 GB
    full = estimate(shape, workload(QWEN_1_5B, W2_FULL[-1], 256)[1])
    assert full.parts["reference"] == full.parts["weights"] == full.parts["trainable"]
    assert full.parts["optimizer"] == 2 * full.parts["trainable"]  # AdamW m and v, held in later steps


def parameter_bytes(tree) -> int:
    return sum(v.nbytes for _, v in tree_flatten(tree))


def test_weights_and_adapters_count_exactly_what_mlx_holds(tiny_model_dir):
    import json

    import mlx.nn as nn

    from mlx_swe_rl.models.specs import load_model
    from mlx_swe_rl.rl.policy import prepare_policy

    config = json.loads((tiny_model_dir / "config.json").read_text())
    shape = ModelShape.from_config(config)
    model, _ = load_model(str(tiny_model_dir))
    assert shape.weight_bytes(4) == parameter_bytes(model.parameters())
    for overrides in ([], ["finetune.lora.keys=[self_attn.q_proj, mlp.down_proj]", "finetune.lora.num_layers=1",
                           "finetune.lora.rank=3"]):
        cfg = load_config(None, overrides)
        lora_model, _ = load_model(str(tiny_model_dir))
        prepare_policy(lora_model, cfg.finetune)
        work = Workload.from_config(cfg, shape, train_prompt=10)
        assert memory.lora_bytes(shape, work) == parameter_bytes(lora_model.trainable_parameters()), overrides
    nn.quantize(model, group_size=64, bits=4)  # what `finetune.reference_bits: 4` does to the reference
    assert shape.weight_bytes(4, bits=4) == parameter_bytes(model.parameters())
    quantized = ModelShape.from_config({**config, "quantization": {"group_size": 64, "bits": 4}})
    assert quantized.weight_bytes(4) == parameter_bytes(model.parameters())


def test_more_tokens_and_micro_batches_cost_more():
    shape, base = workload(SMOLLM2, QUICKSTART[-1], 194)
    e0 = estimate(shape, base)
    from dataclasses import replace

    assert estimate(shape, replace(base, micro_batch=4)).phases["update"] < e0.phases["update"]
    longer = replace(base, phases={k: replace(s, max_tokens=384) for k, s in base.phases.items()})
    assert estimate(shape, longer).peak > e0.peak
    assert estimate(shape, replace(base, batch_size=4)).phases["sampling"] < e0.phases["sampling"]


def test_check_stops_above_the_limit_and_warns_near_it():
    shape, work = workload(SMOLLM2, QUICKSTART[-1], 194)
    peak = estimate(shape, work).peak
    logs: list[str] = []
    memory.check(shape, work, int(peak * 2), "test", logs.append)
    assert logs == []
    memory.check(shape, work, int(peak / 0.9), "test", logs.append)
    assert len(logs) == 1 and logs[0].startswith("memory: warning:") and "90%" in logs[0]
    with pytest.raises(memory.MemoryCheckError) as info:
        memory.check(shape, work, int(peak * 0.7), "test", logs.append)
    message = str(info.value)
    assert "\n" not in message and message.startswith("memory: this run needs about")
    assert f"{peak / 1e9:.2f} GB" in message and f"{int(peak * 0.7) / 1e9:.2f} GB" in message
    assert "train.micro_batch_size=" in message
    memory.check(shape, work, None, "unknown", logs.append)  # no figure for the device: no check


def test_suggested_settings_fit():
    shape, work = workload(SMOLLM2, ["sampling.batch_size=4096", "sampling.max_tokens=32768",
                                     "train.micro_batch_size=4096", "train.puzzles_per_step=3"], 194)
    limit = 16e9
    assert estimate(shape, work).peak > limit
    fits = memory.fitting_settings(shape, work, limit)
    assert fits is not None and fits["sampling.max_tokens"] < 32768
    from dataclasses import replace

    smaller = replace(work, micro_batch=fits["train.micro_batch_size"], batch_size=fits["sampling.batch_size"],
                      phases={k: replace(s, max_tokens=fits["sampling.max_tokens"]) for k, s in work.phases.items()})
    assert estimate(shape, smaller).peak <= limit
    # a model whose weights alone exceed the limit: nothing fits
    assert memory.fitting_settings(shape, work, 0.3e9) is None


def test_device_memory_names_its_source():
    limit, source = memory.device_memory()
    assert source
    if mx.default_device() == mx.cpu and limit is not None:
        assert 0 < limit < 1 << 50


# ------------------------------------------------------------------------------ the command line
def forbid_loading(monkeypatch) -> None:
    """Loading weights or calibrating before the preflight fails the test."""
    import mlx_swe_rl.models.specs as specs
    import mlx_swe_rl.rl.selection as selection
    import mlx_swe_rl.rl.trainer as trainer

    def refuse(*args, **kwargs):
        raise AssertionError("the preflight must stop the run before this")

    monkeypatch.setattr(specs, "load_model", refuse)
    monkeypatch.setattr(trainer, "build_policy", refuse)
    monkeypatch.setattr(selection, "calibrate", refuse)


def test_the_quick_start_with_absurd_settings_stops_in_seconds(tmp_path, monkeypatch):
    """The issue's acceptance check: one line about memory, exit 1, no traceback, nothing loaded
    or written."""
    from mlx_swe_rl.cli.train import main

    forbid_loading(monkeypatch)
    start = time.perf_counter()
    result = CliRunner().invoke(main, ["--config", "configs/quickstart.yaml", "--set", "sampling.batch_size=4096",
                                       "--set", "sampling.max_tokens=32768", "--set", "train.micro_batch_size=4096",
                                       "--set", f"output_dir={tmp_path}", "--quiet"])
    seconds = time.perf_counter() - start
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: memory: this run needs about"), result.output
    assert "settings that would fit" in lines[0] and "sampling.max_tokens=" in lines[0]
    assert seconds < 30
    assert not any(tmp_path.iterdir())  # no run directory


def test_dry_run_prints_the_estimate_of_the_quick_start(tmp_path, monkeypatch):
    from mlx_swe_rl.cli.train import main

    forbid_loading(monkeypatch)
    result = CliRunner().invoke(main, ["--config", "configs/quickstart.yaml", "--dry-run",
                                       "--set", f"output_dir={tmp_path}"])
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith("memory estimate for configs/quickstart.yaml: peak ")
    for part in ("weights", "activations kept for the backward", "peak of the update", "peak of the sampling",
                 "peak of the eval", "peak of the calibration"):
        assert part in result.output, part
    assert not any(tmp_path.iterdir())
    # over the limit, the dry run says so the way the preflight does
    result = CliRunner().invoke(main, ["--config", "configs/quickstart.yaml", "--dry-run",
                                       "--set", "sampling.max_tokens=32768", "--set", f"output_dir={tmp_path}"])
    assert result.exit_code == 1 and result.output.strip().splitlines()[-1].startswith("Error: memory:")


def test_lora_on_the_top_blocks_keeps_only_their_activations():
    # Below the lowest adapter autodiff keeps nothing (a 16-block model measured 1.16 GB above its
    # weights with adapters everywhere, 0.39 GB with them in the top 4); full fine-tuning keeps all.
    shape, every = workload(QWEN_1_5B, W2_LORA[-1], 256)
    _, top7 = workload(QWEN_1_5B, W2_LORA[-1] + ["finetune.lora.num_layers=7"], 256)
    _, full = workload(QWEN_1_5B, W2_FULL[-1], 256)
    _, full_top7 = workload(QWEN_1_5B, W2_FULL[-1] + ["finetune.lora.num_layers=7"], 256)
    assert estimate(shape, top7).parts["activations"] == pytest.approx(estimate(shape, every).parts["activations"] / 4)
    assert estimate(shape, full_top7).parts["activations"] == estimate(shape, full).parts["activations"]
