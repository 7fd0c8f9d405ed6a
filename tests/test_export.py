"""`mlx-swe-rl export`: a run's adapters fused into a standalone mlx-lm model (and GGUF), and the
check that the export's greedy completions equal the adapter model's, token for token."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from click.testing import CliRunner
from mlx.utils import tree_flatten

import mlx_swe_rl.rl.export as export_module
from mlx_swe_rl.cli.app import main
from mlx_swe_rl.models.gguf import read_gguf_metadata
from mlx_swe_rl.puzzles.format import load_puzzles
from mlx_swe_rl.rl.config import load_config
from mlx_swe_rl.rl.export import ExportError, export_run
from mlx_swe_rl.rl.trainer import train
from mlx_swe_rl.runfiles import default_mode
from test_trainer import ChoiceEnv

CHECK = ["--check-puzzles", "4", "--max-tokens", "24"]


class ParityEnv(ChoiceEnv):
    """Reward 1 for completions of an even number of characters: a signal that moves the
    adapters in a few steps, with no sandbox."""

    def __init__(self):
        super().__init__([])

    def reward(self, text: str) -> float:
        return float(len(text) % 2 == 0)


def trained_run(tmp_path, model_dir, name: str, mode: str = "lora"):
    """A three-step run on the tiny model; its evaluation puzzles are the bundled easy tier."""
    mx.random.seed(0)
    cfg = load_config(None, [f"model.spec={model_dir}", f"output_dir={tmp_path}", f"run_name={name}",
                             "puzzles.tiers=[easy]", "sampling.max_tokens=6", "sampling.group_size=4",
                             "sampling.temperature=1.0", "train.final_eval=false", "train.steps=3",
                             "train.puzzles_per_step=4", "grpo.beta=0.0", f"finetune.mode={mode}",
                             "optim.lr=0.03" if mode == "lora" else "optim.lr=0.001"])
    train(cfg, env=ParityEnv(), progress=False, log=lambda _: None)
    return cfg.run_dir


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_model_dir):
    return trained_run(tmp_path_factory.mktemp("runs"), tiny_model_dir, "lora")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("llama") / "model", arch="llama")


def export(run_dir, out, *extra):
    return CliRunner().invoke(main, ["export", str(run_dir), "--out", str(out), *CHECK, *extra])


def test_an_exported_lora_run_passes_its_check_and_loads_with_mlx_lm(lora_run, tiny_model_dir, tmp_path):
    from mlx_lm import load

    out = tmp_path / "exported"
    result = export(lora_run, out)
    assert result.exit_code == 0, result.output
    assert "LoRA layers fused" in result.output
    assert "identical to the adapter model's on 4 of 4 puzzles" in result.output
    record = json.loads((out / "export.json").read_text())
    assert record["ok"] and record["mode"] == "lora" and record["fused_layers"] == 14  # 2 blocks x 7 linears
    assert out.stat().st_mode & 0o777 == default_mode(directory=True)  # not mkdtemp's private 0700
    assert record["checks"][0]["puzzles"] and not record["checks"][0]["differing"]
    model, tokenizer = load(str(out))  # a plain mlx-lm model: no adapters, no LoRA parameters
    names = dict(tree_flatten(model.parameters()))
    assert not [n for n in names if "lora" in n]
    base = mx.load(str(tiny_model_dir / "model.safetensors"))
    key = "model.layers.0.self_attn.q_proj.weight"
    assert not np.allclose(np.array(names[key]), np.array(base[key]))  # the adapters are in the weights
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)


def test_the_check_fails_when_a_weight_of_the_export_is_altered(lora_run, tmp_path, monkeypatch):
    original = export_module.save_model_dir

    def save_then_alter(out, *args):
        original(out, *args)
        weights = mx.load(str(out / "model.safetensors"))
        key = "model.layers.1.mlp.down_proj.weight"
        weights[key] = weights[key] * 1.5
        mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})

    monkeypatch.setattr(export_module, "save_model_dir", save_then_alter)
    out = tmp_path / "altered"
    result = export(lora_run, out)
    assert result.exit_code == 1 and "Traceback" not in result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and "check (mlx-lm directory) failed" in error[0] and "of 4 puzzles" in error[0]
    record = json.loads((out / "export.json").read_text())
    assert not record["ok"] and record["checks"][0]["differing"]


def test_the_check_fails_when_the_fuse_drops_the_adapters(lora_run, tmp_path, monkeypatch):
    """mlx-lm #1564: a fuse that silently loses weights. Here the base layers replace the
    LoRA layers, as if the adapters had never been trained."""
    from mlx.utils import tree_unflatten

    def drop(model):
        layers = [(name, m.linear) for name, m in model.named_modules() if hasattr(m, "fuse")]
        model.update_modules(tree_unflatten(layers))
        return len(layers)

    monkeypatch.setattr(export_module, "fuse_adapters", drop)
    result = export_run(lora_run, tmp_path / "dropped", check_count=4, max_tokens=24, log=lambda _: None)
    assert not result.ok and result.checks[0].differing


def test_a_full_fine_tune_exports_its_saved_weights(tmp_path, tiny_model_dir):
    run = trained_run(tmp_path, tiny_model_dir, "full", mode="full")
    result = export_run(run, tmp_path / "out", check_count=3, max_tokens=16, log=lambda _: None)
    assert result.ok and result.mode == "full" and result.fused_layers == 0
    saved = mx.load(str(run / "adapters.safetensors"))
    exported = mx.load(str(tmp_path / "out" / "model.safetensors"))
    assert saved.keys() == exported.keys()
    assert all(np.array_equal(np.array(saved[k]), np.array(exported[k])) for k in saved)


def test_dtype_chooses_the_exported_weights_and_the_reference(lora_run, tmp_path):
    """A bfloat16 run fused in bfloat16 rounds W + s A B; --dtype float32 exports (and checks
    against) the adapter model in float32 instead."""
    import shutil

    run = tmp_path / "bf16-run"
    shutil.copytree(lora_run, run)
    (run / "config.yaml").write_text((run / "config.yaml").read_text().replace("dtype: float32", "dtype: bfloat16"))
    out = tmp_path / "out"
    result = export(run, out, "--dtype", "float32")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "export.json").read_text())["meta"]["dtype"] == "float32"
    assert {v.dtype for v in mx.load(str(out / "model.safetensors")).values()} == {mx.float32}


def test_gguf_export_of_a_llama_model_reads_back_to_the_same_completions(tmp_path, llama_dir):
    run = trained_run(tmp_path, llama_dir, "llama")
    out = tmp_path / "out"
    result = export(run, out, "--gguf")
    assert result.exit_code == 0, result.output
    assert "check (GGUF): greedy completions identical to the adapter model's on 4 of 4" in result.output
    md = read_gguf_metadata(out / "model.gguf")
    # mlx-lm writes "llama" (SentencePiece) for every vocabulary; this one is byte-level BPE
    assert md["tokenizer.ggml.model"] == "gpt2" and md["tokenizer.ggml.pre"] == "gpt-2"
    assert md["tokenizer.ggml.merges"] and "<|im_start|>" in md["tokenizer.chat_template"]


def test_gguf_of_an_architecture_mlx_lm_cannot_convert_is_a_one_line_error(lora_run, tmp_path):
    out = tmp_path / "out"
    result = export(lora_run, out, "--gguf")
    assert result.exit_code == 1 and not out.exists()
    assert result.output.strip().splitlines() == [
        "Error: --gguf: mlx-lm converts only llama, mixtral, mistral models to GGUF, not model_type 'qwen2'; "
        "the mlx-lm directory alone can be exported (drop --gguf)"]


@pytest.mark.parametrize("target, needle", [
    ("missing", "no such directory"),
    ("empty", "no config.yaml (not a run directory, or no checkpoint saved yet)"),
])
def test_a_bad_run_dir_is_a_one_line_error(tmp_path, target, needle):
    (tmp_path / "empty").mkdir()
    result = export(tmp_path / target, tmp_path / "out")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines() == [f"Error: {tmp_path / target}: {needle}"]


def test_an_existing_out_directory_is_refused(lora_run, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("mine")
    result = export(lora_run, tmp_path / "taken")
    assert result.exit_code == 1 and result.output.strip().splitlines() == [
        f"Error: --out: {tmp_path / 'taken'} already exists (choose a new directory)"]
    assert (tmp_path / "taken" / "x").read_text() == "mine"


def test_adapter_only_writes_a_small_checked_adapter_that_loads_as_the_run_does(lora_run, tiny_model_dir, tmp_path):
    """--adapter-only: the run's LoRA arrays in float16 with its adapter_config.json and
    config.yaml; the base model with that adapter gives the run's greedy completions, and
    mlx-lm loads it by its own `adapter_path`."""
    from mlx_lm import load

    out = tmp_path / "adapter"
    result = export(lora_run, out, "--adapter-only")
    assert result.exit_code == 0, result.output
    assert "in float16" in result.output and "identical to the adapter model's on 4 of 4 puzzles" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapters.safetensors", "config.yaml",
                                                     "export.json"]
    assert (out / "config.yaml").read_text() == (lora_run / "config.yaml").read_text()
    saved, written = mx.load(str(lora_run / "adapters.safetensors")), mx.load(str(out / "adapters.safetensors"))
    assert saved.keys() == written.keys() and all(v.dtype == mx.float16 for v in written.values())
    assert all(np.allclose(np.array(saved[k]), np.array(written[k].astype(mx.float32)), rtol=1e-3, atol=1e-6)
               for k in saved)
    assert (out / "adapters.safetensors").stat().st_size < 0.6 * (lora_run / "adapters.safetensors").stat().st_size
    record = json.loads((out / "export.json").read_text())
    assert record["ok"] and record["adapter_dtype"] == "float16" and record["fused_layers"] == 0
    sampled = {json.loads(line)["puzzle_id"] for line in (lora_run / "rollouts.jsonl").read_text().splitlines()}
    entry = {p.id: p.entry_point for p in load_puzzles(None, ["easy"])}
    assert record["trained_on"] == {"steps": 3, "puzzles": sorted(sampled),  # what the adapter has seen
                                    "functions": sorted({entry[i] for i in sampled})}
    model, _ = load(str(tiny_model_dir), adapter_path=str(out))
    assert any("lora_a" in name for name, _ in tree_flatten(model.parameters()))


def test_adapter_only_refuses_a_full_fine_tune_and_gguf(tmp_path, tiny_model_dir, lora_run):
    full = trained_run(tmp_path, tiny_model_dir, "full", mode="full")
    result = export(full, tmp_path / "out", "--adapter-only")
    assert result.exit_code == 1 and "is a full fine-tune" in result.output and "Traceback" not in result.output
    result = export(lora_run, tmp_path / "out2", "--adapter-only", "--gguf")
    assert result.exit_code == 1 and "--gguf" in result.output and not (tmp_path / "out2").exists()


def test_adapter_only_without_a_check_loads_no_model(lora_run, tmp_path, monkeypatch):
    import mlx_swe_rl.models.specs as specs

    def no_model(*args, **kwargs):
        raise AssertionError("no check asked for, so no model should be loaded")

    monkeypatch.setattr(specs, "load_model", no_model)
    result = CliRunner().invoke(main, ["export", str(lora_run), "--out", str(tmp_path / "a"), "--adapter-only",
                                       "--check-puzzles", "0"])
    assert result.exit_code == 0, result.output
    assert "not checked (--check-puzzles 0)" in result.output and (tmp_path / "a" / "adapters.safetensors").is_file()
