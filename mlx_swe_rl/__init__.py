"""mlx-swe-rl: on-policy GRPO in MLX that teaches a small code LLM to fix buggy Python functions."""

__version__ = "0.1.0"
