"""`python -m mlx_swe_rl.eval`: the same command as `mlx-swe-rl eval` (greedy or sampled evaluation)."""

from .cli.eval import main

if __name__ == "__main__":
    main()
