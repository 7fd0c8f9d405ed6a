"""Tasks as data: the puzzle format, test plans (asserts -> probes) and training-set files.

The bottom of the pipeline: nothing here runs candidate code or loads a model.
"""

from .format import Puzzle, PuzzleError, load_puzzle, load_puzzles

__all__ = ["Puzzle", "PuzzleError", "load_puzzle", "load_puzzles"]
