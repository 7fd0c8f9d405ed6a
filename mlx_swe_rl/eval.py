"""`python -m mlx_swe_rl.eval --model SPEC [...]`: greedy or sampled evaluation on the puzzles."""

from .cli.eval import main

if __name__ == "__main__":
    main()
