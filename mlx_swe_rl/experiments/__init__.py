"""Comparison experiments as one file and one command (`mlx-swe-rl experiment FILE`): the file's
format (spec), the pieces it breaks into and their state on disk (pieces), and the paired report
drawn from the files the pieces leave (report, figure)."""
