"""AST mutators that turn a correct Python function into candidate buggy variants.

A mutant is the whole source, rendered with `ast.unparse`, with exactly one site changed: an
operator, a constant, a name, a statement, a pair of branches. Mutators are grouped into
families (`FAMILIES`); `mutants` runs the chosen ones in that fixed order and returns every
variant of every site, skipping no-ops and code an earlier mutant already produced. Docstrings,
imports, annotations and string constants are never touched. Whether a mutant is a real bug
(fails a test, is not equivalent) is for the forge's validator to decide.
"""

from __future__ import annotations

import ast
import builtins
import copy
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

Edit = Callable[[ast.AST], None]  # applied in place to the clone of a variant's anchor
Maker = Callable[[ast.expr], ast.expr]  # builds a replacement expression from the one it replaces

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_HIDDEN_FIELDS = ("annotation", "returns")  # a mutated type hint never changes behaviour
_NOT_SWAPPED_IN = frozenset(dir(builtins)) | {"self", "cls"}
_INFINITIES = ("float('inf')", "float('-inf')", "float('infinity')", "math.inf")
_MAX_DESCRIPTION, _MAX_QUOTE = 119, 48

_SYMBOLS = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
    ast.Pow: "**", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
    ast.NotEq: "!=", ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
    ast.And: "and", ast.Or: "or",
}
_ARITH = {
    ast.Add: (ast.Sub,), ast.Sub: (ast.Add,), ast.Mult: (ast.FloorDiv, ast.Div),
    ast.Div: (ast.FloorDiv, ast.Mult), ast.FloorDiv: (ast.Div, ast.Mult), ast.Mod: (ast.FloorDiv,),
    ast.Pow: (ast.Mult,),
}
_COMPARE = {  # first the boundary (strictness) flip, then the direction flip
    ast.Lt: (ast.LtE, ast.Gt), ast.LtE: (ast.Lt, ast.GtE), ast.Gt: (ast.GtE, ast.Lt),
    ast.GtE: (ast.Gt, ast.LtE), ast.Eq: (ast.NotEq,), ast.NotEq: (ast.Eq,),
    ast.In: (ast.NotIn,), ast.NotIn: (ast.In,), ast.Is: (ast.IsNot,), ast.IsNot: (ast.Is,),
}
_BOOL = {ast.And: (ast.Or,), ast.Or: (ast.And,)}
_AUG = {ast.Add: (ast.Sub,), ast.Sub: (ast.Add,), ast.Mult: (ast.Add,), ast.Div: (ast.Mult,),
        ast.FloorDiv: (ast.Div,)}
_NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)


@dataclass(frozen=True)
class Mutant:
    family: str  # e.g. "arith_op"
    description: str  # one line naming the change and the line
    code: str  # the whole mutated source, via ast.unparse
    line: int  # 1-based line of the mutated node in the original code


@dataclass(frozen=True)
class _Variant:
    anchor: ast.AST  # node of the original tree whose clone `edit` receives
    edit: Edit
    site: ast.AST  # the mutated node: orders the variant and gives its line
    text: str  # the description without its "line N: " prefix


@dataclass(frozen=True)
class _Ctx:
    source: str
    tree: ast.Module
    parents: dict[int, tuple[ast.AST, str, int | None]]  # id(child) -> (parent, field, index)


# ------------------------------------------------------------------------------ tree helpers
def _children(node: ast.AST) -> Iterator[tuple[str, int | None, ast.AST]]:
    for field, value in ast.iter_fields(node):
        for index, child in enumerate(value) if isinstance(value, list) else ((None, value),):
            if isinstance(child, ast.AST):
                yield field, index, child


def _hidden(parent: ast.AST, field: str, index: int | None, child: ast.AST, into_defs: bool) -> bool:
    docstring = (isinstance(parent, (ast.Module, *_FUNCS, ast.ClassDef)) and field == "body"
                 and index == 0 and isinstance(child, ast.Expr) and _is_str(child.value))
    return (docstring or field in _HIDDEN_FIELDS or isinstance(child, (ast.Import, ast.ImportFrom))
            or (not into_defs and isinstance(child, _DEFS)))


def _walk(root: ast.AST, into_defs: bool = True) -> Iterator[ast.AST]:
    """Pre-order (source-like) walk that never enters docstrings, imports or annotations;
    with into_defs=False it also stays out of nested functions, lambdas and classes."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed([c for f, i, c in _children(node) if not _hidden(node, f, i, c, into_defs)]))


def _nodes(ctx: _Ctx, kinds: type | tuple[type, ...]) -> list:
    return [node for node in _walk(ctx.tree) if isinstance(node, kinds)]


def _statement(ctx: _Ctx, node: ast.AST) -> ast.AST:
    """The innermost statement holding `node`: its first line is a readable context."""
    while not isinstance(node, ast.stmt) and id(node) in ctx.parents:
        node = ctx.parents[id(node)][0]
    return node


def _is_str(node: ast.AST | None) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def _int_value(node: ast.AST | None) -> int | None:
    """The value of an int literal, a negated one (`-1`) included; None for anything else."""
    if isinstance(node, ast.Constant) and type(node.value) is int:  # not bool
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_value(node.operand)
        return None if inner is None else -inner
    return None


def _shifted(expr: ast.expr, delta: int) -> ast.expr:
    """`expr + delta`, folded into a literal or into an existing `x + c` / `x - c`."""
    value = _int_value(expr)
    if value is not None:  # -1 parses as a negation of 1: build it so, as the mutant will reparse
        value += delta
        return ast.Constant(value) if value >= 0 else ast.UnaryOp(ast.USub(), ast.Constant(-value))
    base = expr
    offset = _int_value(expr.right) if isinstance(expr, ast.BinOp) else None
    if offset is not None and isinstance(expr.op, (ast.Add, ast.Sub)):
        base, delta = expr.left, delta + (offset if isinstance(expr.op, ast.Add) else -offset)
    if delta == 0:
        return base
    return ast.BinOp(base, ast.Add() if delta > 0 else ast.Sub(), ast.Constant(abs(delta)))


def _quote(ctx: _Ctx, node: ast.AST) -> str:
    """The node's source, quoted: its first line only (a block header keeps its colon), shortened."""
    lines = (ast.get_source_segment(ctx.source, node) or ast.unparse(node)).strip().splitlines() or [""]
    first = lines[0].rstrip()
    cut = len(lines) > 1 and not first.endswith(":")
    if len(first) > _MAX_QUOTE:
        first, cut = first[:_MAX_QUOTE - 3], True
    first += "..." if cut else ""
    return f'"{first}"' if "'" in first else f"'{first}'"


# ------------------------------------------------------------------------------ edits
def _render(ctx: _Ctx, variant: _Variant) -> str:
    """Clone the tree, apply the variant's edit to the clone of its anchor, unparse."""
    memo: dict = {}
    clone = copy.deepcopy(ctx.tree, memo)  # the memo maps id(original node) -> its clone
    variant.edit(memo[id(variant.anchor)])
    return ast.unparse(ast.fix_missing_locations(clone))


def _replace(ctx: _Ctx, node: ast.expr, make: Maker, where: ast.AST | None = None) -> _Variant:
    """A variant that puts make(node) where `node` is, described as before -> after."""
    parent, field, index = ctx.parents[id(node)]

    def edit(clone: ast.AST) -> None:
        if index is None:
            setattr(clone, field, make(getattr(clone, field)))
        else:
            getattr(clone, field)[index] = make(getattr(clone, field)[index])

    after = _quote(ctx, make(node))  # makers only wrap or build, never mutate their input
    context = _quote(ctx, where or _statement(ctx, node))
    return _Variant(parent, edit, node, f"{_quote(ctx, node)} -> {after} in {context}")


def _op_swaps(ctx: _Ctx, node: ast.AST, index: int, table: dict) -> Iterator[_Variant]:
    """One variant per partner in `table` of the node's operator (ops[index] of a Compare)."""
    ops = node.ops if isinstance(node, ast.Compare) else [node.op]
    for new in table.get(type(ops[index]), ()):
        def edit(clone: ast.AST, new: type = new) -> None:
            if isinstance(clone, ast.Compare):
                clone.ops[index] = new()
            else:
                clone.op = new()
        text = f"'{_SYMBOLS[type(ops[index])]}' -> '{_SYMBOLS[new]}' in {_quote(ctx, node)}"
        yield _Variant(node, edit, node, text)


def _constant(value: object) -> Maker:
    return lambda _: ast.Constant(value)


def _name(name: str) -> Maker:
    return lambda _: ast.Name(name, ast.Load())


def _shift(delta: int) -> Maker:
    return lambda expr: _shifted(expr, delta)


def _swap_fields(first: str, second: str) -> Edit:
    def edit(clone: ast.AST) -> None:
        a, b = getattr(clone, first), getattr(clone, second)
        setattr(clone, first, b)
        setattr(clone, second, a)
    return edit


def _swap_args(index: int) -> Edit:
    def edit(clone: ast.AST) -> None:
        clone.args[index], clone.args[index + 1] = clone.args[index + 1], clone.args[index]
    return edit


def _remove(field: str, index: int) -> Edit:
    def edit(clone: ast.AST) -> None:
        block = getattr(clone, field)
        del block[index]
        if not block and field != "orelse":  # an empty else just goes; any other block needs a body
            block.append(ast.Pass())
    return edit


# ------------------------------------------------------------------------------ predicates
def _is_range(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
            and 1 <= len(node.args) <= 3 and not node.keywords
            and not any(isinstance(arg, ast.Starred) for arg in node.args))


def _owned_by_bounds(ctx: _Ctx, node: ast.AST) -> bool:
    """Whether range_bounds or slice_bounds shifts this literal (and describes it better)."""
    parent, field, _ = ctx.parents[id(node)]
    return (isinstance(parent, ast.Slice) or (isinstance(parent, ast.Subscript) and field == "slice")
            or (field == "args" and _is_range(parent)))


def _is_condition(ctx: _Ctx, node: ast.AST) -> bool:
    parent, field, _ = ctx.parents.get(id(node), (None, "", None))
    return ((field == "test" and isinstance(parent, (ast.If, ast.While, ast.IfExp)))
            or (isinstance(parent, ast.Return) and isinstance(node, (ast.Compare, ast.BoolOp))))


def _has_str_operand(node: ast.AST) -> bool:
    operands = (node.left, node.right) if isinstance(node, ast.BinOp) else (getattr(node, "value", None),)
    return not isinstance(node, ast.Compare) and any(map(_is_str, operands))


def _is_infinity(node: ast.AST) -> bool:
    return isinstance(node, (ast.Call, ast.Attribute)) and ast.unparse(node).lower() in _INFINITIES


def _is_removable(parent: ast.AST, field: str, index: int | None, stmt: ast.AST) -> bool:
    if isinstance(stmt, ast.Return):  # only an early return: dropping the final one is too blunt
        return not (isinstance(parent, _FUNCS) and field == "body" and index == len(parent.body) - 1)
    return (isinstance(stmt, (ast.Assign, ast.AugAssign, ast.Continue, ast.Break))
            or (isinstance(stmt, ast.AnnAssign) and stmt.value is not None)
            or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)))


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    stars = [arg for arg in (a.vararg, a.kwarg) if arg]
    return [arg.arg for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, *stars)]


def _defined_at(ctx: _Ctx, name: ast.Name) -> tuple[int, int]:
    """Where an assigned name becomes usable: after its simple statement, or where the body of
    its compound one (a `for` target, a `with ... as`) starts."""
    stmt = _statement(ctx, name)
    body = getattr(stmt, "body", None)
    if isinstance(body, list) and body:
        return body[0].lineno, body[0].col_offset
    return stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0


def _local_names(ctx: _Ctx, fn: ast.FunctionDef | ast.AsyncFunctionDef,
                 scope: list[ast.AST]) -> list[tuple[tuple[int, int], str]]:
    """(where first defined, name) of fn's parameters (defined before everything) and assigned
    names, by that position. Builtins, self, fn's own name, called names and comprehension
    variables are left out: swapping those in is rarely a plausible bug."""
    in_comprehension = {id(n) for c in scope if isinstance(c, ast.comprehension) for n in ast.walk(c.target)}
    called = {n.func.id for n in scope if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    stores = sorted((_defined_at(ctx, n), n.id) for n in scope if isinstance(n, ast.Name)
                    and isinstance(n.ctx, ast.Store) and id(n) not in in_comprehension)
    found: dict[str, tuple[int, int]] = {}  # insertion-ordered: the first definition wins
    for position, name in [((0, 0), p) for p in _params(fn)] + stores:
        if name not in found and name != fn.name and name not in called and name not in _NOT_SWAPPED_IN:
            found[name] = position
    return sorted(((position, name) for name, position in found.items()), key=lambda d: d[0])


def _init_makers(value: ast.expr) -> list[Maker]:
    """Replacements for the initial value of an accumulator (`total = 0`, `best = xs[0]`)."""
    if isinstance(value, ast.Constant):
        v = value.value
        if isinstance(v, bool):
            return [_constant(not v)]
        if type(v) in (int, float) and v in (0, 1):
            return [_constant(type(v)(1 - v))]
        return [_constant(" ")] if v == "" else [_constant(0)] if v is None else []
    if _is_infinity(value):
        return [lambda e: ast.UnaryOp(ast.USub(), e)]
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub) and _is_infinity(value.operand):
        return [lambda e: e.operand]
    return [_constant(0)] if isinstance(value, ast.Subscript) else []


# ------------------------------------------------------------------------------ families
def _op_family(kinds: type, table: dict) -> Callable[[_Ctx], Iterator[_Variant]]:
    """A family swapping the operator(s) of every `kinds` node for their partners in `table`.
    String operands are left alone: "%s" % x or s += "x" would only turn into a TypeError;
    comparisons with strings are mutated like any other."""
    def family(ctx: _Ctx) -> Iterator[_Variant]:
        for node in _nodes(ctx, kinds):
            if not _has_str_operand(node):
                for index in range(len(getattr(node, "ops", [None]))):
                    yield from _op_swaps(ctx, node, index, table)
    return family


def _negation(ctx: _Ctx) -> Iterator[_Variant]:
    for node in _nodes(ctx, ast.expr):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield _replace(ctx, node, lambda e: e.operand)
        elif _is_condition(ctx, node):
            yield _replace(ctx, node, lambda e: ast.UnaryOp(ast.Not(), e))


def _off_by_one_const(ctx: _Ctx) -> Iterator[_Variant]:
    for node in _nodes(ctx, (ast.Constant, ast.UnaryOp)):
        # the literal inside `-n` is skipped: the negation around it is the site
        if _int_value(node) is not None and _int_value(ctx.parents[id(node)][0]) is None:
            if not _owned_by_bounds(ctx, node):
                yield from (_replace(ctx, node, _shift(delta)) for delta in (1, -1))


def _range_bounds(ctx: _Ctx) -> Iterator[_Variant]:
    for call in filter(_is_range, _nodes(ctx, ast.Call)):
        yield from (_replace(ctx, call.args[min(1, len(call.args) - 1)], _shift(d), call) for d in (1, -1))
        if len(call.args) > 1:
            yield from (_replace(ctx, call.args[0], _shift(d), call) for d in (1, -1))
        else:
            def edit(clone: ast.AST) -> None:
                clone.args.insert(0, ast.Constant(1))
            yield _Variant(call, edit, call, f"added start 1 to {_quote(ctx, call)}")


def _slice_bounds(ctx: _Ctx) -> Iterator[_Variant]:
    for node in _nodes(ctx, ast.Subscript):
        index = node.slice
        if _int_value(index) is not None:
            yield from (_replace(ctx, index, _shift(delta), node) for delta in (1, -1))
        for field in ("lower", "upper") if isinstance(index, ast.Slice) else ():
            bound = getattr(index, field)
            if bound is not None and not _is_str(bound):
                yield from (_replace(ctx, bound, _shift(delta), node) for delta in (1, -1))
                text = f"dropped {field} bound {_quote(ctx, bound)} of {_quote(ctx, node)}"
                yield _Variant(index, lambda clone, f=field: setattr(clone, f, None), bound, text)


def _swap_args_family(ctx: _Ctx) -> Iterator[_Variant]:
    for node in _nodes(ctx, (ast.Call, ast.BinOp)):
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, _NON_COMMUTATIVE) and not _has_str_operand(node):
                text = f"swapped operands of {_quote(ctx, node)}"
                yield _Variant(node, _swap_fields("left", "right"), node, text)
        elif not any(isinstance(arg, ast.Starred) for arg in node.args):
            for i in range(len(node.args) - 1):
                which = f" {i + 1} and {i + 2}" if len(node.args) > 2 else ""
                yield _Variant(node, _swap_args(i), node, f"swapped arguments{which} of {_quote(ctx, node)}")


def _var_replace(ctx: _Ctx) -> Iterator[_Variant]:
    for fn in _nodes(ctx, _FUNCS):
        scope = list(_walk(fn, into_defs=False))
        defined = _local_names(ctx, fn, scope)
        names = {name for _, name in defined}
        for node in scope:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in names:
                site = (node.lineno, node.col_offset)
                before = [name for position, name in defined if position < site and name != node.id]
                for other in before[::-1][:2]:  # the two nearest preceding definitions
                    yield _replace(ctx, node, _name(other))


def _stmt_remove(ctx: _Ctx) -> Iterator[_Variant]:
    for parent in _nodes(ctx, ast.AST):
        for field, index, stmt in _children(parent):
            if isinstance(stmt, ast.stmt) and _is_removable(parent, field, index, stmt):
                yield _Variant(parent, _remove(field, index), stmt, f"removed {_quote(ctx, stmt)}")


def _return_value(ctx: _Ctx) -> Iterator[_Variant]:
    for fn in _nodes(ctx, _FUNCS):
        params = [p for p in _params(fn) if p not in ("self", "cls")]
        for node in _walk(fn, into_defs=False):
            value = node.value if isinstance(node, ast.Return) else None
            if value is None or (isinstance(value, ast.Constant) and value.value is None):
                continue
            if isinstance(value, ast.Constant) and isinstance(value.value, bool):
                yield _replace(ctx, value, _constant(not value.value))
            yield _replace(ctx, value, _constant(None))
            if params and not (isinstance(value, ast.Name) and value.id == params[0]):
                yield _replace(ctx, value, _name(params[0]))


def _init_value(ctx: _Ctx) -> Iterator[_Variant]:
    for node in _nodes(ctx, ast.Assign):
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            yield from (_replace(ctx, node.value, make) for make in _init_makers(node.value))


def _if_else_swap(ctx: _Ctx) -> Iterator[_Variant]:
    for node in _nodes(ctx, ast.If):
        if node.orelse:
            text = f"swapped branches of {_quote(ctx, node)}"
            yield _Variant(node, _swap_fields("body", "orelse"), node, text)


_FAMILIES: dict[str, Callable[[_Ctx], Iterator[_Variant]]] = {
    "arith_op": _op_family(ast.BinOp, _ARITH),
    "compare_flip": _op_family(ast.Compare, _COMPARE),
    "bool_op": _op_family(ast.BoolOp, _BOOL),
    "negation": _negation,
    "off_by_one_const": _off_by_one_const,
    "range_bounds": _range_bounds,
    "slice_bounds": _slice_bounds,
    "swap_args": _swap_args_family,
    "var_replace": _var_replace,
    "stmt_remove": _stmt_remove,
    "aug_assign": _op_family(ast.AugAssign, _AUG),
    "return_value": _return_value,
    "init_value": _init_value,
    "if_else_swap": _if_else_swap,
}
FAMILIES: tuple[str, ...] = tuple(_FAMILIES)


# ------------------------------------------------------------------------------ public API
def _chosen(families: Sequence[str] | None) -> list[str]:
    """The requested families in FAMILIES order (a bare string counts as one name)."""
    names = FAMILIES if families is None else [families] if isinstance(families, str) else list(families)
    unknown = sorted(set(names) - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown mutator families: {', '.join(unknown)} (known: {', '.join(FAMILIES)})")
    return [name for name in FAMILIES if name in names]


def _describe(variant: _Variant) -> str:
    text = f"line {variant.site.lineno}: {variant.text}".replace("\n", " ")
    return text if len(text) <= _MAX_DESCRIPTION else text[:_MAX_DESCRIPTION - 3] + "..."


def mutants(code: str, families: Sequence[str] | None = None) -> list[Mutant]:
    """Every single-site mutant of `code` from the given families (default all), in a
    deterministic order (by family order, then source position, then variant). Each mutant
    changes exactly one site. No-ops are skipped, and so is code an earlier mutant (of any
    family) already produced, so all codes are distinct. Raises SyntaxError if code does not
    parse; ValueError naming an unknown family."""
    chosen = _chosen(families)
    tree = ast.parse(code)
    parents = {id(child): (node, field, index)
               for node in ast.walk(tree) for field, index, child in _children(node)}
    ctx = _Ctx(code, tree, parents)
    seen = {ast.unparse(tree)}
    found: list[Mutant] = []
    for family in chosen:
        # sorted() is stable: the variants of one site keep the order their family made them in
        for variant in sorted(_FAMILIES[family](ctx), key=lambda v: (v.site.lineno, v.site.col_offset)):
            mutated = _render(ctx, variant)
            if mutated not in seen:
                seen.add(mutated)
                found.append(Mutant(family, _describe(variant), mutated, variant.site.lineno))
    return found
