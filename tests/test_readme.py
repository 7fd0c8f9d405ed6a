"""The README is the user's front door: keep its reference tables true to the code."""

from pathlib import Path

from mlx_swe_rl.rl.config import describe

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_every_config_key_is_documented():
    missing = [key for key, _, _ in describe() if f"`{key}`" not in README]
    assert not missing, f"README configuration reference lacks: {missing}"


def test_every_command_is_documented():
    from mlx_swe_rl.cli.app import main

    missing = [name for name in main.commands if f"mlx-swe-rl {name}" not in README]
    assert not missing, f"README command table lacks: {missing}"
