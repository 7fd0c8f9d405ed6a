"""The harvest (issue 53): seeds from a small source tree made here, tested by doctests or by
recorded outputs, a seed whose tests cannot tell a mutant apart dropped, a function that is not
self-contained skipped; decontamination against benchmark fingerprints; the licence filter;
the command writing seeds the forge reads."""

from __future__ import annotations

import json
import os
import random
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlx_swe_rl.cli.app import main
from mlx_swe_rl.forge.candidates import scan_file
from mlx_swe_rl.forge.decontam import Benchmarks, fingerprints, load_benchmarks
from mlx_swe_rl.forge.forge import ForgeSettings, candidates, forge
from mlx_swe_rl.forge.harvest import HarvestSettings, harvest, write_harvest
from mlx_swe_rl.forge.recorded import Parameter, argument_lists, literal_of, required_parameters
from mlx_swe_rl.forge.seeds import load_seeds
from mlx_swe_rl.forge.sources import Source, is_permissive, resolve_source, tree_source

MIT = "MIT License\n\nPermission is hereby granted, free of charge, to any person obtaining a copy\n"
GPL = "GNU GENERAL PUBLIC LICENSE\nVersion 3, 29 June 2007\n"

MODULE = '''
import math
import socket


def shout(word):
    """Upper-case a word and add an exclamation mark.

    >>> shout('hi')
    'HI!'
    >>> shout('')
    '!'
    """
    return word.upper() + "!"


def clamp(x, low, high):
    # no doctests: recorded outputs test this one
    if x < low:
        return low
    if x > high:
        return high
    return x


def double(x):
    """Twice x. The examples never call it: no mutant can fail them.

    >>> 2 * 3
    6
    >>> 2 * 0
    0
    """
    result = x * 2
    return result


def host_label(prefix):
    # reads `socket`, which the sandbox refuses: not self-contained
    name = socket.gethostname()
    label = prefix + name
    return label


def hypotenuse(a, b):
    # calls a helper of its module: the helper is carried along
    squares = a * a + b * b
    root = math.sqrt(squares)
    return _round(root)


def _round(x):
    return round(x, 3)
'''


def make_tree(root: Path, licence: str = MIT) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "LICENSE").write_text(licence)
    (root / "pkg" / "shapes.py").write_text(MODULE)
    (root / "tests").mkdir()
    (root / "tests" / "test_shapes.py").write_text("def test_nothing():\n    assert True\n")
    (root / "pkg" / "_vendor").mkdir()
    (root / "pkg" / "_vendor" / "other.py").write_text(MODULE)  # someone else's, under its own licence
    return root


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return make_tree(tmp_path_factory.mktemp("harvest") / "widgets")


@pytest.fixture(scope="module")
def harvested(tree, scorer):
    return harvest([tree_source(tree)], scorer, Benchmarks(), HarvestSettings(seed=3))


def by_name(result):
    return {s.entry_point: s for s in result.seeds}


def test_the_tree_is_a_permissive_source_without_its_tests_or_vendored_code(tree):
    source = tree_source(tree)
    assert source.name == "widgets" and source.licence == "MIT" and source.permissive
    assert [p.name for p in source.files] == ["shapes.py"]


def test_self_contained_candidates(tree):
    scan = scan_file(tree / "pkg" / "shapes.py", tree, "widgets")
    names = [c.name for c in scan.candidates]
    assert names == ["shout", "clamp", "double", "hypotenuse"]  # host_label reads socket
    assert dict(scan.counts) == {"functions": 5, "sized": 5, "self_contained": 4, "with_helpers": 1}
    assert scan.candidates[0].seed_id == "widgets__pkg_shapes__shout" and scan.candidates[0].module == "pkg.shapes"


def test_doctest_seed(harvested):
    shout = by_name(harvested)["shout"]
    assert shout.tests == ("assert shout('hi') == 'HI!'", "assert shout('') == '!'")
    assert shout.source == {"harvest": shout.source["harvest"], "version": "", "path": "pkg/shapes.py", "line": 6,
                            "module": "pkg.shapes", "licence": "MIT", "tests": "doctests"}
    assert shout.description == "Upper-case a word and add an exclamation mark."


def test_recorded_seed(harvested):
    clamp = by_name(harvested)["clamp"]
    assert clamp.source["tests"] == "recorded" and 3 <= len(clamp.tests) <= 8
    namespace: dict = {}
    exec(clamp.code, namespace)
    for test in clamp.tests:  # every recorded value is what the original returns
        exec(test, namespace)
    assert len({t.split(" == ")[1] for t in clamp.tests}) >= 2


def test_a_seed_whose_tests_miss_every_mutant_is_dropped(harvested):
    assert "double" not in by_name(harvested)
    assert harvested.problems["no mutant fails its tests"] == 1


def test_funnel(harvested):
    funnel = harvested.summary()["sources"]["widgets"]["funnel"]
    assert funnel == {"files": 1, "functions": 5, "sized": 5, "self_contained": 4, "with_helpers": 1,
                      "not_benchmark": 4, "unique": 4, "tried": 4, "doctests": 2, "recorded": 2, "tested": 4, "kept": 3}


def test_same_harvest_same_seeds(tree, scorer, harvested):
    again = harvest([tree_source(tree)], scorer, Benchmarks(), HarvestSettings(seed=3))
    assert again.seeds == harvested.seeds


def test_the_forge_reads_the_seeds_and_holds_out_whole_functions(harvested, scorer, tmp_path):
    write_harvest(harvested, tmp_path / "seeds")
    seeds = load_seeds([tmp_path / "seeds"])
    assert [s.id for s in seeds] == [s.id for s in harvested.seeds] and seeds[0].source == harvested.seeds[0].source
    result = forge(seeds, scorer, ForgeSettings(per_seed=2, heldout_frac=0.5, seed=1))
    assert result.puzzles and all(p.tier == "widgets" and p.source["licence"] == "MIT" for p in result.puzzles)
    splits = {}
    for p in result.puzzles:
        splits.setdefault(p.entry_point, set()).add(p.split)
    assert all(len(s) == 1 for s in splits.values())  # every mutant of a function on one side


def test_the_process_random_generator_reads_the_world_a_seeded_one_does_not(tmp_path):
    (tmp_path / "draws.py").write_text(textwrap.dedent('''
        import random
        from random import choice, Random


        def bits(n):
            # the process's generator: a recorded output would not repeat
            out = []
            for _ in range(n):
                out.append(random.choice("01"))
            return "".join(out)


        def pick(items):
            first = list(items)
            first.sort()
            chosen = choice(first)
            return chosen


        def sample(prob, seq, seed=0):
            rng = random.Random(seed)
            kept = []
            for item in seq:
                if rng.random() < prob:
                    kept.append(item)
            return kept
    '''))
    scan = scan_file(tmp_path / "draws.py", tmp_path, "t")
    assert [c.name for c in scan.candidates] == ["sample"]


def test_standard_library_imports_travel_with_the_code(tmp_path):
    (tmp_path / "paths.py").write_text(textwrap.dedent('''
        import os.path
        import subprocess
        from json import dumps as to_json


        def stem_of(path):
            base = os.path.basename(path)
            stem = base.split(".")[0]
            data = to_json(stem)
            return data


        def exists_here(path):
            # reads the machine's files: its result would differ where the model trains
            name = os.path.join(".", path)
            found = os.lstat(name)
            return found.st_size


        def run(args):
            proc = subprocess.run(args)
            code = proc.returncode
            text = str(code)
            return text
    '''))
    scan = scan_file(tmp_path / "paths.py", tmp_path, "t")
    assert [c.name for c in scan.candidates] == ["stem_of"]  # os.lstat reads the world; subprocess is refused
    assert scan.candidates[0].code.startswith("from json import dumps as to_json\nimport os.path\n\n\ndef stem_of")


HELPERS = '''
import math
import socket

SCALE = 3
try:
    import json as codec
except ImportError:
    codec = None


def _digits(x):
    return 2 if x < 10 else 1


def _round(x):
    return round(x, _digits(x))


class Box:
    def __init__(self, size):
        self.size = size


def scaled(x):
    # a constant and a helper that calls another helper: all three travel with it
    boxed = Box(x * SCALE)
    value = math.sqrt(boxed.size)
    return _round(value)


def _host():
    return socket.gethostname()


def host_tag(prefix):
    # its helper reads socket, which the sandbox refuses: not self-contained
    name = _host()
    tag = prefix + name
    return tag


def encoded(value):
    # `codec` is bound twice (under a try): which binding it sees depends on the run
    text = codec.dumps(value)
    size = len(text)
    return size
'''


def test_module_helpers_travel_with_the_function(tmp_path):
    (tmp_path / "helpers.py").write_text(HELPERS)
    scan = scan_file(tmp_path / "helpers.py", tmp_path, "t")
    assert [c.name for c in scan.candidates] == ["scaled"]
    scaled = scan.candidates[0]
    assert scaled.helpers == ("SCALE", "_digits", "_round", "Box")  # in the module's order
    assert scaled.code.startswith("import math\n\n\nSCALE = 3\n\n\ndef _digits(x):")
    assert scaled.code.rstrip().endswith("return _round(value)") and "_host" not in scaled.code
    namespace: dict = {}
    exec(scaled.code, namespace)
    assert namespace["scaled"](12) == 6.0
    assert scan.counts["self_contained"] == 1 and scan.counts["with_helpers"] == 1


def test_helpers_are_carried_up_to_a_number_of_lines(tmp_path):
    (tmp_path / "helpers.py").write_text(HELPERS)
    assert not scan_file(tmp_path / "helpers.py", tmp_path, "t", max_helper_lines=0).candidates
    assert not scan_file(tmp_path / "helpers.py", tmp_path, "t", max_helper_lines=7).candidates  # they take 8
    assert scan_file(tmp_path / "helpers.py", tmp_path, "t", max_helper_lines=8).candidates


def test_a_seed_with_helpers_records_them_and_gets_its_bug_in_the_entry_point(harvested):
    hypotenuse = by_name(harvested)["hypotenuse"]
    assert hypotenuse.source["helpers"] == "_round" and "def _round(x):" in hypotenuse.code
    settings = ForgeSettings(seed=3)
    entry = range(hypotenuse.code.index("def hypotenuse"), len(hypotenuse.code))
    start = hypotenuse.code[:entry.start].count("\n") + 1
    lines = {m.line for m in candidates(hypotenuse, settings)}
    assert lines and min(lines) > start
    unfocused = replace(hypotenuse, source={k: v for k, v in hypotenuse.source.items() if k != "helpers"})
    assert min(m.line for m in candidates(unfocused, settings)) < start  # _round's mutants too


def test_inputs_are_seeded_and_typed():
    params = required_parameters("def f(n: int, text, *, flag=True, scale=2):\n    return n\n", "f")
    assert params == [Parameter("n", "int"), Parameter("text", "str")]
    first = argument_lists(params, ("utf-8", 64), random.Random("0:f"))
    assert first == argument_lists(params, ("utf-8", 64), random.Random("0:f"))
    assert first[0] == "64, ''" and any("'utf-8'" in args for args in first)  # the literals lead the pools
    assert required_parameters("def f(*, key):\n    return key\n", "f") is None
    assert required_parameters("def f():\n    return 1\n", "f") is None


def test_a_function_whose_parameters_all_have_defaults_gets_values_for_the_first_two():
    params = required_parameters("def f(thing=3, other='a', n=None, last=2.5):\n    return thing\n", "f")
    assert params == [Parameter("thing", "int"), Parameter("other", "str")]  # kinds from the defaults
    assert required_parameters("def f(count=1.5):\n    return count\n", "f") == [Parameter("count", "int")]


def test_only_plain_values_that_read_back_are_recorded():
    assert literal_of([1, (2.5, "a"), {"k": None}]) == "[1, (2.5, 'a'), {'k': None}]"
    assert literal_of(float("nan")) is None and literal_of(object()) is None and literal_of("x" * 500) is None


def test_a_recorded_set_reads_the_same_whatever_the_process_hash_seed():
    """String hashes are salted per process, so a set's order is; the recorded text is not."""
    import subprocess
    import sys

    program = ("from mlx_swe_rl.forge.recorded import literal_of\n"
               "print(literal_of([{'not', 'installed', 'pip', 'wheel'}, "
               "{'x': {'q', 'r'}, 'b': 1}, (set(),), ('one',)]))")
    texts = {subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 2, 3, 4)}
    assert texts == {"[{'installed', 'not', 'pip', 'wheel'}, {'b': 1, 'x': {'q', 'r'}}, "
                     "(set(),), ('one',)]\n"}


# ----------------------------------------------------------------------------- decontamination
BENCHMARK = '''
def below_zero(operations):
    """A benchmark's solution."""
    balance = 0
    for op in operations:
        balance += op
        if balance < 0:
            return True
    return False
'''


def test_a_renamed_copy_of_a_benchmark_function_is_caught():
    benchmarks = Benchmarks()
    benchmarks.add(fingerprints(BENCHMARK))
    renamed = BENCHMARK.replace("below_zero", "goes_negative").replace("balance", "total").replace("op", "x")
    renamed = renamed.replace('"""A benchmark\'s solution."""', "# reformatted, no docstring")
    assert "normalised body" in benchmarks.match(renamed)
    same_name = BENCHMARK.replace("balance < 0", "balance <= 0")  # one token changed, same name and size
    assert "name and size" in benchmarks.match(same_name)
    assert benchmarks.match(BENCHMARK.replace("below_zero", "other").replace("< 0", "< -1 + 0")) is None


def test_benchmark_functions_are_dropped_from_the_harvest(tree, scorer):
    benchmarks = Benchmarks()
    benchmarks.add(fingerprints(textwrap.dedent('''
        def yell(w):
            return w.upper() + "!"
    ''')))
    result = harvest([tree_source(tree)], scorer, benchmarks, HarvestSettings(seed=3))
    assert "shout" not in by_name(result) and result.problems["a benchmark's function"] == 1
    assert result.funnel["widgets"]["not_benchmark"] == 3


def test_the_committed_fingerprints_hold_humaneval_mbpp_and_quixbugs():
    benchmarks = load_benchmarks()
    assert set(benchmarks.about["benchmarks"]) == {"humaneval:HumanEval.jsonl.gz", "mbpp:mbpp.jsonl",
                                                   "mbpp:mbpp-sanitized.jsonl", "python:python_programs",
                                                   "python:correct_python_programs"}
    assert len(benchmarks.bodies) > 1200
    data = benchmarks.to_json()  # names and hashes only, no benchmark code
    assert all(len(h) == 16 and int(h, 16) >= 0 for h in data["bodies"])
    assert all(name.isidentifier() and size.isdigit() for name, size in (n.split(":") for n in data["names"]))


def test_a_missing_fingerprint_file_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="nothing.json: cannot read"):
        load_benchmarks(tmp_path / "nothing.json")


# ----------------------------------------------------------------------------- licences
@pytest.mark.parametrize("expression, ok", [
    ("MIT", True), ("BSD-3-Clause", True), ("Apache-2.0", True), ("PSF-2.0", True), ("ISC", True),
    ("MIT OR GPL-2.0", True), ("(Apache-2.0 OR MIT) AND BSD-3-Clause", True), ("MIT AND GPL-3.0", False),
    ("GPL-3.0", False), ("MPL-2.0", False), ("unknown", False)])
def test_permissive_licences(expression, ok):
    assert is_permissive(expression) is ok


def test_a_copyleft_source_is_not_harvested(tmp_path, scorer):
    gpl = tree_source(make_tree(tmp_path / "copyleft", GPL))
    assert gpl.licence == "GPL-3.0" and not gpl.permissive
    result = harvest([gpl], scorer, Benchmarks(), HarvestSettings())
    assert result.seeds == [] and result.funnel["copyleft"]["files"] == 0
    assert result.problems["licence not permissive: GPL-3.0"] == 1


def test_sources_by_name():
    assert resolve_source("stdlib").licence == "PSF-2.0" and resolve_source("stdlib").version.startswith("3.")
    click = resolve_source("click")  # an installed distribution: its licence from its metadata
    assert click.name == "click" and click.permissive and click.files and click.version
    with pytest.raises(ValueError, match="no-such-dist-xyz: not a directory, not an installed distribution"):
        resolve_source("no-such-dist-xyz")


# ----------------------------------------------------------------------------- the command
def test_command_writes_seeds_funnel_and_forged_set(tree, tmp_path):
    out, forged = tmp_path / "seeds", tmp_path / "forged"
    result = CliRunner().invoke(main, ["puzzles", "harvest", str(tree), "--out", str(out), "--forge", str(forged),
                                       "--per-seed", "2", "--workers", "2", "--allow-unconfined"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "harvest.json").read_text())
    funnel = summary["sources"]["widgets"]["funnel"]
    assert funnel["kept"] == 3 and funnel["functions_forged"] == 3 and funnel["mutants_kept"] >= 3
    assert sorted(p.name for p in (out / "widgets").iterdir()) == ["widgets__pkg_shapes__clamp.yaml",
                                                                 "widgets__pkg_shapes__hypotenuse.yaml",
                                                                 "widgets__pkg_shapes__shout.yaml"]
    assert "widgets  MIT" in result.output and (forged / "forge.json").is_file()


def test_command_errors_are_one_line(tmp_path):
    result = CliRunner().invoke(main, ["puzzles", "harvest", "no-such-dist-xyz", "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and "Error: no-such-dist-xyz: not a directory" in result.output
    result = CliRunner().invoke(main, ["puzzles", "harvest", "stdlib", "--out", str(tmp_path / "o"),
                                       "--fingerprints", str(tmp_path / "none.json")])
    assert result.exit_code == 1 and "none.json: cannot read the benchmark fingerprints" in result.output


def test_an_answer_with_the_function_alone_gets_its_helpers_back(harvested):
    """The `seed` template asks for the corrected function only: the scorer puts back the
    imports and helpers of a harvested puzzle's code that the answer does not define."""
    from mlx_swe_rl.env.formats import answer_format, with_context
    from mlx_swe_rl.forge.harvest import _puzzle

    seed = by_name(harvested)["hypotenuse"]
    puzzle = replace(_puzzle(seed), source=seed.source)
    alone = seed.code[seed.code.index("def hypotenuse"):]
    code, problem = answer_format("function").extract(f"```python\n{alone}```", puzzle)
    assert problem is None and code.startswith("import math\n\n\ndef _round(x):") and code.endswith(alone.rstrip())
    namespace: dict = {}
    exec(code, namespace)
    assert namespace["hypotenuse"](3, 4) == 5.0
    own_round = "def _round(x):\n    return x\n\n\n" + alone  # a helper the answer defines is its own
    assert with_context(own_round, puzzle) == "import math\n\n\n" + own_round
    assert with_context(alone, replace(puzzle, source=None)) == alone  # only for puzzles that carry helpers
