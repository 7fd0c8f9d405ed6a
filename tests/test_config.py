"""Training configuration (mlx_swe_rl.config): defaults, YAML files, --set overrides, errors."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import mlx.core as mx
import pytest
import yaml

from mlx_swe_rl.models.specs import auto_dtype, resolve_dtype
from mlx_swe_rl.rl.config import Config, ConfigError, describe, load_config, to_dict

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = sorted((ROOT / "configs").glob("*.yaml"))


def error(overrides=(), path=None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    message = str(info.value)
    assert "\n" not in message and message.strip() == message
    return message


# ------------------------------------------------------------------------------ loading
def test_defaults():
    cfg = load_config(None)
    assert cfg == Config()
    assert cfg.grpo.beta == 0.04 and cfg.grpo.num_iterations == 1 and cfg.grpo.advantage == "std"
    assert cfg.sampling.group_size == 8 and cfg.sampling.mode == "on_policy"
    assert cfg.finetune.mode == "lora" and cfg.finetune.lora.rank == 8
    assert cfg.reward == {"tests": 1.0}
    assert cfg.puzzles.tiers is None and cfg.workers is None
    assert cfg.run_dir == Path("outputs") / "run"


def test_yaml_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "run_name": "exp1", "seed": 3,
        "grpo": {"beta": 0.0, "clip_high": 0.28, "advantage": "rloo"},
        "finetune": {"mode": "full", "lora": {"rank": 16}},
        "puzzles": {"tiers": ["easy", "medium"]},
        "reward": {"tests": 1.0, "format": 0.1},
        "optim": {"lr": 2},  # an int where a float is expected is fine
    }))
    cfg = load_config(path)
    assert cfg.run_name == "exp1" and cfg.seed == 3
    assert (cfg.grpo.beta, cfg.grpo.clip_high, cfg.grpo.advantage) == (0.0, 0.28, "rloo")
    assert cfg.grpo.clip_low == 0.2  # untouched keys keep their defaults
    assert cfg.finetune.mode == "full" and cfg.finetune.lora.rank == 16 and cfg.finetune.lora.scale == 20.0
    assert cfg.puzzles.tiers == ["easy", "medium"]
    assert cfg.reward == {"tests": 1.0, "format": 0.1}
    assert cfg.optim.lr == 2.0 and isinstance(cfg.optim.lr, float)


def test_empty_file_and_empty_section_are_defaults(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty) == Config()
    section = tmp_path / "section.yaml"
    section.write_text("grpo:\n")
    assert load_config(section) == Config()


def test_overrides():
    cfg = load_config(None, ["grpo.beta=0", "finetune.lora.rank=4", "puzzles.tiers=[easy, hard]",
                             "train.final_eval=false", "model.spec=/some/dir", "workers=3", "puzzles.dir=null",
                             "reward={tests: 1, similarity: 0.5}", "optim.lr=0.0005", "run_name=a b"])
    assert cfg.grpo.beta == 0.0 and isinstance(cfg.grpo.beta, float)
    assert cfg.finetune.lora.rank == 4
    assert cfg.puzzles.tiers == ["easy", "hard"] and cfg.puzzles.dir is None
    assert cfg.train.final_eval is False
    assert cfg.model.spec == "/some/dir" and cfg.workers == 3
    assert cfg.reward == {"tests": 1.0, "similarity": 0.5}
    assert cfg.optim.lr == 0.0005 and cfg.run_name == "a b"


def test_overrides_apply_on_top_of_the_file_in_order(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("grpo:\n  beta: 0.1\n  clip_low: 0.3\ntrain:\n  steps: 7\n")
    cfg = load_config(path, ["grpo.beta=0.2", "train.steps=9", "train.steps=11"])
    assert (cfg.grpo.beta, cfg.grpo.clip_low, cfg.train.steps) == (0.2, 0.3, 11)


def test_to_dict_round_trips(tmp_path):
    cfg = load_config(None, ["grpo.beta=0", "puzzles.tiers=[easy]", "finetune.reference_bits=8"])
    path = tmp_path / "saved.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    assert load_config(path) == cfg


@pytest.mark.parametrize("how", ["set", "file"])
def test_scientific_notation_learning_rate(tmp_path, how):
    if how == "set":
        cfg = load_config(None, ["optim.lr=1e-5"])
    else:
        path = tmp_path / "c.yaml"
        path.write_text("optim:\n  lr: 1e-5\n")
        cfg = load_config(path)
    assert cfg.optim.lr == 1e-5


def test_yaml_booleans_are_booleans():
    # YAML 1.1: unquoted yes/no/on/off are booleans; only a quoted "yes" is a string.
    assert load_config(None, ["train.final_eval=no"]).train.final_eval is False
    assert load_config(None, ["grpo.mask_truncated=yes"]).grpo.mask_truncated is True


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("overrides, expected", [
    (["grpo.betta=0"], "grpo.betta: unknown key (did you mean 'grpo.beta'?)"),
    (["finetune.lora.rnak=4"], "finetune.lora.rnak: unknown key (did you mean 'finetune.lora.rank'?)"),
    (["grop.beta=0"], "grop: unknown key (did you mean 'grpo'?)"),
    (["zzz.beta=0"], "zzz: unknown key (valid: "),
    (["train.steps=1.5"], "train.steps: expected an integer, got 1.5"),
    (["train.steps=true"], "train.steps: expected an integer, got True"),
    (["train.final_eval='yes'"], "train.final_eval: expected true or false, got 'yes'"),
    (["train.final_eval=1"], "train.final_eval: expected true or false, got 1"),
    (["grpo.beta=high"], "grpo.beta: expected a number, got 'high'"),
    (["grpo.beta=-1"], "grpo.beta: -1.0 is below the minimum 0.0"),
    (["grpo.clip_low=2"], "grpo.clip_low: 2.0 is above the maximum 1.0"),
    (["sampling.group_size=1"], "sampling.group_size: 1 is below the minimum 2"),
    (["sampling.top_p=1.5"], "sampling.top_p: 1.5 is above the maximum 1.0"),
    (["sampling.mode=onpolicy"], "sampling.mode: 'onpolicy' is not one of on_policy, frozen; "
                                 "did you mean 'on_policy'?"),
    (["grpo.advantage=zscore"], "grpo.advantage: 'zscore' is not one of std, mean, rloo"),
    (["finetune.reference_bits=3"], "finetune.reference_bits: 3 is not one of null, 4, 8"),
    (["model.dtype=float63"], "model.dtype: 'float63' is not one of auto, float32, float16, bfloat16; "
                              "did you mean 'float32'?"),
    (["reward.test=1"], "reward.test: unknown reward function (did you mean 'tests'?)"),
    (["reward={tests: 0}"], "reward: all weights are zero"),
    (["reward={tests: fast}"], "reward.tests: weight 'fast' must be a number"),
    (["reward=[tests]"], "reward: expected a mapping, got ['tests']"),
    (["reward_without_tests={tests: 1}"], "reward_without_tests: tests needs tests (use similarity, progress, format)"),
    (["reward_without_tests.simil=1"], "reward_without_tests.simil: unknown reward function (did you mean "
                                       "'similarity'?)"),
    (["prompt.format=diff"], "prompt.format: 'diff' is not one of function, search_replace"),
    (["puzzles.tiers=easy"], "puzzles.tiers: expected a list, got 'easy'"),
    (["puzzles.tiers=[1]"], "puzzles.tiers[0]: expected a string, got 1"),
    (["grpo=3"], "grpo: expected a mapping, got int"),
    (["grpo.beta.x=1"], "grpo.beta: expected a number, got {'x': 1}"),
    (["no-equals-sign"], "--set 'no-equals-sign': expected key.sub=value"),
    (["=3"], "--set '=3': expected key.sub=value"),
    (["grpo.beta=[1"], "--set grpo.beta: cannot parse value '[1'"),
])
def test_override_errors_name_the_key(overrides, expected):
    message = error(overrides)
    assert message.startswith(expected), message


@pytest.mark.parametrize("text, expected", [
    ("grpo:\n  betaa: 0.1\n", "grpo.betaa: unknown key (did you mean 'grpo.beta'?)"),
    ("sampling: [1, 2]\n", "sampling: expected a mapping, got list"),
    ("- a\n- b\n", "expected a mapping of config sections"),
])
def test_errors_in_a_file_name_the_file_and_the_key(tmp_path, text, expected):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert error(path=path) == f"{path}: {expected}"


def test_invalid_yaml_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("grpo:\n  beta: [0.1\n")
    message = error(path=path)
    assert message.startswith(f"{path}: not valid YAML")


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    message = error(path=path)
    assert message.startswith(f"{path}: cannot read")


# ------------------------------------------------------------------------------ describe
def leaf_keys(cls=Config, prefix="") -> list[str]:
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            keys += leaf_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def test_describe_lists_every_leaf_key_with_a_doc():
    rows = describe()
    keys = [key for key, _, _ in rows]
    assert keys == leaf_keys()
    assert len(keys) == len(set(keys))
    for key, default, doc in rows:
        assert doc.strip(), f"{key} has no doc"
        assert "\n" not in doc and "\n" not in default
    table = {key: default for key, default, _ in rows}
    assert table["grpo.beta"] == "0.04" and table["puzzles.tiers"] == "null"
    assert table["reward"] == "{tests: 1.0}" and table["finetune.lora.rank"] == "8"
    assert table["sampling.mode"] == "on_policy"


def test_every_described_key_can_be_set():
    cfg = Config()
    for key, default, _ in describe():
        value = yaml.safe_load(default)
        loaded = load_config(None, [f"{key}={default}"])
        node = loaded
        for part in key.split("."):
            node = getattr(node, part)
        assert node == (resolve_dtype(value) if key == "model.dtype" else value), key
    assert load_config(None, []) == cfg


def test_dtype_auto_is_resolved_for_the_device():
    # this suite runs on MLX's CPU backend: auto means float32 there, and the config records it
    assert mx.default_device().type == mx.DeviceType.cpu
    assert auto_dtype() == "float32"
    assert Config().model.dtype == "float32"
    assert load_config(None, ["model.dtype=auto"]).model.dtype == "float32"
    assert load_config(None, ["model.dtype=bfloat16"]).model.dtype == "bfloat16"
    assert "dtype: float32" in yaml.safe_dump(to_dict(load_config(None, [])))


# ------------------------------------------------------------------------------ bundled configs
@pytest.mark.skipif(not BUNDLED, reason="no configs/*.yaml yet")
@pytest.mark.parametrize("path", BUNDLED, ids=[p.name for p in BUNDLED])
def test_bundled_configs_load(path):
    cfg = load_config(path)
    assert isinstance(cfg, Config)
    raw = yaml.safe_load(path.read_text()) or {}
    assert isinstance(raw, dict)


def test_prompt_keys_reach_the_environment():
    from mlx_swe_rl.env.codefix import CodeFixEnv
    from mlx_swe_rl.puzzles.format import load_puzzles

    cfg = load_config(None, ["prompt.template=seed", "prompt.system=none"])
    puzzle = load_puzzles(None, ["easy"], "train")[0]
    with CodeFixEnv([puzzle], style=cfg.prompt.style()) as env:
        messages = env.prompt_for(puzzle.id)
    assert [m["role"] for m in messages] == ["user"]
    assert messages[0]["content"].startswith("Fix the buggy Python function below.")
    with pytest.raises(ConfigError, match="prompt.template: 'sead' is not one of block, seed, find"):
        load_config(None, ["prompt.template=sead"])
