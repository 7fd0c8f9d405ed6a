"""`mlx-swe-rl soup`: K checkpoints' adapters averaged into one mlx-lm adapter (issue 53's rule
for choosing a run's final adapter), and clear errors for adapters that cannot be averaged."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from click.testing import CliRunner
from mlx.utils import tree_flatten

from mlx_swe_rl.cli.app import main
from mlx_swe_rl.models.soup import SoupError, soup
from mlx_swe_rl.rl.config import FinetuneConfig
from mlx_swe_rl.rl.policy import prepare_policy, save_adapters


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_model_dir):
    """Three LoRA checkpoints of the tiny model, each with its own random adapter values, saved
    as the trainer saves them (a step in state.json, as in a run's checkpoint/)."""
    from mlx_lm import load

    model, _ = load(str(tiny_model_dir))
    cfg = FinetuneConfig()
    prepare_policy(model, cfg)
    root = tmp_path_factory.mktemp("checkpoints")
    dirs = []
    for step in (10, 20, 30):
        mx.random.seed(step)
        fresh = [(name, mx.random.normal(value.shape)) for name, value in tree_flatten(model.trainable_parameters())]
        model.load_weights(fresh, strict=False)
        directory = root / f"step-{step}"
        save_adapters(model, cfg, directory)
        (directory / "state.json").write_text(json.dumps({"step": step}))
        dirs.append(directory)
    return dirs


def arrays(directory):
    return {k: np.array(v) for k, v in mx.load(str(directory / "adapters.safetensors")).items()}


def test_the_soup_is_the_elementwise_mean_of_its_checkpoints(checkpoints, tmp_path):
    out = soup(checkpoints, tmp_path / "soup")
    inputs = [arrays(c) for c in checkpoints]
    got = arrays(out)
    assert got.keys() == inputs[0].keys() and any(k.endswith("lora_b") for k in got)
    for name, value in got.items():
        np.testing.assert_allclose(value, np.mean([a[name] for a in inputs], axis=0), rtol=1e-6, atol=1e-7)
    assert not np.allclose(got[name], inputs[0][name])  # really averaged, not a copy of the first
    assert json.loads((out / "adapter_config.json").read_text()) == \
        json.loads((checkpoints[0] / "adapter_config.json").read_text())
    provenance = json.loads((out / "soup.json").read_text())
    assert [c["step"] for c in provenance["checkpoints"]] == [10, 20, 30]


def test_the_soup_loads_as_an_mlx_lm_adapter(checkpoints, tiny_model_dir, tmp_path):
    """What `eval --adapter` and `mlx_lm.generate --adapter-path` do: mlx-lm's load with the
    adapter path puts the soup's arrays into the model's LoRA layers."""
    from mlx_swe_rl.models.specs import load_model

    out = tmp_path / "soup"
    result = CliRunner().invoke(main, ["soup", *map(str, checkpoints), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"the mean of 3 adapters (load it with --adapter {out})" in result.output
    model, _ = load_model(str(tiny_model_dir), adapter=out, dtype="float32", progress=False)
    loaded = dict(tree_flatten(model.parameters()))
    for name, value in arrays(out).items():
        np.testing.assert_array_equal(np.array(loaded[name]), value)


def rewrite_config(directory, **changes):
    config = json.loads((directory / "adapter_config.json").read_text())
    config["lora_parameters"].update(changes)
    (directory / "adapter_config.json").write_text(json.dumps(config))


def copy_checkpoint(source, target):
    import shutil

    shutil.copytree(source, target)
    return target


def test_a_different_config_is_a_one_line_error(checkpoints, tmp_path):
    other = copy_checkpoint(checkpoints[1], tmp_path / "other")
    rewrite_config(other, scale=99.0)
    with pytest.raises(SoupError, match=r"does not match .*: adapter_config.json differs in lora_parameters$"):
        soup([checkpoints[0], other], tmp_path / "soup")


def test_missing_keys_or_other_shapes_are_one_line_errors(checkpoints, tmp_path):
    weights = mx.load(str(checkpoints[0] / "adapters.safetensors"))
    name = sorted(weights)[0]
    fewer = copy_checkpoint(checkpoints[1], tmp_path / "fewer")
    mx.save_safetensors(str(fewer / "adapters.safetensors"), {k: v for k, v in weights.items() if k != name})
    with pytest.raises(SoupError, match=f"lacks array {name}"):
        soup([checkpoints[0], fewer], tmp_path / "a")
    wider = copy_checkpoint(checkpoints[1], tmp_path / "wider")
    mx.save_safetensors(str(wider / "adapters.safetensors"), {**weights, name: mx.zeros((3, 3))})
    with pytest.raises(SoupError, match=rf"{name} is \(3, 3\) float32, not"):
        soup([checkpoints[0], wider], tmp_path / "b")


@pytest.mark.parametrize("case, needle", [
    ("one", "at least two checkpoints"),
    ("twice", "given twice"),
    ("not-an-adapter", "no adapter_config.json (expected an mlx-lm adapter directory"),
    ("out-exists", "already exists"),
])
def test_bad_command_lines_are_one_line_errors(checkpoints, tmp_path, case, needle):
    out = tmp_path / "soup"
    inputs = {"one": checkpoints[:1], "twice": [checkpoints[0], checkpoints[0]],
              "not-an-adapter": [checkpoints[0], tmp_path], "out-exists": checkpoints[:2]}[case]
    if case == "out-exists":
        (out / "x").parent.mkdir()
        (out / "x").write_text("")
    result = CliRunner().invoke(main, ["soup", *map(str, inputs), "--out", str(out)])
    assert result.exit_code == 1 and needle in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_the_soup_keeps_its_runs_training_config_when_they_share_one(checkpoints, tmp_path):
    """Checkpoints kept by one run (RUN/kept/step-N, RUN/checkpoint): the soup gets RUN's
    config.yaml, so `export` knows its base model; from two runs' configs, it gets none."""
    import shutil

    run, other = tmp_path / "run", tmp_path / "other"
    for directory, text in ((run, "seed: 0\n"), (other, "seed: 1\n")):
        directory.mkdir()
        (directory / "config.yaml").write_text(text)
    kept = [shutil.copytree(c, run / "kept" / c.name) for c in checkpoints[:2]]
    shutil.copytree(checkpoints[2], run / "checkpoint")
    shutil.copytree(checkpoints[2], other / "checkpoint")
    out = soup([*kept, run / "checkpoint"], tmp_path / "one")
    assert (out / "config.yaml").read_text() == "seed: 0\n"
    assert not (soup([*kept, other / "checkpoint"], tmp_path / "two") / "config.yaml").exists()
    assert not (soup(checkpoints[:2], tmp_path / "none") / "config.yaml").exists()
