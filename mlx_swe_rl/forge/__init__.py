"""Making and validating puzzles: the checks behind `puzzles check`, and the forge that
mutates correct seed functions into validated bug-fix puzzles."""
