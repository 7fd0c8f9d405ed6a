"""The command line: `mlx-swe-rl` and its subcommands, shared options and one-line errors."""
