from .cli import main

main(prog_name="mlx-swe-rl")
