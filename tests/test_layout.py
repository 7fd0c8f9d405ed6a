"""The package's layering, read from the modules' own import statements (function-level
imports included): every import points to the same or a lower layer, and no module cycle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mlx_swe_rl"

# The data flow, bottom to top. Subpackages of equal rank must not import each other.
LAYERS = {
    "blas": 0,  # loads OpenBLAS before anything imports mlx.core
    "runfiles": 1, "stopping": 1,
    "puzzles": 2,
    "sandbox": 3,
    "forge": 4, "env": 4,
    "models": 5,
    "rl": 6,
    "reports": 7,
    "experiments": 8,  # comparison experiments: runs and evaluations paired, their report
    "cli": 9,
    "__init__": 10, "__main__": 10, "train": 10, "eval": 10,  # the package root and `python -m` entry points
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Absolute names of the package modules that `path` imports."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("mlx_swe_rl")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("mlx_swe_rl"):
                target = node.module
            else:
                continue
            # `from .pkg import module` names a module; `from .module import name` does not
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.add(candidate if _exists(candidate) else target)
    return found


def _exists(module: str) -> bool:
    rel = Path(*module.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()


def stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): imported_modules(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_stage_has_a_layer():
    stages = {stage(m) for m in import_graph()}
    assert stages <= set(LAYERS), f"modules outside the layering: {sorted(stages - set(LAYERS))}"


def test_imports_point_down():
    upward = []
    for module, targets in import_graph().items():
        for target in targets:
            src, dst = stage(module), stage(target)
            if target == "mlx_swe_rl":  # __version__ from the package root
                continue
            if src != dst and LAYERS[dst] >= LAYERS[src]:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports that do not point to a lower layer:\n" + "\n".join(sorted(upward))


def test_no_import_cycles():
    graph = import_graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph or nxt == node:
                continue
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]) if nxt in path else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_sandbox_worker_is_standard_library_only():
    """The worker runs as a script (`python -I -S worker.py`): it cannot import the package."""
    for name in ("worker.py", "confine.py"):
        tree = ast.parse((PACKAGE / "sandbox" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                outside = node.level == 0 and not (node.module or "").startswith("mlx_swe_rl")
                assert outside, f"{name}: {ast.unparse(node)}"
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("mlx_swe_rl") for a in node.names), f"{name}: {ast.unparse(node)}"


def test_documented_entry_points_import():
    from mlx_swe_rl.env import CodeFixEnv  # the README's API
    from mlx_swe_rl.eval import main as eval_main
    from mlx_swe_rl.puzzles import load_puzzles
    from mlx_swe_rl.train import main as train_main

    assert eval_main.name == "eval" and train_main.name == "train"
    assert CodeFixEnv.__module__ == "mlx_swe_rl.env.codefix" and callable(load_puzzles)
