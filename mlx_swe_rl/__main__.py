from .cli.app import main

main(prog_name="mlx-swe-rl")
