"""The project's own modules that a file imports, read (parsed, never run) to see what the
functions it calls from them do: `from utils import accuracy` in train.py, accuracy's body in
utils.py next to it. A module is the project's when its file lies beside the importing file or in
a folder above it (up to `_LEVELS_UP`), as a script's sibling modules do.

What a file's findings depend on is the set of these files: the cache keys a file's findings by
their contents too (`imported_paths`).
"""
from __future__ import annotations

import ast
import os
import re
from typing import Optional

_LEVELS_UP = 2  # `src/train.py` importing `utils` from `src/`, `src/..` or `src/../..`
_IMPORT_LINE = re.compile(r"^[ \t]*(?:from[ \t]+(\.*)([\w.]*)[ \t]+import\b|import[ \t]+([\w., \t]+))", re.M)
_PARSED: dict = {}  # path -> (size, mtime_ns, tree or None)


def resolve(filename: str, module: str, level: int) -> Optional[str]:
    """The project file `module` names from `filename` (`level`: the leading dots of a relative
    import), or None (an installed package, the standard library, not found)."""
    if not filename or not os.path.isfile(filename):
        return None
    here = os.path.dirname(os.path.abspath(filename))
    parts = [p for p in module.split(".") if p]
    if level:
        bases = [here]
        for _ in range(level - 1):
            bases = [os.path.dirname(bases[0])]
    else:
        bases = [here]
        for _ in range(_LEVELS_UP):
            bases.append(os.path.dirname(bases[-1]))
    for base in bases:
        stem = os.path.join(base, *parts) if parts else base
        for candidate in (stem + ".py", os.path.join(stem, "__init__.py")):
            if os.path.isfile(candidate) and os.path.abspath(candidate) != os.path.abspath(filename):
                return candidate
    return None


def imported_paths(source: str, filename: str) -> list:
    """The project files `source` imports, from its import lines (no parse: the cache asks before
    linting). Sorted, each once."""
    found = set()
    for match in _IMPORT_LINE.finditer(source):
        dots, module, plain = match.groups()
        names = [(module, len(dots))] if plain is None else [(m.strip().split(" ")[0], 0) for m in plain.split(",")]
        for name, level in names:
            if name or level:
                path = resolve(filename, name, level)
                if path is not None:
                    found.add(path)
    return sorted(found)


def parsed(path: str) -> Optional[ast.Module]:
    """The module at `path`, parsed once per process while its file is unchanged."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    cached = _PARSED.get(path)
    if cached is not None and cached[:2] == (st.st_size, st.st_mtime_ns):
        return cached[2]
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        tree = None
    _PARSED[path] = (st.st_size, st.st_mtime_ns, tree)
    return tree


def imported_function(ctx, func: ast.AST) -> Optional[tuple]:
    """(the function definition, its file) that `func` names through an import of a project
    module at the file's top level (`accuracy` after `from utils import accuracy`, `utils.accuracy`
    after `import utils`), else None."""
    return imported_definition(ctx, func, (ast.FunctionDef, ast.AsyncFunctionDef))


def imported_class(ctx, func: ast.AST) -> Optional[tuple]:
    """(the class definition, the NameResolver of its module) that `func` names through an import
    of a project module (`Head` after `from .head import Head`), else None."""
    found = imported_definition(ctx, func, (ast.ClassDef,))
    if found is None:
        return None
    definition, path = found
    resolver = _RESOLVERS.get(path)
    if resolver is None or resolver[0] is not parsed(path):
        from .names import NameResolver

        resolver = _RESOLVERS[path] = (parsed(path), NameResolver(parsed(path)))
    return definition, resolver[1]


_RESOLVERS: dict = {}  # path -> (its parsed tree, a NameResolver of it)


def imported_definition(ctx, func: ast.AST, kinds: tuple) -> Optional[tuple]:
    """(the top-level definition of one of `kinds`, its file) that `func` names through an import
    of a project module, else None."""
    table = ctx.shared.get("project_imports")
    if table is None:
        table = ctx.shared["project_imports"] = _import_table(ctx.tree)
    if isinstance(func, ast.Name) and func.id in table:
        module, level, attr = table[func.id]
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in table:
        module, level, attr = table[func.value.id]
        if attr is not None:
            return None  # `from pkg import utils; utils.f(...)`: a module of a package, not followed
        attr = func.attr
    else:
        return None
    path = resolve(ctx.filename, module, level)
    tree = parsed(path) if path is not None else None
    if tree is None:
        return None
    definition = next((s for s in tree.body if isinstance(s, kinds) and s.name == attr), None)
    return (definition, path) if definition is not None else None


def _import_table(tree: ast.Module) -> dict:
    """local name -> (module, level, imported attribute or None for a whole module)."""
    table = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if alias.name != "*":
                    table[alias.asname or alias.name] = (stmt.module or "", stmt.level, alias.name)
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname or "." not in alias.name:
                    table[alias.asname or alias.name] = (alias.name, 0, None)
    return table


def module_class_of(ctx, func: ast.AST) -> Optional[tuple]:
    """(class, qualname of its module, where it is) for `self.<attr>`, read in a method of the
    class being walked, when every value the class stores in that attribute is a call of one
    class of this file or of a project module it imports (`self.attention = Attention(d)`, `from
    attention import Attention`); `where` is None for this file, else that file's name."""
    from .kinds import class_attribute_values

    cls = ctx.class_
    if (cls is None or not isinstance(func, ast.Attribute) or not isinstance(func.value, ast.Name)
            or not ctx.functions or not ctx.functions[0].args.args
            or func.value.id != ctx.functions[0].args.args[0].arg):
        return None
    values = [value for _, value in class_attribute_values(ctx, cls, func.attr)]
    if not values or not all(isinstance(v, ast.Call) and isinstance(v.func, ast.Name) for v in values):
        return None
    if len({v.func.id for v in values}) != 1:
        return None
    name = values[0].func.id
    if ctx.qualname(values[0].func) is None:
        local = [s for s in ctx.tree.body if isinstance(s, ast.ClassDef) and s.name == name]
        if len(local) == 1:
            return local[0], ctx.qualname, None
    found = imported_class(ctx, values[0].func)
    if found is None:
        return None
    path = imported_definition(ctx, values[0].func, (ast.ClassDef,))[1]
    return found[0], found[1].qualname, os.path.basename(path)
