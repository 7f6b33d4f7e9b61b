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


_RE_EXPORT_HOPS = 2  # how many package `__init__.py` re-exports a definition is followed through


def imported_paths(source: str, filename: str, hops: int = _RE_EXPORT_HOPS) -> list:
    """The project files `source` imports, from its import lines (no parse: the cache asks before
    linting), and those that an imported package's `__init__.py` imports in turn (the modules
    its re-exports come from, as `imported_definition` follows them). Sorted, each once."""
    found = set()
    for match in _IMPORT_LINE.finditer(source):
        dots, module, plain = match.groups()
        names = [(module, len(dots))] if plain is None else [(m.strip().split(" ")[0], 0) for m in plain.split(",")]
        for name, level in names:
            if name or level:
                path = resolve(filename, name, level)
                if path is not None:
                    found.add(path)
    if hops > 0:
        for path in [p for p in found if os.path.basename(p) == "__init__.py"]:
            try:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    found.update(imported_paths(handle.read(), path, hops - 1))
            except OSError:
                pass
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
    return _definition_in(resolve(ctx.filename, module, level), attr, kinds, _RE_EXPORT_HOPS)


def _definition_in(path: Optional[str], name: str, kinds: tuple, hops: int) -> Optional[tuple]:
    """(the top-level definition of `name` in the module at `path`, its file), following a
    re-export (`from .util import mask_` in a package's `__init__.py`) up to `hops` times."""
    tree = parsed(path) if path is not None else None
    if tree is None:
        return None
    definition = next((s for s in tree.body if isinstance(s, kinds) and s.name == name), None)
    if definition is not None:
        return definition, path
    if hops > 0 and os.path.basename(path) == "__init__.py":
        imported = _import_table(tree).get(name)
        if imported is not None and imported[2] is not None:
            module, level, attr = imported
            return _definition_in(resolve(path, module, level), attr, kinds, hops - 1)
    return None


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
