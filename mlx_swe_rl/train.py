"""`python -m mlx_swe_rl.train`: the same command as `mlx-swe-rl train --config FILE [--set key=value ...]`."""

from .cli.train import main

if __name__ == "__main__":
    main()
