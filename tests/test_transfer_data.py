"""The transfer experiment's choice of training puzzles (forge/spread.py, used by scripts/spread.py): no function dominates, and a function's
puzzles spread over its mutator families before any family repeats."""

from collections import Counter

from mlx_swe_rl.forge import spread
from mlx_swe_rl.puzzles.format import Puzzle


def forged(function: str, family: str, n: int) -> Puzzle:
    return Puzzle(id=f"{function}__{family}_{n}", tier="easy", split="train", entry_point=function,
                  description="", buggy="", oracle="", tests=(), family=family)


def pool() -> list[Puzzle]:
    big = [forged("big", family, n) for family, count in (("var_replace", 12), ("negation", 2), ("arith_op", 1))
           for n in range(1, count + 1)]
    return big + [forged("small", "return_value", 1), forged("small", "stmt_remove", 1)]


def test_at_most_k_per_function_and_small_functions_keep_everything():
    chosen = spread.capped(pool(), 4, seed=0)
    per_function = Counter(spread.function_of(p) for p in chosen)
    assert per_function == {"big": 4, "small": 2}


def test_a_function_s_families_are_all_chosen_before_one_repeats():
    big = [p for p in spread.capped(pool(), 4, seed=0) if p.id.startswith("big__")]
    assert {p.family for p in big} == {"var_replace", "negation", "arith_op"}
    assert Counter(p.family for p in big)["var_replace"] <= 2


def test_the_choice_is_seeded_and_differs_between_seeds():
    ids = [[p.id for p in spread.capped(pool(), 4, seed)] for seed in (0, 0, 1, 2, 3)]
    assert ids[0] == ids[1]
    assert any(other != ids[0] for other in ids[2:])


def test_function_of_keeps_double_underscores_inside_a_seed_id():
    assert spread.function_of(forged("ring__buffer", "negation", 3)) == "ring__buffer"
