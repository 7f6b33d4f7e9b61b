"""Qualified names of torch APIs through every alias, without importing anything.

`import torch as T`, `from torch import matmul as mm`, `import torch.nn.functional as F`,
`from torch.nn import functional as F`, `mm = torch.mm` at module level: all resolve
`T.matmul`, `mm`, `F.linear` to their qualified names (`torch.matmul`, `torch.mm`,
`torch.nn.functional.linear`). Names bound by something else (a parameter, a local
assignment) shadow the import in their function. An attribute the file itself sets on an
imported module at top level (`nn.MaskedLinear = MaskedLinear`) is the file's own name, not
the module's: `set_on_module` gives the name assigned to it.
"""
from __future__ import annotations

import ast
from typing import Optional

from .loops import name_tokens, scope_statements
from .tree import dotted, walk

# Spellings that reach the same function under another module path.
CANONICAL = {
    "torch.functional.einsum": "torch.einsum",
    "torch.functional.tensordot": "torch.tensordot",
    "torch.functional.split": "torch.split",
    "torch.functional.norm": "torch.norm",
    "torch.nn.modules.linear.Linear": "torch.nn.Linear",
    "torch.nn.modules.Linear": "torch.nn.Linear",
    "torch.nn.modules.container.ModuleList": "torch.nn.ModuleList",
    "torch.nn.modules.ModuleList": "torch.nn.ModuleList",
    "torch.nn.parameter.Parameter": "torch.nn.Parameter",
    "torch.linalg.matmul": "torch.matmul",
    "torch._C._nn.linear": "torch.nn.functional.linear",
    "torch.utils.data.dataloader.DataLoader": "torch.utils.data.DataLoader",
    "torch.cuda.amp.autocast": "torch.cuda.amp.autocast",
    "torch.amp.autocast_mode.autocast": "torch.autocast",
    "torch.amp.autocast": "torch.autocast",
}

_UNRESOLVED = object()


def canonical(qualname: str) -> str:
    return CANONICAL.get(qualname, qualname)


def _bound_names(target: ast.AST):
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _bound_names(elt)
    elif isinstance(target, ast.Starred):
        yield from _bound_names(target.value)


class NameResolver:
    """Maps local names to qualified names, scope by scope."""

    def __init__(self, module: ast.Module, star_imported: Optional[dict] = None):
        """`star_imported`: the qualified names that `from module import *` lines bind (`torch`
        from a project's utils module that does `import torch`); the file's own bindings win."""
        # Each scope holds only its own bindings (copying the enclosing ones into every function
        # made a file with many top-level names quadratic); lookups go outward.
        self._scopes: list = []
        # Per scope, whether it binds any name to a qualified name (most functions bind none).
        self._has_aliases: list = []
        module_scope = dict(star_imported or {})
        module_scope.update(self._scan(module.body, module_level=True))
        self._push(module_scope)
        # `nn.MaskedLinear` after a top-level `nn.MaskedLinear = MaskedLinear`: the file's own
        # binding, not the imported module's attribute (dotted name -> the name assigned to it,
        # None where it is assigned more than once or something else than a name).
        self._set_on_modules: dict = {}
        for stmt in module.body:
            if stmt.__class__ is ast.Assign:
                for target in stmt.targets:
                    if (target.__class__ is ast.Attribute and target.value.__class__ is ast.Name
                            and module_scope.get(target.value.id)):
                        name = dotted(target)
                        value = stmt.value.id if stmt.value.__class__ is ast.Name else None
                        self._set_on_modules[name] = value if name not in self._set_on_modules else None
        # expr -> qualname in the current scope: rules ask about the same call many times over.
        # Keyed by the node itself (not its id) so a temporary node cannot leave a stale entry.
        self._resolved: dict = {}
        self._module_names_bound_to: dict = {}

    def _lookup(self, head: str, local: Optional[dict] = None) -> Optional[str]:
        if local is not None and head in local:
            return local[head]
        for scope in reversed(self._scopes):
            if head in scope:
                return scope[head]
        return None

    def _scan(self, body, module_level: bool, params=()) -> dict:
        aliases: dict = {}
        for name in params:
            aliases[name] = None
        for stmt in scope_statements(body):
            cls = stmt.__class__
            if cls is ast.Assign:
                value = stmt.value
                value = (self._alias_value(value, aliases)
                         if value.__class__ is ast.Attribute or value.__class__ is ast.Name else None)
                for target in stmt.targets:
                    if target.__class__ is ast.Name:
                        aliases[target.id] = value or None
                    else:
                        for name in _bound_names(target):
                            aliases[name] = None
            elif cls is ast.Import:
                for alias in stmt.names:
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        aliases[top] = top
            elif cls is ast.ImportFrom:
                if stmt.level or not stmt.module:
                    for alias in stmt.names:
                        aliases[alias.asname or alias.name] = None
                else:
                    for alias in stmt.names:
                        if alias.name != "*":
                            aliases[alias.asname or alias.name] = f"{stmt.module}.{alias.name}"
            elif cls is ast.FunctionDef or cls is ast.AsyncFunctionDef or cls is ast.ClassDef:
                aliases[stmt.name] = None
            elif cls is ast.AnnAssign or cls is ast.AugAssign or cls is ast.For or cls is ast.AsyncFor:
                for name in _bound_names(stmt.target):
                    aliases[name] = None
            elif cls is ast.With or cls is ast.AsyncWith:
                for item in stmt.items:
                    if item.optional_vars is not None:
                        for name in _bound_names(item.optional_vars):
                            aliases[name] = None
        return aliases

    def _alias_value(self, value: ast.AST, aliases: dict) -> Optional[str]:
        if value.__class__ is not ast.Attribute and value.__class__ is not ast.Name:
            return None  # most assignments: a call, a number...
        name = dotted(value)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        base = self._lookup(head, aliases)
        if base is None:
            return None
        return canonical(f"{base}.{rest}" if rest else base)

    def module_aliases(self) -> dict:
        """The names the module binds to qualified names at its top level (`torch`, `F`, `nn`)."""
        return {name: qual for name, qual in self._scopes[0].items() if qual is not None}

    def enter_function(self, node) -> None:
        args = node.args
        params = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
        if args.vararg:
            params.append(args.vararg.arg)
        if args.kwarg:
            params.append(args.kwarg.arg)
        body = node.body if isinstance(node.body, list) else []
        self._push(self._scan(body, module_level=False, params=params))
        self._resolved = {}

    def binds_locally(self, name: str) -> bool:
        """The function being walked binds `name` (a parameter, an assignment, an import...)."""
        return len(self._scopes) > 1 and name in self._scopes[-1]

    def enter_class(self, node) -> None:
        self._push({})  # class bodies bind no aliases here; lookups pass through

    def _push(self, scope: dict) -> None:
        self._scopes.append(scope)
        self._has_aliases.append(any(scope.values()))

    def leave_scope(self) -> None:
        self._scopes.pop()
        self._has_aliases.pop()
        self._resolved = {}

    def qualname(self, expr: ast.AST) -> Optional[str]:
        """The qualified name `expr` refers to, or None when it is not an imported name."""
        found = self._resolved.get(expr, _UNRESOLVED)
        if found is _UNRESOLVED:
            found = self._resolved[expr] = self._qualname(expr)
        return found

    def _qualname(self, expr: ast.AST) -> Optional[str]:
        # Look the head name up before building the dotted string (a hot path: every call and
        # attribute of every file, and most heads are not imported names).
        head_node = expr
        while type(head_node) is ast.Attribute:
            head_node = head_node.value
        if type(head_node) is not ast.Name:
            return None
        base = self._lookup(head_node.id)
        if base is None:
            return None
        name = dotted(expr)
        if self._set_on_modules and self._sets_on_module(name):
            return None
        rest = name.partition(".")[2]
        return canonical(f"{base}.{rest}" if rest else base)

    def _sets_on_module(self, name: str) -> bool:
        """`name` (dotted, its head resolved to an import) starts with an attribute the file sets."""
        head, _, rest = name.partition(".")
        return f"{head}.{rest.partition('.')[0]}" in self._set_on_modules

    def set_on_module(self, expr: ast.AST) -> Optional[str]:
        """The name of the file that a top-level assignment sets as the imported module's
        attribute `expr` names (`MaskedLinear` for `nn.MaskedLinear` after `nn.MaskedLinear =
        MaskedLinear`), else None."""
        if not self._set_on_modules or expr.__class__ is not ast.Attribute or expr.value.__class__ is not ast.Name:
            return None
        if self.binds_locally(expr.value.id):
            return None
        return self._set_on_modules.get(f"{expr.value.id}.{expr.attr}")

    def names_bound_to(self, last_parts: frozenset) -> frozenset:
        """Names the current scopes bind to a qualified name whose last part is in `last_parts`
        (`z` after `from torch import zeros as z` or `z = torch.zeros`, for {"zeros"})."""
        module_level = self._module_names_bound_to.get(last_parts)
        if module_level is None:
            module_level = self._module_names_bound_to[last_parts] = self._bound_to(self._scopes[0], last_parts)
        inner = [scope for scope, has in zip(self._scopes[1:], self._has_aliases[1:]) if has]
        if not inner:
            return module_level
        return module_level.union(*(self._bound_to(scope, last_parts) for scope in inner))

    @staticmethod
    def _bound_to(scope: dict, last_parts: frozenset) -> frozenset:
        return frozenset(name for name, qualname in scope.items()
                         if qualname and qualname.rpartition(".")[2] in last_parts)

    def is_imported(self, module: str) -> bool:
        return any(v == module or (v and v.startswith(module + ".")) for v in self._scopes[0].values())


_REFERENCE_WORDS = frozenset({"ref", "reference"})

# Code where a rule may declare itself quiet (`Rule.quiet_in`), and how its docs say so.
TESTS = "tests"
REFERENCE = "reference"
QUIET_SCOPES = {
    TESTS: "Tests (`test_*.py`, `*_test.py`, `conftest.py`, files under `tests/`, `test/` or "
           "`testing/`, module-level `test_*` functions, pytest fixtures, `Test*` classes and "
           "`unittest.TestCase`s). A function named just `test`, or a `test*` method of any other "
           "class (`Solver.test_multi`), is a training script's evaluation loop, which no test "
           "runner collects: it is checked",
    REFERENCE: "Reference implementations (a function or class named with the word `ref` or "
               "`reference`: `attention_ref`, `_ReferenceAdam`), which spell each step out on "
               "purpose to check a fused path against",
}


def _quiet_spans(ctx) -> dict:
    """{TESTS: rows, REFERENCE: rows}: the (first, last) rows of the functions and classes that
    are tests or reference implementations; TESTS is True for a whole test file. Read once per
    file."""
    found = ctx.shared.get("quiet_spans")
    if found is not None:
        return found
    path = ctx.filename.replace("\\", "/")
    base = path.rsplit("/", 1)[-1]
    test_file = (base.startswith("test_") or base.endswith("_test.py") or base == "conftest.py"
                 or any(folder in "/" + path for folder in ("/tests/", "/test/", "/testing/")))
    tests, reference = [], []

    def visit(body, top_level: bool) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                span = (first, node.end_lineno)
                if isinstance(node, ast.ClassDef):
                    is_test = node.name.startswith("Test") or any(ast.unparse(b).endswith("TestCase") for b in node.bases)
                else:
                    is_test = any("fixture" in ast.unparse(d) for d in node.decorator_list) or (
                        top_level and node.name.startswith("test_"))
                if is_test:
                    tests.append(span)
                if not _REFERENCE_WORDS.isdisjoint(name_tokens(node.name)):
                    reference.append(span)
                visit(node.body, False)
            else:
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    inner = getattr(node, field, None)
                    if isinstance(inner, list):
                        visit(inner, top_level)

    visit(ctx.tree.body, True)
    found = ctx.shared["quiet_spans"] = {TESTS: True if test_file else tuple(tests), REFERENCE: tuple(reference)}
    return found


def quiet_at(ctx, kinds, row: int) -> bool:
    """Row `row` of the file is in code of one of `kinds` (TESTS, REFERENCE)."""
    spans = _quiet_spans(ctx)
    for kind in kinds:
        rows = spans[kind]
        if rows is True or any(first <= row <= last for first, last in rows):
            return True
    return False


def in_test_code(ctx) -> bool:
    """The engine is inside a test (`QUIET_SCOPES[TESTS]`)."""
    scopes = [s for s in (*ctx.functions, *ctx.classes) if not isinstance(s, ast.Lambda)]
    row = max((s.lineno for s in scopes), default=0)
    return quiet_at(ctx, (TESTS,), row)



def spelling(ctx, qualname: str) -> Optional[str]:
    """The shortest way this file can write `qualname` with the module names it imports
    (`F` for torch.nn.functional after `import torch.nn.functional as F`), or None."""
    heads = []
    for stmt in ctx.tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            heads.extend(alias.asname or alias.name.split(".")[0] for alias in stmt.names)
    found = []
    for head in heads:
        base = ctx.qualname(ast.Name(head, ast.Load()))
        if base and (qualname == base or qualname.startswith(base + ".")):
            found.append(head + qualname[len(base):])
    return min(found, key=len) if found else None


def mentions(ctx, node: ast.AST, pattern) -> bool:
    """Whether a name, attribute, decorator or string constant inside `node` matches the
    compiled regex `pattern` as a whole identifier or a run of its parts (`flash` in
    `use_flash_attn` and `FlashAttention`, not in `nonflash`; `kernel` in `kernel_size` too, so
    patterns name the identifiers they mean). Docstrings and other bare string statements are
    prose, not code: "TODO: use flash attention" switches to nothing."""
    key = ("mentions", id(node), pattern.pattern)
    found = ctx.shared.get(key)
    if found is None:
        found = ctx.shared[key] = any(_matches_parts(pattern, text) for text in _mention_texts(ctx, node))
    return found


def _matches_parts(pattern, text: str) -> bool:
    match = pattern.search(text)
    while match is not None:
        start, end = match.span()
        if _part_boundary(text, start) and _part_boundary(text, end):
            return True
        match = pattern.search(text, start + 1)
    return False


def _part_boundary(text: str, at: int) -> bool:
    """Whether offset `at` separates two parts of an identifier (or of words in a string): an end,
    a character that is no letter or digit on either side (`_`, `.`, a space), a lower-case
    letter before an upper-case one (`FlashAttention`), or a letter next to a digit."""
    if at == 0 or at == len(text):
        return True
    before, after = text[at - 1], text[at]
    if not (before.isalnum() and after.isalnum()):
        return True
    return (before.islower() and after.isupper()) or before.isdigit() != after.isdigit()


def _mention_texts(ctx, node: ast.AST) -> set:
    """The distinct names, attributes and string constants inside `node`, less docstrings and other
    bare string statements, collected in one walk for every pattern asked about it (a class is
    asked about by several rules, and the same names recur hundreds of times in it)."""
    key = ("mention_texts", id(node))
    texts = ctx.shared.get(key)
    if texts is None:
        texts = ctx.shared[key] = set()
        prose = set()
        for sub in walk(node):  # breadth first: a statement comes before its string
            cls = sub.__class__
            if cls is ast.Name:
                texts.add(sub.id)
            elif cls is ast.Attribute:
                texts.add(sub.attr)
            elif cls is ast.Constant:
                if isinstance(sub.value, str) and sub.value and id(sub) not in prose:
                    texts.add(sub.value)
            elif cls is ast.Expr and sub.value.__class__ is ast.Constant:
                prose.add(id(sub.value))
    return texts


def outermost_scope(ctx):
    """The outermost class (else function, else the module) around the current node: where a
    fused path that the code switches to, or a decorator that replaces it, would be written."""
    return ctx.classes[0] if ctx.classes else (ctx.functions[0] if ctx.functions else ctx.tree)


def subclasses(ctx, cls, qualname: str) -> bool:
    """Whether class `cls` lists `qualname` among its bases."""
    return cls is not None and any(ctx.qualname(base) == qualname for base in cls.bases)
