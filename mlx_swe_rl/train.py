"""`python -m mlx_swe_rl.train --config configs/grpo.yaml [--set key=value ...] [--resume]`."""

from .cli.train import main

if __name__ == "__main__":
    main()
