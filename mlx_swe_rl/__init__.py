"""mlx-swe-rl: on-policy GRPO in MLX that teaches a small code LLM to fix buggy Python functions."""

from .blas import preload_openblas

# Before anything imports mlx.core: see blas.py.
preload_openblas()

__version__ = "0.1.0"
