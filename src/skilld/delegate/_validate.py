"""The program validator: the first wall in front of the runner component.

A program is a short piece of Python in a small subset (docs/delegate.md, "The
language"). The validator parses it on the host (never compiles or runs it) and
walks the syntax tree against an allowlist: a node kind not listed is refused,
whatever a later Python adds. Every problem carries its line, column and rule id;
they are what the inference tiers feed back to a model for a corrected program.

The program then runs inside the wasm sandbox (``sandbox/pyrunner``), so a gap
here costs a guest call at worst; the validator exists to refuse what the runner
would otherwise have to contain, and to say why in words a model can act on.
"""

from __future__ import annotations

import ast
import keyword
from collections.abc import Collection
from dataclasses import dataclass

from skilld.errors import ProgramRejected

MAX_PROGRAM_BYTES = 16 * 1024
MAX_NODES = 4000
MAX_DEPTH = 40

# Builtins a program may call (the runner's namespace holds these and ``print``).
BUILTINS = frozenset(
    {
        "abs", "all", "any", "bool", "dict", "enumerate", "filter", "float", "int", "len",
        "list", "map", "max", "min", "print", "range", "reversed", "round", "set", "sorted",
        "str", "sum", "tuple", "zip",
    }
)  # fmt: skip

# Methods of str, list and dict a program may call. None of them reaches an object's
# type, frame or class; ``format`` and ``format_map`` are left out on purpose (their
# field syntax walks attributes: "{0.__class__}").
METHODS = frozenset(
    {
        "append", "capitalize", "count", "endswith", "extend", "find", "get", "index",
        "insert", "isalnum", "isalpha", "isdigit", "islower", "isspace", "isupper", "items",
        "join", "keys", "lower", "lstrip", "partition", "pop", "removeprefix",
        "removesuffix", "replace", "rfind", "rpartition", "rsplit", "rstrip", "setdefault",
        "sort", "split", "splitlines", "startswith", "strip", "title", "update", "upper",
        "values",
    }
)  # fmt: skip

# Attribute names that reach an interpreter's internals; each named in its own error.
# Builtins that reach the interpreter; the runner does not hold them either, but a
# program naming one is refused here with its own message.
DENIED_NAMES = frozenset(
    {
        "breakpoint", "classmethod", "compile", "delattr", "dir", "eval", "exec", "exit",
        "getattr", "globals", "hasattr", "help", "id", "input", "iter", "locals",
        "memoryview", "next", "object", "open", "property", "quit", "setattr",
        "staticmethod", "super", "type", "vars",
    }
)  # fmt: skip
FRAME_PREFIXES = ("gi_", "cr_", "ag_", "f_", "tb_")
FORMAT_METHODS = frozenset({"format", "format_map"})

_EXPR_NODES: tuple[type[ast.AST], ...] = (
    ast.Expr, ast.Name, ast.Load,
    # Only reachable under a Lambda (allowed as key= alone) or a refused FunctionDef.
    ast.arguments, ast.arg, ast.Store, ast.Constant, ast.List, ast.Tuple, ast.Dict,
    ast.Set, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.comprehension,
    ast.Call, ast.keyword, ast.JoinedStr, ast.FormattedValue, ast.BinOp, ast.UnaryOp,
    ast.BoolOp, ast.Compare, ast.IfExp, ast.Subscript, ast.Slice, ast.Starred,
    ast.Attribute,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow,
    ast.USub, ast.UAdd, ast.Not, ast.And, ast.Or,
    ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Is, ast.IsNot,
)  # fmt: skip
_STMT_NODES: tuple[type[ast.AST], ...] = (
    ast.Module, ast.Assign, ast.AugAssign, ast.For, ast.If, ast.Pass, ast.Break, ast.Continue,
)  # fmt: skip
ALLOWED_NODES = frozenset(_EXPR_NODES + _STMT_NODES)

# Refused node kinds and the rule that names them; anything else not allowed is
# refused as "syntax".
_REFUSED: dict[type[ast.AST], tuple[str, str]] = {
    ast.Import: ("import", "imports are not allowed; the kit's tools are already in scope"),
    ast.ImportFrom: ("import", "imports are not allowed; the kit's tools are already in scope"),
    ast.FunctionDef: ("definition", "function definitions are not allowed"),
    ast.AsyncFunctionDef: ("definition", "function definitions are not allowed"),
    ast.ClassDef: ("definition", "class definitions are not allowed"),
    ast.While: ("while", "'while' is not allowed; loop with 'for' over a list or range()"),
    ast.Try: ("try", "'try' is not allowed; a failing tool call ends the program"),
    ast.TryStar: ("try", "'try' is not allowed; a failing tool call ends the program"),
    ast.Lambda: ("lambda", "'lambda' is allowed only as the key= argument of a call"),
    ast.With: ("with", "'with' is not allowed"),
    ast.Raise: ("raise", "'raise' is not allowed"),
    ast.Global: ("scope", "'global' is not allowed"),
    ast.Nonlocal: ("scope", "'nonlocal' is not allowed"),
    ast.Delete: ("del", "'del' is not allowed"),
    ast.NamedExpr: ("walrus", "':=' is not allowed; assign on its own line"),
    ast.Yield: ("generator", "'yield' is not allowed"),
    ast.YieldFrom: ("generator", "'yield' is not allowed"),
    ast.Await: ("async", "'await' is not allowed"),
    ast.Assert: ("assert", "'assert' is not allowed; use 'if'"),
}


@dataclass(frozen=True, slots=True)
class Problem:
    """One reason a program is refused: where, which rule, what."""

    line: int
    column: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"line {self.line}, column {self.column}: {self.message} [{self.rule}]"


def check_program(source: str, tools: Collection[str], params: Collection[str] = ()) -> None:
    """Refuse ``source`` unless it is a program of the delegate language over ``tools``.

    Args:
        tools: the kit's function names, the only names besides ``BUILTINS`` a call may name.
        params: names the program receives as parameters (they may not be kit tools).

    Raises:
        ProgramRejected: every problem found, each with line, column and rule id.
    """
    problems = validate(source, tools, params)
    if problems:
        raise ProgramRejected(
            [(p.line, p.column, p.rule, p.message) for p in problems],
            hint="fix each problem and submit the program again; the language is in "
            "docs/delegate.md",
        )


def validate(source: str, tools: Collection[str], params: Collection[str] = ()) -> list[Problem]:
    """Every problem of ``source`` (empty: valid), in source order; see :func:`check_program`."""
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > MAX_PROGRAM_BYTES:
        return [
            Problem(1, 0, "delegate.size", f"program is {size} bytes, over {MAX_PROGRAM_BYTES}")
        ]
    if "\x00" in source:
        return [Problem(1, 0, "delegate.syntax", "program contains a NUL character")]
    try:
        tree = ast.parse(source, filename="<program>", mode="exec")
    except SyntaxError as exc:
        message = f"syntax error: {exc.msg}"
        return [Problem(exc.lineno or 1, (exc.offset or 1) - 1, "delegate.syntax", message)]
    except (RecursionError, MemoryError):
        # CPython's parser gives up on very deep nesting with these, not SyntaxError.
        return [Problem(1, 0, "delegate.depth", f"program nests deeper than {MAX_DEPTH} levels")]
    return _Checker(frozenset(tools), frozenset(params)).run(tree)


class _Checker:
    """An iterative walk (deep programs must not recurse on the host's stack)."""

    def __init__(self, tools: frozenset[str], params: frozenset[str]):
        self.tools = tools
        self.params = params
        self.problems: list[Problem] = []

    def add(self, node: ast.AST, rule: str, message: str) -> None:
        line = getattr(node, "lineno", 1)
        col = getattr(node, "col_offset", 0)
        self.problems.append(Problem(line, col, f"delegate.{rule}", message))

    def run(self, tree: ast.Module) -> list[Problem]:
        for param in sorted(self.params):
            self.param(tree, param)
        # (node, depth, parent)
        stack: list[tuple[ast.AST, int, ast.AST | None]] = [(tree, 0, None)]
        count = 0
        while stack:
            node, depth, parent = stack.pop()
            count += 1
            if count > MAX_NODES:
                self.add(node, "size", f"program has more than {MAX_NODES} syntax nodes")
                break
            if depth > MAX_DEPTH:
                if not any(p.rule == "delegate.depth" for p in self.problems):
                    self.add(node, "depth", f"program nests deeper than {MAX_DEPTH} levels")
                continue
            if not self.node(node, parent):
                continue
            children = list(ast.iter_child_nodes(node))
            stack.extend((child, depth + 1, node) for child in reversed(children))
        self.problems.sort(key=lambda p: (p.line, p.column))
        return self.problems

    def node(self, node: ast.AST, parent: ast.AST | None) -> bool:
        """Check one node; False when its children need no look (already refused)."""
        kind = type(node)
        if kind is ast.Lambda:
            return self.lambda_(node, parent)  # type: ignore[arg-type]
        if kind in _REFUSED:
            rule, message = _REFUSED[kind]
            self.add(node, rule, message)
            return False
        if kind not in ALLOWED_NODES:
            self.add(node, "syntax", f"'{kind.__name__}' is not part of the language")
            return False
        if isinstance(node, ast.Name):
            self.name(node)
        elif isinstance(node, ast.Attribute):
            self.attribute(node, parent)
        elif isinstance(node, ast.Call):
            self.call(node)
        elif isinstance(node, ast.Constant):
            self.constant(node)
        elif isinstance(node, ast.For):
            self.for_(node)
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                self.target(target)
        elif isinstance(node, ast.comprehension):
            self.target(node.target)
            if node.is_async:
                self.add(node, "async", "'async for' is not allowed")
        return True

    def param(self, tree: ast.Module, name: str) -> None:
        """A parameter is bound as a name before the program runs: the rules of an
        assignment apply to it (no ``__builtins__``, no builtin or kit tool shadowed)."""
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            self.add(tree, "name", f"parameter {name!r} is not a plain name")
        elif name.startswith("_"):
            self.add(
                tree, "underscore", f"parameter names starting with '_' are not allowed: '{name}'"
            )
        elif name in DENIED_NAMES:
            self.add(tree, "builtin", f"parameter '{name}' has the name of a refused builtin")
        elif name in self.tools:
            self.add(tree, "name", f"parameter '{name}' has the name of a kit tool")
        elif name in BUILTINS:
            self.add(tree, "name", f"parameter '{name}' has the name of a builtin")

    def name(self, node: ast.Name) -> None:
        if node.id.startswith("_"):
            self.add(node, "underscore", f"names starting with '_' are not allowed: '{node.id}'")
        elif node.id in DENIED_NAMES:
            self.add(node, "builtin", f"'{node.id}' is not available to programs")
        elif isinstance(node.ctx, ast.Store) and node.id in self.tools:
            self.add(node, "name", f"'{node.id}' is a kit tool and cannot be assigned")
        elif isinstance(node.ctx, ast.Store) and node.id in BUILTINS:
            self.add(node, "name", f"'{node.id}' is a builtin and cannot be assigned")

    def attribute(self, node: ast.Attribute, parent: ast.AST | None) -> None:
        attr = node.attr
        if attr.startswith("_"):
            self.add(node, "underscore", f"attributes starting with '_' are not allowed: '.{attr}'")
        elif attr.startswith(FRAME_PREFIXES):
            self.add(node, "frame", f"frame and generator attributes are not allowed: '.{attr}'")
        elif attr in FORMAT_METHODS:
            self.add(node, "format", f"'.{attr}' is not allowed; use an f-string or '+' instead")
        elif not (isinstance(parent, ast.Call) and parent.func is node):
            self.add(node, "attribute", f"'.{attr}' may only be called, as a method")
        elif attr not in METHODS:
            allowed = ", ".join(sorted(METHODS))
            self.add(node, "method", f"method '.{attr}' is not allowed; allowed: {allowed}")

    def call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name):
            if func.id not in self.tools and func.id not in BUILTINS:
                known = ", ".join(sorted(self.tools)) or "none"
                self.add(
                    node,
                    "call",
                    f"'{func.id}' is neither a tool of this kit ({known}) nor an allowed builtin",
                )
        elif not isinstance(func, ast.Attribute):
            self.add(node, "call", "only kit tools, builtins and methods may be called")

    def constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str | bytes) and (
            "__" in node.value if isinstance(node.value, str) else b"__" in node.value
        ):
            self.add(node, "dunder", "string constants may not contain '__'")
        elif node.value is Ellipsis:
            self.add(node, "syntax", "'...' is not part of the language")

    def for_(self, node: ast.For) -> None:
        self.target(node.target)
        if not isinstance(node.iter, ast.Call | ast.Name):
            self.add(node.iter, "for", "'for' may only loop over a call or a name")
        if node.orelse:
            self.add(node.orelse[0], "for", "'for ... else' is not allowed")

    def target(self, node: ast.AST) -> None:
        if isinstance(node, ast.Tuple | ast.List):
            for elt in node.elts:
                self.target(elt)
        elif not isinstance(node, ast.Name | ast.Subscript | ast.Starred):
            self.add(node, "assign", "only names and subscripts may be assigned")

    def lambda_(self, node: ast.Lambda, parent: ast.AST | None) -> bool:
        if not (isinstance(parent, ast.keyword) and parent.arg == "key"):
            rule, message = _REFUSED[ast.Lambda]
            self.add(node, rule, message)
            return False
        args = node.args
        extra = args.vararg or args.kwarg or args.kwonlyargs or args.defaults or args.posonlyargs
        if extra or args.kw_defaults:
            self.add(node, "lambda", "a key= lambda takes plain parameters only")
            return False
        for arg in args.args:
            if arg.arg.startswith("_"):
                self.add(arg, "underscore", f"names starting with '_' are not allowed: '{arg.arg}'")
        return True
